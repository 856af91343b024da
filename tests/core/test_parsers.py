"""Parsers: correct on good input, never raising on bad input (property-tested)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.errors import ConfigurationError
from agentgym.parsers import HermesParser, JSONParser, ReActParser, get_parser, list_parsers
from agentgym.tools import ToolSet, tool


@tool
def search(query: str, k: int = 3) -> str:
    """Search.

    Args:
        query: Words.
        k: How many.
    """
    return query * k


@tool
def submit(answer: str) -> str:
    """Submit an answer.

    Args:
        answer: The answer.
    """
    return answer


TOOLS = ToolSet([search, submit])
PARSERS = [HermesParser(), JSONParser(), ReActParser()]


def test_registry_of_parsers() -> None:
    assert list_parsers() == ["hermes", "json", "react"]
    assert get_parser("react").name == "react"
    with pytest.raises(ConfigurationError, match="Unknown parser"):
        get_parser("xml")


def test_hermes_single_and_multiple_calls() -> None:
    p = HermesParser()
    r = p.parse('I will search.\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>', TOOLS)
    assert r.ok and r.tool_calls == [{"id": "call_0", "name": "search", "arguments": {"query": "x"}}]
    r = p.parse(
        '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"a\\"}"}</tool_call>'
        '<tool_call>{"name": "submit", "arguments": {"answer": "b"}}</tool_call>',
        TOOLS,
    )
    assert r.ok and [c["name"] for c in r.tool_calls] == ["search", "submit"]
    assert r.tool_calls[0]["arguments"] == {"query": "a"}
    assert r.message["tool_calls"] == r.tool_calls


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("<tool_call>{bad json</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "search", "arguments": {}}', "unbalanced"),
        ('<tool_call><tool_call>{"name": "search"}</tool_call></tool_call>', "unbalanced"),
        ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "unknown tool 'nope'"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
        ('<tool_call>{"name": "search", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ("</tool_call>", "without a matching"),
        ("<tool_call>" + "[" * 5000 + "</tool_call>", "JSON"),
    ],
)
def test_hermes_errors(text: str, fragment: str) -> None:
    r = HermesParser().parse(text, TOOLS)
    assert not r.ok and fragment in (r.error or "")
    assert r.tool_calls == []


def test_hermes_plain_text_is_not_an_error() -> None:
    r = HermesParser().parse("The answer is 4.", TOOLS)
    assert r.ok and r.tool_calls == [] and r.command is None


def test_json_parser_structured_and_text() -> None:
    p = JSONParser()
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "q"}'}}]}
    r = p.parse(msg, TOOLS)
    assert r.ok and r.tool_calls == [{"id": "c1", "name": "search", "arguments": {"query": "q"}}]
    r = p.parse('```json\n[{"name": "submit", "arguments": {"answer": "x"}}]\n```', TOOLS)
    assert r.ok and r.tool_calls[0]["name"] == "submit"
    assert not p.parse('{"name": "submit", "arguments": "{oops"}', TOOLS).ok
    assert not p.parse({"role": "assistant", "content": 3}, TOOLS).ok
    assert p.parse("just words", TOOLS).tool_calls == []


def test_react_commands_and_calls() -> None:
    p = ReActParser()
    r = p.parse("Thought: I need the key.\nAction: search[capital of France]\nObservation: ...", TOOLS)
    assert r.ok and r.tool_calls == [{"id": "call_0", "name": "search", "arguments": {"query": "capital of France"}}]
    r = p.parse("Thought: go.\nAction: go to desk 1", None)
    assert r.ok and r.command == "go to desk 1" and not r.tool_calls
    assert p.parse("> open drawer 2\n", None).command == "open drawer 2"
    assert not p.parse("Action: fly[to the moon]", TOOLS).ok
    assert p.parse("Action: fly[to the moon]", None).command == "fly[to the moon]"


def test_huge_input_is_rejected_cleanly() -> None:
    for p in PARSERS:
        r = p.parse("x" * 1_000_000, TOOLS)
        assert not r.ok and "too long" in (r.error or "")


def test_non_text_actions() -> None:
    for p in PARSERS:
        for bad in (None, 3, ["a"], {"role": "assistant", "content": "", "tool_calls": "x"}):
            r = p.parse(bad, TOOLS)
            assert not r.ok, (p.name, bad)


call_obj = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["search", "submit", "nope"]), st.text(max_size=10)),
     "arguments": st.one_of(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3), st.text(max_size=10))}
)
junk = st.one_of(
    st.text(max_size=300),
    call_obj.map(lambda c: f"<tool_call>{json.dumps(c)}</tool_call>"),
    call_obj.map(lambda c: f"<tool_call>{json.dumps(c)[: len(json.dumps(c)) // 2]}"),  # truncated
    st.text(max_size=50).map(lambda s: f"<tool_call><tool_call>{s}</tool_call>"),  # nested
    st.text(max_size=50).map(lambda s: f"Action: {s}[{s}]"),
    st.recursive(st.text(max_size=5), lambda c: st.lists(c, max_size=3).map(json.dumps), max_leaves=10),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(text=junk)
def test_parsers_never_raise(text: str) -> None:
    for p in PARSERS:
        r = p.parse(text, TOOLS)
        assert r.ok or isinstance(r.error, str)
        for c in r.tool_calls:
            assert c["name"] in TOOLS and isinstance(c["arguments"], dict)


# ------------------------------------------------------------------------------ hostile arguments (issue 11)
def _huge_int() -> int:
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return int("7" * 5000)
    finally:
        sys.set_int_max_str_digits(old)


HUGE_DIGITS = "9" * 5000


@pytest.mark.parametrize("action", [
    '<tool_call>{"name": "search", "arguments": {"query": ' + HUGE_DIGITS + '}}</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"query": "x", "k": ' + HUGE_DIGITS + '}}</tool_call>',
    '{"name": "search", "arguments": {"query": "x", "k": ' + HUGE_DIGITS + '}}',
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "search", "arguments": '{"k": ' + HUGE_DIGITS + '}'}}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "search", "arguments": {"k": _huge_int()}}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "search", "arguments": {"q": [{"a": {1, 2}}]}}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "search", "arguments": {1: "x"}}]},
], ids=["hermes-str", "hermes-int", "json-text", "openai-str", "structured-int", "structured-set", "int-key"])
def test_hostile_arguments_are_parse_errors(action: object) -> None:
    for parser in (HermesParser(), JSONParser()):
        parsed = parser.parse(action, TOOLS)
        if isinstance(action, str) and parser.name == "json" and action.startswith("<tool_call>"):
            continue  # not this parser's format: plain text
        if isinstance(action, str) and parser.name == "hermes" and not action.startswith("<tool_call>"):
            continue
        assert not parsed.ok and parsed.tool_calls == [], (parser.name, parsed)
        json.dumps(parsed.message)  # whatever is recorded stays serialisable


def test_toolset_call_validates_arguments_itself() -> None:
    res = TOOLS.call({"id": "c", "name": "search", "arguments": {"query": "x", "k": _huge_int()}})
    assert not res.ok and res.error_kind == "bad_arguments" and "4300 digits" in res.content
    nested: dict[str, object] = {"query": "x"}
    cur = nested
    for _ in range(200):
        cur["n"] = {}
        cur = cur["n"]  # type: ignore[assignment]
    assert TOOLS.call({"id": "c", "name": "search", "arguments": nested}).error_kind == "bad_arguments"
