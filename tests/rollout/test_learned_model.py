"""A model that has learned a multi-turn task keeps solving it through the rollout engine.

The tiny model is trained (SFT, seconds) on expert transcripts of ``agentgym/TinyRecall-v0``, a task
that can only be solved with the whole conversation in view. It must then solve it through the
engine with HFPolicy and VLLMPolicy in token mode; and it must fail when the engine sends only the
newest observation (the old defect, re-created here by patching the conversation), so this test
can fail.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent / "trainers"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recall_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama (head_dim 64, which vLLM's CPU kernels support) trained by SFT on expert transcripts."""
    import tiny_lookup
    import tiny_recall
    from agentgym.policies.scripted import ExpertPolicy
    from agentgym.recipes import run_training
    from agentgym.trainers.config import validate_config

    from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime
    from agentgym.rollout.collect import CollectWorkflow
    from agentgym.rollout.jsonl import write_jsonl

    root = tmp_path_factory.mktemp("recall")
    base = tiny_lookup.build_tiny_model(root / "base", hidden=128, layers=2, heads=2, init=0.05)

    async def collect() -> list[Any]:
        with RolloutRuntime(8) as rt:
            wf = CollectWorkflow(ExpertPolicy(), 4, limits=RolloutLimits(max_turns=3))
            reqs = [GroupRequest(tiny_recall.ENV_ID, t.task_id) for t in tiny_recall.TinyRecallEnv().tasks("train")]
            return await RolloutEngine(rt).run(wf, reqs)

    demos = root / "demos.jsonl"
    write_jsonl(demos, [t for g in asyncio.run(collect()) for t in g])
    cfg = validate_config({
        "run": {"algorithm": "sft", "out_dir": str(root / "run"), "steps": 300, "seed": 0, "threads": 2},
        "model": {"path": str(base)},
        "data": {"paths": [str(demos)], "batch_size": 16},
        "optim": {"lr": 3e-3},
        "rollout": {"env": tiny_recall.ENV_ID},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    })
    run_training(cfg)
    return str(root / "run" / "final")


async def _success(policy: Any) -> tuple[float, list[list[int]]]:
    import tiny_recall

    from agentgym.policy import SamplingParams
    from agentgym.rollout import GroupRequest, MultiTurnWorkflow, RolloutEngine, RolloutLimits, RolloutRuntime

    wf = MultiTurnWorkflow(policy, 2, sampling=SamplingParams(temperature=0.0, max_tokens=8),
                           limits=RolloutLimits(max_turns=3))
    reqs = [GroupRequest(tiny_recall.ENV_ID, t.task_id) for t in tiny_recall.TinyRecallEnv().tasks("test")]
    with RolloutRuntime(8) as rt:
        groups = await RolloutEngine(rt).run(wf, reqs)
    trajs = [t for g in groups for t in g]
    assert all(t.error is None for t in trajs), [t.error for t in trajs if t.error]
    # the context each answering turn was generated from: every token of the conversation before it
    contexts = []
    for t in trajs:
        ctx: list[int] = []
        for turn in t.turns:
            ctx += turn.prompt_token_ids
            contexts.append(list(ctx))
            ctx += turn.completion_token_ids
    return sum(t.success for t in trajs) / len(trajs), contexts


async def test_hf_policy_solves_what_the_model_learned(recall_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym.policies.hf import HFPolicy

    from agentgym.rollout.episode import Conversation

    async with HFPolicy(recall_model, dtype="float32", policy_id="hf") as pol:
        seen: list[list[int]] = []
        inner = pol.generate

        async def spy(reqs: Any) -> Any:
            seen.extend(list(r.prompt_token_ids) for r in reqs)
            return await inner(reqs)

        monkeypatch.setattr(pol, "generate", spy)
        ok, contexts = await _success(pol)
        assert ok >= 0.9, ok
        # what the model received on turn k is the whole conversation up to turn k
        assert sorted(map(tuple, seen)) == sorted(map(tuple, contexts))

        # the old defect: the request carries only the newest observation's ids
        real_prepare = Conversation.prepare

        def delta_only(self: Conversation, *a: Any, **kw: Any) -> Any:
            req = real_prepare(self, *a, **kw)
            if self.token_mode and self._prepared is not None and not self._prepared[1]:
                req.prompt_token_ids = list(self._prepared[0])
            return req

        monkeypatch.setattr(Conversation, "prepare", delta_only)
        broken, _ = await _success(pol)
        assert broken <= 0.5, broken  # the answer turn no longer sees the key


@pytest.mark.vllm
async def test_vllm_policy_solves_what_the_model_learned(recall_model: str) -> None:
    pytest.importorskip("vllm")
    from agentgym.policies.vllm import VLLMPolicy

    pol = VLLMPolicy(recall_model, dtype="float32", max_model_len=512, max_num_seqs=8, kv_cache_gib=1,
                     policy_id="vllm")
    try:
        ok, _ = await _success(pol)
    finally:
        await pol.aclose()
    assert ok >= 0.9, ok
