"""Policy spec strings and PolicyMap routing (fast: scripted policies only)."""

from __future__ import annotations

from typing import Any

import pytest
from agentgym.policies import PolicyMap, from_spec, parse_spec
from agentgym.policies.openai import OpenAIPolicy
from agentgym.policies.scripted import ExpertPolicy, ScriptedPolicy

from agentgym.errors import ConfigurationError
from agentgym.policy import GenRequest, Policy, SamplingParams
from agentgym.types import Message


def shout(messages: list[Message]) -> str:
    return messages[-1]["content"].upper()


def whisper(messages: list[Message]) -> str:
    return messages[-1]["content"].lower()


@pytest.mark.parametrize(
    ("spec", "kind", "target", "model", "options"),
    [
        ("hf:smollm2-135m-instruct", "hf", "smollm2-135m-instruct", None, {}),
        ("hf:/models/x?dtype=bfloat16&max_batch_size=8", "hf", "/models/x", None, {"dtype": "bfloat16", "max_batch_size": 8}),
        ("vllm:/path/to/model?kv_cache_gib=1", "vllm", "/path/to/model", None, {"kv_cache_gib": 1}),
        ("openai:http://127.0.0.1:8000/v1#model-name", "openai", "http://127.0.0.1:8000/v1", "model-name", {}),
        ("openai:https://api.example.com/v1", "openai", "https://api.example.com/v1", None, {}),
        ("expert", "expert", "", None, {}),
        ("scripted:pkg.mod:fn", "scripted", "pkg.mod:fn", None, {}),
        ("scripted:pkg.mod.fn", "scripted", "pkg.mod:fn", None, {}),
        ("smollm2-135m-instruct", "hf", "smollm2-135m-instruct", None, {}),
    ],
)
def test_parse_spec(spec: str, kind: str, target: str, model: str | None, options: dict[str, Any]) -> None:
    ps = parse_spec(spec)
    assert (ps.kind, ps.target, ps.model, ps.options) == (kind, target, model, options)


@pytest.mark.parametrize("bad", ["", "openai:127.0.0.1:8000", "scripted:nofn", "http://x/v1", "expert:x", "hf:"])
def test_bad_specs_say_what_to_do(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_spec(bad)


def test_from_spec_builds_light_policies() -> None:
    assert isinstance(from_spec("expert"), ExpertPolicy)
    p = from_spec(f"scripted:{__name__}:shout", policy_id="loud")
    assert isinstance(p, ScriptedPolicy) and p.policy_id == "loud"
    o = from_spec("openai:http://127.0.0.1:9/v1#m?x", max_retries=0)
    assert isinstance(o, OpenAIPolicy) and o.model == "m?x" and o.max_retries == 0
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        from_spec("scripted:no_such_module_xyz:fn")


def test_hf_spec_with_a_missing_folder_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        from_spec("hf:/no/such/model/folder")


async def test_policy_map_routes_by_role_and_keeps_order() -> None:
    pm = PolicyMap({"solver": ScriptedPolicy(shout, policy_id="s"), "critic": ScriptedPolicy(whisper, policy_id="c")}, default="solver")
    assert isinstance(pm, Policy) and pm.roles == ["solver", "critic"] and "critic" in pm
    reqs = [
        GenRequest(messages=[{"role": "user", "content": "Ab"}], metadata={"role": "critic"}, n=2),
        GenRequest(messages=[{"role": "user", "content": "Cd"}]),
        GenRequest(messages=[{"role": "user", "content": "Ef"}], metadata={"role": "critic"}),
    ]
    gens = await pm.generate(reqs)
    assert [g.text for g in gens] == ["ab", "ab", "CD", "ef"]
    assert pm["critic"].policy_id == "c"
    with pytest.raises(ConfigurationError, match="roles: solver, critic"):
        pm["judge"]


def test_policy_map_from_specs_shares_equal_specs() -> None:
    pm = PolicyMap.from_specs({"a": "expert", "b": "expert", "c": f"scripted:{__name__}:shout"})
    assert pm["a"] is pm["b"] and pm["a"] is not pm["c"]


def test_policy_map_validation() -> None:
    with pytest.raises(ConfigurationError):
        PolicyMap({})
    with pytest.raises(ConfigurationError):
        PolicyMap({"a": object()})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError):
        PolicyMap({"a": ExpertPolicy(), "b": ExpertPolicy()}, default="z")


async def test_request_without_role_and_no_default() -> None:
    pm = PolicyMap({"a": ScriptedPolicy(shout), "b": ScriptedPolicy(whisper)})
    with pytest.raises(ConfigurationError, match="no default"):
        await pm.generate([GenRequest(messages=[{"role": "user", "content": "x"}], sampling=SamplingParams())])
