"""Policies: HF transformers, in-process vLLM, OpenAI-compatible HTTP, scripted. Loaded lazily.

Build one from a spec string (:func:`from_spec`): ``hf:smollm2-135m-instruct``,
``vllm:/path/to/model``, ``openai:http://127.0.0.1:8000/v1#model``, ``expert`` or
``scripted:module:function``. Nothing heavy (torch, transformers, vllm) is imported until a
policy is built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hf import HFPolicy
    from .models import load_tokenizer, prepare_model, resolve_model
    from .openai import OpenAIPolicy
    from .policy_map import PolicyMap
    from .scripted import ExpertPolicy, ScriptedPolicy
    from .session import TokenizerChatSession
    from .spec import PolicySpec, from_spec, parse_spec
    from .vllm import VLLMPolicy
    from .vllm_server import VLLMServerTarget

__all__ = [
    "ExpertPolicy",
    "HFPolicy",
    "OpenAIPolicy",
    "PolicyMap",
    "PolicySpec",
    "ScriptedPolicy",
    "TokenizerChatSession",
    "VLLMPolicy",
    "VLLMServerTarget",
    "from_spec",
    "load_tokenizer",
    "parse_spec",
    "prepare_model",
    "resolve_model",
]

_WHERE = {
    "ExpertPolicy": "scripted",
    "ScriptedPolicy": "scripted",
    "HFPolicy": "hf",
    "OpenAIPolicy": "openai",
    "VLLMPolicy": "vllm",
    "PolicyMap": "policy_map",
    "PolicySpec": "spec",
    "from_spec": "spec",
    "parse_spec": "spec",
    "TokenizerChatSession": "session",
    "VLLMServerTarget": "vllm_server",
    "load_tokenizer": "models",
    "prepare_model": "models",
    "resolve_model": "models",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
