"""read_rows: the one reader of JSON / JSON Lines benchmark files (SQL AgentBench, Search-R1 questions, AgentBench OS)."""

from __future__ import annotations

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
