"""Agent Lightning 1.0.2 compatibility, against the real package (it needs Python >= 3.12, so it lives in a
side venv: ``make agl-venv`` builds ``.venv-agl`` from PyPI; ``AGENTGYM_AGL_PYTHON`` names another).

* An agent class written for Agent Lightning (``agl_agent.LookupAgent``: ``AGL_OPENAI_BASE_URL``,
  ``AGL_EVENT_URL``, ``AGL_KEY``, ``env_map`` variables, its reward posted with Agent Lightning's own
  client and schemas) runs unchanged under the harness workflow and trains on AgentGym.
* The responses the endpoint sends through Agent Lightning's proxy URL are parsed by Agent
  Lightning's own trainer-side code (``_trim_model_request``, what its ``format=triplet`` query
  feeds verl) into exactly the prompt ids, response ids and logprobs the endpoint recorded.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import tiny_lookup
from harness_fakes import ScriptedTokenPolicy
from side_venvs import side_python

from agentgym.harness.agents import AgentLightningAgent
from agentgym.harness.endpoint import PolicyEndpoint
from agentgym.harness.server import EndpointServer
from agentgym.harness.workflow import HarnessWorkflow
from agentgym.policy import SamplingParams
from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def agl_python() -> str:
    return side_python("AGENTGYM_AGL_PYTHON", ".venv-agl", "agentlightning, openai", "agentlightning", "1.0.2",
                       "Agent Lightning needs Python >= 3.12 in a side venv (`make agl-venv` builds it where a "
                       "Python 3.12 is installed)", timeout_s=120)


@pytest.mark.slow
async def test_an_agent_lightning_agent_trains_on_agentgym_unchanged(tiny_tokenizer: Any, agl_python: str) -> None:
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    agent = AgentLightningAgent("agl_agent:LookupAgent", python=agl_python, cwd=str(HERE), inherit_env=False,
                                env_map={"MESSAGES": "input.messages", "TOOLS": "input.tools", "ENV_URL": "input.env_url"})
    wf = HarnessWorkflow(policy, agent, 2, sampling=SamplingParams(max_tokens=16), limits=RolloutLimits(max_turns=3),
                         reward="call", timeout_s=600)
    rt = RolloutRuntime(8)
    try:
        groups = await RolloutEngine(rt).run(wf, [GroupRequest(tiny_lookup.ENV_ID, t, seed=0) for t in ("owl-red", "elk-tan")])
    finally:
        rt.close()
    for t in (t for g in groups for t in g):
        assert t.error is None, t.error
        assert (t.reward, t.success) == (1.0, True)
        assert t.info["rewards"] == [{"value": 1.0, "success": None, "source": "agent"}]
        assert t.info["mode"] == "train" and t.metrics["segments"] == 1 and t.metrics["env_steps"] == 2
        contexts = [p + g for p, g in policy.calls]
        assert all(seg.token_ids in contexts for seg in t.segments())


@pytest.mark.slow
async def test_agent_lightning_reads_the_ids_and_logprobs_the_endpoint_recorded(tiny_tokenizer: Any,
                                                                                 agl_python: str,
                                                                                 tmp_path: Path) -> None:
    policy = ScriptedTokenPolicy(tiny_tokenizer)
    ep = PolicyEndpoint(policy, parser="react", auto_rollouts=True)
    async with EndpointServer(ep, token="k") as srv, httpx.AsyncClient(headers={"Authorization": "Bearer k"},
                                                                       timeout=60) as c:
        base = f"{srv.url}/proxy/rollout/ro/attempt/0/mode/train/openai/v1"
        body = {"model": "m", "messages": [{"role": "user", "content": "key[owl]"}], "logprobs": True,
                "return_token_ids": True}
        chat = (await c.post(base + "/chat/completions", json=body)).json()
        comp = (await c.post(base + "/completions", json={"model": "m", "prompt": "key[elk]", "logprobs": 1})).json()
    (tmp_path / "responses.json").write_text(json.dumps([chat, comp]))
    script = ("import json, sys\n"
              "from agentlightning.server.routes.events import _trim_model_request\n"
              "rs = json.load(open(sys.argv[1]))\n"
              "print(json.dumps([_trim_model_request({'response': r}) for r in rs]))\n")
    r = subprocess.run([agl_python, "-c", script, str(tmp_path / "responses.json")], capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    trimmed = json.loads(r.stdout)
    turns = ep.rollouts["ro"].trace.turns()
    for got, (prompt, gen), turn in zip(trimmed, policy.calls, turns, strict=True):
        assert got["prompt_token_ids"] == prompt
        assert got["response_token_ids"] == gen == turn.completion_token_ids
        assert got["response_log_probs"] == turn.completion_logprobs == [-0.25] * len(gen)
