"""The harness with the real SmolLM2 behind it (HF and vLLM, on CPU): the ids recorded per rollout are the model's own,
with no re-tokenization, for a plain ``openai`` agent and for an OpenAI Agents SDK agent on an AgentGym env.

The policy is wrapped to log every prompt it received and every generation it returned; each recorded
segment must be one of those prompts followed by the ids generated for it, and each turn's ids and
logprobs must be a generation's, verbatim. SmolLM2's template renders a re-sent tool call differently
from what the model generated (``rerender_drift`` counts it); the endpoint keeps the generated ids.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import harness_agents
import pytest

from agentgym.harness.agents import CallableAgent
from agentgym.harness.workflow import HarnessWorkflow
from agentgym.policy import Generation, GenRequest, SamplingParams
from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime

pytestmark = pytest.mark.slow
ENV = "agentgym/Demo-v0"


class Recording:
    """Delegates to a policy and logs (prompt ids, generation) of every call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.log: list[tuple[list[int], Generation]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def capabilities(self) -> Any:
        return self.inner.capabilities

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        gens = await self.inner.generate(requests)
        for r, g in zip(requests, gens, strict=True):
            assert r.prompt_token_ids is not None  # token-in: the endpoint never sends messages
            self.log.append((list(r.prompt_token_ids), g))
        return gens


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Recording]:
    import asyncio

    from agentgym.policies.hf import HFPolicy

    policy = HFPolicy("smollm2-135m-instruct", policy_id="smollm2", max_batch_size=8)
    yield Recording(policy)
    asyncio.run(policy.aclose())


@pytest.fixture(scope="module")
def smollm2_vllm() -> Iterator[Recording]:
    pytest.importorskip("vllm")
    from agentgym.policies.vllm import VLLMPolicy

    policy = VLLMPolicy("smollm2-135m-instruct", policy_id="smollm2-vllm", kv_cache_gib=1, max_model_len=2048,
                        max_num_seqs=8, startup_timeout_s=600)
    try:
        yield Recording(policy)
    finally:
        policy.shutdown()


async def run(policy: Any, agent: Any, tasks: list[str], g: int = 2) -> list[Any]:
    wf = HarnessWorkflow(policy, CallableAgent(agent), g, sampling=SamplingParams(temperature=1.0, max_tokens=48),
                         limits=RolloutLimits(max_turns=3), timeout_s=900)
    rt = RolloutRuntime(8)
    try:
        groups = await RolloutEngine(rt).run(wf, [GroupRequest(ENV, t, seed=0, sampling_seed=1) for t in tasks])
    finally:
        rt.close()
    return [t for grp in groups for t in grp]


def check_model_ids(trajs: list[Any], rec: Recording) -> dict[str, int]:
    contexts = [p + list(gen.token_ids) for p, gen in rec.log]
    by_ids: dict[tuple[int, ...], list[list[float]]] = {}  # two generations may share ids (not logprobs)
    for _, gen in rec.log:
        by_ids.setdefault(tuple(gen.token_ids), []).append(list(gen.logprobs))
    totals = {"requests": 0, "segments": 0, "rerender_drift": 0, "reused_completions": 0, "prompt_mismatches": 0}
    for t in trajs:
        assert t.error is None, t.error
        assert t.metrics["requests"] >= 1
        for turn in t.turns:
            # a generation of the model, verbatim: its ids and its logprobs
            assert turn.completion_logprobs in by_ids[tuple(turn.completion_token_ids)]
        for seg in t.segments():
            assert seg.token_ids in contexts  # the last prompt of the chain + what the model generated
            assert seg.logprobs is not None
        for k in totals:
            totals[k] += t.metrics[k]
    return totals


async def test_an_openai_agent_records_the_models_own_ids(smollm2: Recording) -> None:
    smollm2.log.clear()
    trajs = await run(smollm2, harness_agents.tool_agent, ["guess-1", "guess-3"])
    totals = check_model_ids(trajs, smollm2)
    print("openai agent over SmolLM2:", totals)
    assert totals["requests"] == len(smollm2.log)


async def test_an_agents_sdk_agent_runs_an_env_episode(smollm2: Recording) -> None:
    smollm2.log.clear()
    trajs = await run(smollm2, harness_agents.agents_sdk_agent, ["guess-5"], g=2)
    totals = check_model_ids(trajs, smollm2)
    print("Agents SDK over SmolLM2:", totals)
    assert totals["requests"] == len(smollm2.log)
    assert all(t.messages[0]["role"] in ("system", "user") for t in trajs)


async def test_the_endpoint_serves_a_vllm_policy_with_the_models_own_ids(smollm2_vllm: Recording) -> None:
    """The same agent and checks over vLLM: the endpoint is the same for every rollout policy."""
    smollm2_vllm.log.clear()
    trajs = await run(smollm2_vllm, harness_agents.tool_agent, ["guess-1", "guess-3"])
    totals = check_model_ids(trajs, smollm2_vllm)
    print("openai agent over SmolLM2 through vLLM:", totals)
    assert totals["requests"] == len(smollm2_vllm.log) > 0
