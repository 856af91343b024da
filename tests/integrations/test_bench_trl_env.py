"""``benchmarks/bench_trl_env.py``: both arms' configs come from one settings dict, and the summary's arithmetic.

The benchmark itself (minutes) is not run here; ``python benchmarks/bench_trl_env.py --quick`` smoke-runs it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_trl_env", ROOT / "benchmarks" / "bench_trl_env.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_two_configs_say_the_same(bench: Any, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from agentgym.trainers.config import validate_config
    from trl import GRPOConfig

    s = bench.SETTINGS
    trl = GRPOConfig(**bench.trl_args(s, str(tmp_path / "trl"), 5, 3))
    ag = validate_config(bench.agentgym_config(s, "MODEL", str(tmp_path / "ag"), 5, 3))
    assert trl.num_generations == ag.rollout.group_size
    assert trl.per_device_train_batch_size == ag.rollout.group_size * ag.rollout.groups_per_step
    assert trl.generation_batch_size == trl.per_device_train_batch_size  # one generation batch per step
    assert trl.max_completion_length == ag.rollout.max_tokens
    assert trl.max_tool_calling_iterations + 1 == ag.rollout.max_turns
    assert trl.learning_rate == ag.optim.lr and trl.lr_scheduler_type == "constant" and ag.optim.schedule == "constant"
    assert trl.warmup_steps == ag.optim.warmup_steps == 0
    assert (trl.adam_beta1, trl.adam_beta2) == tuple(ag.optim.betas) and trl.adam_epsilon == ag.optim.eps
    assert trl.weight_decay == ag.optim.weight_decay and trl.max_grad_norm == ag.optim.grad_clip
    assert (trl.epsilon, trl.epsilon_high) == (ag.loss.clip_low, ag.loss.clip_high)
    assert trl.beta == ag.loss.kl_coef == 0.0
    assert trl.loss_type == "dapo" and ag.loss.aggregation == "token-mean"
    assert trl.temperature == ag.rollout.temperature and trl.top_p == ag.rollout.top_p
    assert trl.seed == ag.run.seed == 3 and trl.max_steps == ag.run.steps == 5
    assert not trl.bf16 and not trl.gradient_checkpointing
    assert ag.model.dtype == "float32" and ag.model.finetune == "full" and not ag.model.gradient_checkpointing
    assert not ag.filter.dynamic_sampling and ag.run.threads == 1


def test_summary(bench: Any) -> None:
    def arm(step: float, tokens: int, success: float) -> dict[str, Any]:
        return {"step_s": [5.0] + [step] * 3, "trained_tokens": [tokens] * 4, "reward": [0.5] * 4, "setup_s": 1.0,
                "peak_rss_gb": 1.0, "subprocess_wall_s": 30.0,
                "heldout_after": {"success": success, "samples": 2}}

    rounds = [{"trl": arm(4.0, 100, 0.5), "agentgym": arm(1.0, 100, 0.25)},
              {"trl": arm(6.0, 100, 0.5), "agentgym": arm(2.0, 200, 0.25)}]
    out = bench.summarize(rounds, {"heldout": {"success": 0.25, "samples": 2}})
    r = out["ratios"]["steady_step_time_trl_over_agentgym"]
    assert r["per_round"] == [4.0, 3.0] and r["mean"] == pytest.approx(12 ** 0.5)
    assert r["ci95"][0] < r["mean"] < r["ci95"][1]
    assert out["ratios"]["time_per_trained_token_trl_over_agentgym"]["per_round"] == pytest.approx([4.0, 6.0])
    assert out["arms"]["agentgym"]["steady_step_s"]["mean"] == pytest.approx(1.5)
    assert out["arms"]["trl"]["heldout_after"]["success"] == 0.5 and out["arms"]["trl"]["heldout_after"]["episodes"] == 32
    assert out["heldout_before"]["episodes"] == 16
