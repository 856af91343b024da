"""`agentgym eval` with each built-in env's expert reaches 100% (or the env's documented expert rate).

Envs that are registered but not implemented yet fail here, visibly, on purpose. Envs that need an
external dataset or package (``requires`` in the registry) are skipped with that reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agentgym.policies.scripted import ExpertPolicy

import agentgym
from agentgym.eval import EvalConfig, arun_eval

BUILTIN = [e for e in agentgym.list_envs() if not e.plugin and e.family != "test"]


async def check_expert(env_id: str, tmp_path: Path, tasks: int = 3) -> None:
    env = agentgym.make(env_id)
    inner = env.unwrapped
    split = "test" if "test" in inner.splits else inner.default_split  # type: ignore[attr-defined]
    rate = float(getattr(inner, "expert_success_rate", 1.0))
    env.close()
    s = await arun_eval(ExpertPolicy(), EvalConfig([env_id], split=split, tasks=tasks, samples=1, seeds=[0]), tmp_path)
    b = s["envs"][env_id]
    assert b["errors"] == 0, b["error_examples"]
    assert b["episodes"] >= 1 and b["success"]["mean"] >= rate, (b["success"], b["truncated_reasons"])


async def test_demo_expert_is_perfect(tmp_path: Path) -> None:
    await check_expert("agentgym/Demo-v0", tmp_path, tasks=5)


@pytest.mark.slow
@pytest.mark.parametrize("entry", BUILTIN, ids=[e.id for e in BUILTIN])
async def test_every_builtin_env_expert(entry: agentgym.registration.EnvEntry, tmp_path: Path) -> None:
    if entry.requires:
        pytest.skip(f"{entry.id} needs {entry.requires} (external data or package)")
    await check_expert(entry.id, tmp_path)
