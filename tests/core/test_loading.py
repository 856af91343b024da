"""read_rows: the one reader of JSON / JSON Lines benchmark files (SQL AgentBench, Search-R1 questions, AgentBench OS,
Code-v0's MBPP / stdio rows and HumanEval)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from agentgym.errors import ValidationError
from agentgym.loading import read_rows


@pytest.mark.parametrize(("name", "text", "rows"), [
    ("a.jsonl", '{"x": 1}\n\n{"x": 2}\n', [{"x": 1}, {"x": 2}]),
    ("a.json", '[{"x": 1},\n {"x": 2}]', [{"x": 1}, {"x": 2}]),
    ("a.json", '{\n  "x": 1\n}\n', [{"x": 1}]),  # one pretty-printed object is one row
    ("a.json", '{"x": 1}\n{"x": 2}\n', [{"x": 1}, {"x": 2}]),  # JSON Lines named .json (Search-R1 files)
    ("a.jsonl", '[1, 2]\n', [[1, 2]]),  # in JSON Lines a list is one row
    ("a.ndjson", "", []),
])
def test_rows_of_json_and_json_lines(tmp_path: Path, name: str, text: str, rows: list[object]) -> None:
    p = tmp_path / name
    p.write_text(text)
    assert read_rows(p) == rows


@pytest.mark.parametrize(("name", "text", "rows"), [
    ("a.jsonl.gz", '{"x": 1}\n\n{"x": 2}\n', [{"x": 1}, {"x": 2}]),
    ("a.json.gz", '[{"x": 1}, {"x": 2}]', [{"x": 1}, {"x": 2}]),
    ("a.jsonl.gz", '[1, 2]\n', [[1, 2]]),  # the name inside the .gz decides: JSON Lines
    ("a.gz", '{"x": 1}\n{"x": 2}\n', [{"x": 1}, {"x": 2}]),
])
def test_gzipped_files_are_read_like_plain_ones(tmp_path: Path, name: str, text: str, rows: list[object]) -> None:
    p = tmp_path / name
    p.write_bytes(gzip.compress(text.encode()))
    assert read_rows(p) == rows
    p.write_bytes(b"not gzip")
    with pytest.raises(ValidationError, match="cannot read"):
        read_rows(p)


def test_rows_wrapped_under_a_key_are_unwrapped_only_when_asked(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    p.write_text('{"rows": [{"x": 1}, {"x": 2}], "meta": 3}')
    assert read_rows(p, keys=("rows", "data")) == [{"x": 1}, {"x": 2}]
    assert read_rows(p) == [{"rows": [{"x": 1}, {"x": 2}], "meta": 3}]  # without keys: one row
    p.write_text('{"data": [1], "rows": "not a list"}')
    assert read_rows(p, keys=("rows", "data")) == [1]  # the first key holding a list
    p.write_text('{"x": 1}')
    assert read_rows(p, keys=("rows", "data")) == [{"x": 1}]
    q = tmp_path / "a.jsonl"
    q.write_text('{"rows": [1]}\n')
    assert read_rows(q, keys=("rows",)) == [{"rows": [1]}]  # JSON Lines: every line is a row


def test_bad_files_name_the_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"x": 1}\n{"x": \n')
    with pytest.raises(ValidationError, match=r"^SQL-v0: t\.jsonl line 2 is not JSON"):
        read_rows(p, source="SQL-v0")
    q = tmp_path / "t.json"
    q.write_text('{"x": 1}\nnope\n')
    with pytest.raises(ValidationError, match=r"t\.json line 2 is not JSON"):
        read_rows(q)
    q.write_text("[1, 2")
    with pytest.raises(ValidationError, match=r"t\.json is not JSON"):
        read_rows(q)
    with pytest.raises(ValidationError, match="cannot read"):
        read_rows(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValidationError, match="cannot read"):
        read_rows(tmp_path / "bin.json")
