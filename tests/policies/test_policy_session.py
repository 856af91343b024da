"""Token-in/token-out sessions: accumulated ids equal a full re-render, drift is detected."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from agentgym.policies.models import load_tokenizer
from agentgym.policies.session import TokenizerChatSession

from agentgym.errors import ConfigurationError, TokenizationError
from agentgym.policy import ChatSession

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the encyclopedia for a query.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
]

# Llama-3 style: bos, header tokens, trimmed content, <|eot_id|>, tool results as "ipython".
LLAMA3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- set role = 'ipython' if m['role'] == 'tool' else m['role'] -%}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' -}}"
    "{%- if loop.first and tools -%}{{- 'Tools:\\n' -}}{%- for t in tools -%}{{- t | tojson + '\\n' -}}{%- endfor -%}{%- endif -%}"
    "{{- m['content'] | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

# Qwen-2.5 style: consecutive tool results are grouped into one user turn (look-ahead on the next message).
QWEN_TEMPLATE = (
    "{%- if tools -%}{{- '<|im_start|>system\\n' + (messages[0]['content'] if messages[0]['role'] == 'system' else 'You are Qwen.') -}}"
    "{{- '\\n\\n<tools>' -}}{%- for t in tools -%}{{- '\\n' + t | tojson -}}{%- endfor -%}{{- '\\n</tools><|im_end|>\\n' -}}"
    "{%- elif messages[0]['role'] == 'system' -%}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' and loop.first -%}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Qwen-3 style drift: reasoning is dropped from assistant turns before the last user message.
THINK_DROPPING_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set c = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in c -%}{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def smol_tok() -> Any:
    return load_tokenizer("smollm2-135m-instruct")


def _llama_tok(base: Any) -> Any:
    tok = copy.deepcopy(base)
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    tok.bos_token = "<|begin_of_text|>"
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


def _qwen_tok(base: Any) -> Any:
    tok = copy.deepcopy(base)
    tok.chat_template = QWEN_TEMPLATE
    return tok


def _styles(base: Any) -> dict[str, tuple[Any, str]]:
    """name -> (tokenizer, end-of-turn token the model samples)."""
    return {
        "smollm2-chatml": (base, "<|im_end|>"),
        "llama3": (_llama_tok(base), "<|eot_id|>"),
        "qwen": (_qwen_tok(base), "<|im_end|>"),
    }


def _full_render_ids(tok: Any, messages: list[Any], tools: Any) -> list[int]:
    out = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    return [int(t) for t in out]


def _sample(tok: Any, content: str, eot: str, closed: bool = True) -> list[int]:
    """What a model would sample: the content's ids, then the end-of-turn token."""
    ids = list(tok(content, add_special_tokens=False)["input_ids"])
    return [*ids, tok.convert_tokens_to_ids(eot)] if closed else ids


CONVERSATION: list[tuple[str, list[Any]]] = [
    ('<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>',
     [{"role": "tool", "content": "Paris is the capital of France.", "tool_call_id": "c0", "name": "search"},
      {"role": "tool", "content": "France is in Europe.", "tool_call_id": "c1", "name": "search"}]),
    ("The capital is Paris.", [{"role": "user", "content": "And of Italy? Answer in one word."}]),
    ("Rome", [{"role": "user", "content": "Thanks!"}]),
]


def _run_conversation(tok: Any, eot: str) -> tuple[TokenizerChatSession, list[Any]]:
    session = TokenizerChatSession(tok)
    messages: list[Any] = [
        {"role": "system", "content": "You answer geography questions."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    session.start(messages, TOOLS)
    for content, observation in CONVERSATION:
        session.append_completion(_sample(tok, content, eot))
        session.append_messages(observation)
        messages += [{"role": "assistant", "content": content}, *observation]
    return session, messages


@pytest.mark.parametrize("style", ["smollm2-chatml", "qwen"])
def test_accumulated_ids_equal_full_render(smol_tok: Any, style: str) -> None:
    tok, eot = _styles(smol_tok)[style]
    session = TokenizerChatSession(tok)
    assert isinstance(session, ChatSession)
    messages: list[Any] = [
        {"role": "system", "content": "You answer geography questions."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    ids = session.start(messages, TOOLS)
    assert ids == _full_render_ids(tok, messages, TOOLS)
    for content, observation in CONVERSATION:
        before = session.token_ids
        session.append_completion(_sample(tok, content, eot))
        delta = session.append_messages(observation)
        messages += [{"role": "assistant", "content": content}, *observation]
        # only the new tokens come back, and everything before is untouched
        assert session.token_ids[: len(before)] == before
        assert session.token_ids[-len(delta):] == delta
        assert 0 < len(delta) < len(session.token_ids) // 2
        assert session.token_ids == _full_render_ids(tok, messages, TOOLS), style
    assert session.verify()
    assert session.mismatches == [] and session.retokenization_drift == []


def test_llama3_style_text_is_exact_and_the_whitespace_join_is_reported(smol_tok: Any) -> None:
    """Llama-3's generation prompt ends in "\n\n". With SmolLM2's pre-tokenizer, "\n\n" at the end of
    the prompt is one token but "\n\n" followed by text is two, so a full re-render cannot equal the
    ids the model saw. The text stays exact and the join is reported."""
    tok, eot = _styles(smol_tok)["llama3"]
    session, messages = _run_conversation(tok, eot)
    full = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert tok.decode(session.token_ids) == session.text == full
    assert session.mismatches == []
    assert len(session.retokenization_drift) == len(CONVERSATION)
    assert all("prompt|completion" in d for d in session.retokenization_drift)
    assert not session.verify()
    # everything except those joins matches the full render token for token
    assert len(session.token_ids) == len(_full_render_ids(tok, messages, TOOLS)) - len(CONVERSATION)


def test_generation_prompt_and_tools_reach_the_template(smol_tok: Any) -> None:
    session = TokenizerChatSession(smol_tok)
    ids = session.start([{"role": "user", "content": "hi"}], TOOLS)
    gen_prompt = smol_tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids[-len(gen_prompt):] == gen_prompt
    assert "Search the encyclopedia" in session.text and '"name": "search"' in session.text
    session.append_completion(_sample(smol_tok, "hello", "<|im_end|>"))
    delta = session.append_messages([{"role": "user", "content": "bye"}])
    assert delta[-len(gen_prompt):] == gen_prompt
    assert smol_tok.decode(delta) == "\n<|im_start|>user\nbye<|im_end|>\n<|im_start|>assistant\n"


def test_cut_completion_gets_the_closing_glue(smol_tok: Any) -> None:
    """A completion cut by max_tokens has no <|im_end|>: the delta supplies it."""
    session = TokenizerChatSession(smol_tok)
    msgs: list[Any] = [{"role": "user", "content": "Count to three."}]
    session.start(msgs)
    session.append_completion(_sample(smol_tok, "One, two", "<|im_end|>", closed=False))
    delta = session.append_messages([{"role": "user", "content": "go on"}])
    assert smol_tok.decode(delta).startswith("<|im_end|>\n<|im_start|>user\n")
    full = [*msgs, {"role": "assistant", "content": "One, two"}, {"role": "user", "content": "go on"}]
    assert session.token_ids == _full_render_ids(smol_tok, full, None)


def test_sampled_ids_are_kept_even_when_retokenizing_differs(smol_tok: Any) -> None:
    """Non-canonical sampled ids stay verbatim (re-tokenizing would change them): detected by verify()."""
    session = TokenizerChatSession(smol_tok)
    session.start([{"role": "user", "content": "Say hello."}])
    chars = [smol_tok.convert_tokens_to_ids(c) for c in "hello"]  # one id per character
    session.append_completion([*chars, smol_tok.convert_tokens_to_ids("<|im_end|>")])
    session.append_messages([{"role": "user", "content": "again"}])
    ids = session.token_ids
    assert all(ids.count(c) >= 1 for c in chars)
    assert not session.verify()  # a full re-render would tokenize "hello" differently
    assert session.retokenization_drift and "canonical" in session.retokenization_drift[0]
    assert session.mismatches == []  # the text is consistent: no template drift


def test_template_drift_raises(smol_tok: Any) -> None:
    tok = copy.deepcopy(smol_tok)
    tok.chat_template = THINK_DROPPING_TEMPLATE
    session = TokenizerChatSession(tok)
    session.start([{"role": "user", "content": "2+2?"}])
    session.append_completion(_sample(tok, "<think>add them</think>4", "<|im_end|>"))
    with pytest.raises(TokenizationError, match="prefix property"):
        session.append_messages([{"role": "user", "content": "and 3+3?"}])
    assert len(session.mismatches) == 1


def test_template_drift_rerender_mode(smol_tok: Any) -> None:
    tok = copy.deepcopy(smol_tok)
    tok.chat_template = THINK_DROPPING_TEMPLATE
    session = TokenizerChatSession(tok, on_mismatch="rerender")
    session.start([{"role": "user", "content": "2+2?"}])
    session.append_completion(_sample(tok, "<think>add them</think>4", "<|im_end|>"))
    new = session.append_messages([{"role": "user", "content": "and 3+3?"}])
    assert session.last_reset and session.mismatches
    assert new == session.token_ids == session.render_all()
    assert "add them" not in tok.decode(new)


def test_misuse_is_a_configuration_error(smol_tok: Any) -> None:
    session = TokenizerChatSession(smol_tok)
    with pytest.raises(ConfigurationError):
        session.start([])
    session.start([{"role": "user", "content": "x"}])
    with pytest.raises(ConfigurationError):
        session.append_messages([{"role": "user", "content": "y"}])
    with pytest.raises(ConfigurationError):
        TokenizerChatSession(smol_tok, on_mismatch="ignore")  # type: ignore[arg-type]


def test_empty_completion(smol_tok: Any) -> None:
    """The model may end its turn at once: the session records an empty assistant message."""
    session = TokenizerChatSession(smol_tok)
    msgs: list[Any] = [{"role": "user", "content": "Say nothing."}]
    session.start(msgs)
    session.append_completion([smol_tok.convert_tokens_to_ids("<|im_end|>")])
    session.append_messages([{"role": "user", "content": "ok"}])
    assert session.messages[-2] == {"role": "assistant", "content": ""}
    full = [*msgs, {"role": "assistant", "content": ""}, {"role": "user", "content": "ok"}]
    assert session.token_ids == _full_render_ids(smol_tok, full, None)
