"""A verifiers 0.4 environment brought by its user trains through AgentGym's policy endpoint.

``vf_lookup`` is a verifiers environment written the verifiers way (a ``Taskset``, typed tasks, a
``@vf.reward``, a ``Harness`` running an ``openai`` tool loop; no AgentGym code). The harness workflow
runs it per task as a command agent in verifiers' own venv (``python -m agentgym_verifiers.episode
vf_lookup``): verifiers' model client points at the rollout's ``base_url``, so each call its harness
makes goes through verifiers' interception server to the endpoint, which records the policy's token
ids, logprobs and weight versions; the episode's verifiers reward comes back by the reward call.

verifiers pins ``mcp==2.0.0`` and ``openai<3``, so it lives in ``.venv-verifiers`` (``make
test-verifiers`` builds it; ``AGENTGYM_VF_PYTHON`` names another interpreter); without it this test skips.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tiny_lookup
from harness_fakes import ScriptedTokenPolicy, lookup_reply
from side_venvs import side_python

from agentgym.harness.agents import CommandAgent
from agentgym.harness.workflow import HarnessWorkflow
from agentgym.policy import SamplingParams
from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def vf_python() -> str:
    return side_python("AGENTGYM_VF_PYTHON", ".venv-verifiers", "verifiers, agentgym_verifiers.episode", "verifiers",
                       "0.4.0", "verifiers runs in its own venv (it pins mcp==2.0.0 and openai<3): `make "
                       "test-verifiers` builds .venv-verifiers")


class FirstAnswerWrong:
    """Plays the task from the context, but the first answer of the run is wrong (so one group's rewards differ)."""

    def __init__(self) -> None:
        self.answers = 0

    def __call__(self, prompt: str) -> str:
        reply = lookup_reply(prompt)
        if reply.startswith("answer["):
            self.answers += 1
            if self.answers == 1:
                return "answer[nope]"
        return reply


@pytest.mark.slow
async def test_a_verifiers_environment_trains_through_the_endpoint(vf_python: str, tiny_model: str,
                                                                    tiny_tokenizer: Any) -> None:
    from agentgym.trainers.batching import samples_from_groups
    from agentgym.trainers.config import OptimConfig
    from agentgym.trainers.model import load_causal_lm
    from agentgym.trainers.trainer import PolicyTrainer

    policy = ScriptedTokenPolicy(tiny_tokenizer, reply=FirstAnswerWrong())
    agent = CommandAgent([vf_python, "-m", "agentgym_verifiers.episode", "vf_lookup"], cwd=str(HERE),
                         env={"PYTHONPATH": str(HERE)})
    wf = HarnessWorkflow(policy, agent, 2, sampling=SamplingParams(temperature=1.0, max_tokens=16),
                         limits=RolloutLimits(max_turns=3), reward="call", env_access=False, timeout_s=600)
    rt = RolloutRuntime(4)
    try:  # the AgentGym env names the tasks; the verifiers taskset has tasks with the same ids
        groups = await RolloutEngine(rt).run(wf, [GroupRequest(tiny_lookup.ENV_ID, t, seed=0)
                                                  for t in ("owl-red", "elk-tan")])
    finally:
        rt.close()

    trajs = [t for g in groups for t in g]
    contexts = [p + g for p, g in policy.calls]
    assert len(trajs) == 4 and len(policy.calls) == 8  # two model calls per verifiers episode
    for t in trajs:
        assert t.error is None, t.error
        # verifiers' reward (its @vf.reward `correct`), posted by the reward call
        assert t.info["rewards"] == [{"value": t.reward, "success": None, "source": "call"}]
        assert t.metrics["requests"] == 2 and t.metrics["segments"] == 1 and t.metrics["prompt_mismatches"] == 0
        [seg] = t.segments()
        assert seg.token_ids in contexts  # the ids the policy saw and generated, not re-tokenized
        generated = [i for i, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m]
        assert generated == [i for turn in t.turns for i in turn.completion_token_ids]
        assert all(turn.completion_token_ids in [g for _, g in policy.calls] for turn in t.turns)
        assert {v for v, m in zip(seg.versions, seg.loss_mask, strict=True) if m} == {7}
        assert [lp for lp, m in zip(seg.logprobs, seg.loss_mask, strict=True) if m] == [-0.25] * sum(seg.loss_mask)
    assert sorted(t.reward for t in trajs) == [0.0, 1.0, 1.0, 1.0]

    samples, stats = samples_from_groups(groups, "policy")
    mixed = next(g for g in groups if {t.reward for t in g} == {0.0, 1.0})
    assert [s.group_id for s in samples] == [mixed.group_id] * 2 and stats.zero_variance_groups == 1
    assert sorted(s.advantage > 0 for s in samples) == [False, True]
    assert {tuple(s.token_ids) for s in samples} == {tuple(t.segments()[0].token_ids) for t in mixed}
    trainer = PolicyTrainer("policy", load_causal_lm(tiny_model), optim=OptimConfig(lr=1e-2))
    metrics = trainer.train_on(samples)  # one training step on the verifiers episodes
    assert (metrics["optimizer_steps"], metrics["sequences"]) == (1, 2)
    assert metrics["trained_tokens"] == sum(s.num_masked for s in samples)
