"""Policy spec strings, as used on the CLI and in configs.

=============================================  =============================================
``hf:smollm2-135m-instruct``                   :class:`~agentgym.policies.hf.HFPolicy`
``hf:/path/to/model?dtype=bfloat16``           options after ``?`` become keyword arguments
``vllm:/path/to/model``                        :class:`~agentgym.policies.vllm.VLLMPolicy`
``openai:http://127.0.0.1:8000/v1#model``      :class:`~agentgym.policies.openai.OpenAIPolicy`
``expert``                                     the env's expert (:class:`ExpertPolicy`)
``scripted:package.module:function``           :class:`ScriptedPolicy` around ``function``
``smollm2-135m-instruct`` (no prefix)          same as ``hf:``
=============================================  =============================================

Option values are parsed as JSON where possible (``max_batch_size=8``, ``vllm_extras=false``).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from agentgym.errors import ConfigurationError
from agentgym.policy import Policy

__all__ = ["PolicySpec", "from_spec", "parse_spec"]

KINDS = ("hf", "vllm", "openai", "expert", "scripted")


@dataclass(frozen=True)
class PolicySpec:
    """A parsed spec: ``kind``, ``target`` (model, URL or callable path), ``model`` (openai) and options."""

    kind: str
    target: str = ""
    model: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _value(v: str) -> Any:
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def parse_spec(spec: str) -> PolicySpec:
    """Parse a spec string without building anything (cheap; for validating configs)."""
    s = spec.strip()
    if not s:
        raise ConfigurationError("empty policy spec; use e.g. hf:smollm2-135m-instruct, vllm:PATH, openai:URL#MODEL or expert")
    if s == "expert":
        return PolicySpec("expert")
    kind, sep, rest = s.partition(":")
    if not sep or kind not in KINDS:
        if "://" in s:
            raise ConfigurationError(f"policy spec {spec!r}: prefix URLs with openai:, e.g. openai:{s}#MODEL")
        kind, rest = "hf", s
    if kind == "openai":
        url, _, model = rest.partition("#")
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"policy spec {spec!r}: expected openai:http(s)://HOST/v1#MODEL")
        return PolicySpec("openai", url, model or None)
    if kind == "scripted":
        if ":" in rest:
            mod, _, fn = rest.rpartition(":")
        else:
            mod, _, fn = rest.rpartition(".")
        if not mod or not fn:
            raise ConfigurationError(f"policy spec {spec!r}: expected scripted:package.module:function")
        return PolicySpec("scripted", f"{mod}:{fn}")
    if kind == "expert":
        raise ConfigurationError(f"policy spec {spec!r}: 'expert' takes no argument")
    target, _, query = rest.partition("?")
    if not target:
        raise ConfigurationError(f"policy spec {spec!r}: name a model, e.g. {kind}:smollm2-135m-instruct")
    options = {k: _value(v) for k, v in parse_qsl(query, keep_blank_values=True)} if query else {}
    return PolicySpec(kind, target, None, options)


def from_spec(spec: str | PolicySpec, **kwargs: Any) -> Policy:
    """Build the policy a spec names. ``kwargs`` (e.g. ``policy_id``) override the spec's options."""
    ps = parse_spec(spec) if isinstance(spec, str) else spec
    opts = {**ps.options, **kwargs}
    if ps.kind == "expert":
        from .scripted import ExpertPolicy

        return ExpertPolicy(**opts)
    if ps.kind == "scripted":
        from .scripted import ScriptedPolicy

        mod_name, _, fn_name = ps.target.partition(":")
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise ConfigurationError(f"scripted policy {ps.target!r} cannot be imported: {e}") from e
        if not callable(fn):
            raise ConfigurationError(f"scripted policy {ps.target!r} is not callable")
        return ScriptedPolicy(fn, **opts)
    if ps.kind == "openai":
        from .openai import OpenAIPolicy

        return OpenAIPolicy(ps.target, ps.model, **opts)
    if ps.kind == "vllm":
        from .vllm import VLLMPolicy

        return VLLMPolicy(ps.target, **opts)
    from .hf import HFPolicy

    try:
        return HFPolicy(ps.target, **opts)
    except TypeError as e:
        raise ConfigurationError(f"bad option in policy spec {spec!r}: {e}") from e
