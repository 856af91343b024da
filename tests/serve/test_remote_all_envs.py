"""The checker and an expert eval pass over HTTP for every built-in env (one ``agentgym serve``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gymnasium
import pytest
from agentgym.policies.scripted import ExpertPolicy

import agentgym
from agentgym.eval import EvalConfig, arun_eval
from agentgym.serve.server import EnvServer

pytestmark = pytest.mark.slow
BUILTIN = [e.id for e in agentgym.list_envs() if not e.plugin and e.family not in ("test", "remote") and not e.requires]


@pytest.fixture(scope="module")
def server() -> Iterator[EnvServer]:
    with EnvServer(BUILTIN) as srv:
        yield srv


def test_every_builtin_env_is_served() -> None:
    assert {"agentgym/Demo-v0", "agentgym/ALFWorld-v0", "agentgym/SQL-v0", "agentgym/Search-v0",
            "agentgym/Code-v0", "agentgym/Bash-v0"} <= set(BUILTIN)


@pytest.mark.parametrize("env_id", BUILTIN)
async def test_checker_and_expert_eval_over_http(server: EnvServer, env_id: str, tmp_path: Path) -> None:
    env = gymnasium.make("agentgym/Remote-v0", url=server.url, env_id=env_id)
    report = agentgym.check_env(env)
    assert not report.skipped and len(report.passed) == 6, report
    split = "test" if "test" in env.get_wrapper_attr("splits") else None
    env.close()
    local = agentgym.make(env_id)
    rate = float(getattr(local.unwrapped, "expert_success_rate", 1.0))
    local.close()
    kw = {"url": server.url, "env_id": env_id}
    cfg = EvalConfig(["agentgym/Remote-v0"], split=split or "test", tasks=3, seeds=[0], concurrency=3, env_kwargs=kw)
    s = await arun_eval(ExpertPolicy(), cfg, tmp_path)
    b = s["envs"]["agentgym/Remote-v0"]
    assert b["errors"] == 0, b["error_examples"]
    assert b["episodes"] == 3 and b["success"]["mean"] >= rate, (b["success"], b["truncated_reasons"])
    assert s["protocol"]["env_kwargs"] == kw  # the remote env is recorded in the protocol
    assert server.service.sessions == {}  # the eval closed every session it opened
