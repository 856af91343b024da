"""SQL-AgentBench-v0: every dbbench row type, scored as AgentBench scores it.

The fixture rows below are written here in AgentBench's exact dbbench shape (``description``,
``label``, ``table.table_info``, ``type`` as a one-item list, ``answer_md5`` as MySQL's printed
result ``"[('<md5>',)]"``); none of AgentBench's own data is used. Expected hashes are computed in
this file by an independent transcription of AgentBench's MySQL query, over the cell texts as
AgentBench inserts them (``str(value)``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from agentgym.envs.sql.agentbench import (
    AgentBenchSQLEnv,
    agentbench_answer_match,
    clean_answer,
    column_style,
    mysql_to_sqlite,
)

import agentgym
from agentgym.checker import check_env
from agentgym.errors import ConfigurationError, ValidationError


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def table(name: str, cols: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"table_name": name, "table_info": {"columns": [{"name": c, "type": "TEXT"} for c in cols], "rows": rows}}


def mysql_md5(rows: list[list[Any]]) -> str:
    """AgentBench's hash, transcribed independently: MD5 of the sorted 5-char row hashes."""
    def md5(s: str) -> str:
        return hashlib.md5(s.encode()).hexdigest()
    return md5(",".join(sorted(md5(",".join(str(v) for v in r if v is not None))[:5] for r in rows))[:1024])


def printed(h: str) -> str:
    return f"[('{h}',)]"  # how AgentBench's files hold answer_md5 (MySQL's printed result)


MEDALS_ROWS = [
    ["Norway", "16", "8", "39", "1.50"], ["Germany", "12", "10", "31", "2.25"], ["Canada", 11, "8", "26", "3.00"],
    ["United States", "9", "8", "37", "0.75"], ["Côte d'Ivoire", "8", "6", "20", "1.00"],
]
MEDALS = table("Olympic Medals", ["Nation", "Gold", "Silver", "Total", "Ratio"], MEDALS_ROWS)
INSERTED = [*MEDALS_ROWS, ["Japan", "3", "6", "13", "0.50"]]
UPDATED = [r if r[0] != "Canada" else ["Canada", "12", "8", "26", "3.00"] for r in MEDALS_ROWS]
DELETED = [r for r in MEDALS_ROWS if int(r[3]) >= 25]
ESCAPED = [r if r[0] != "Germany" else ["Germany's team", "12", "10", "31", "2.25"] for r in MEDALS_ROWS]
ADD = "The name of this table is Olympic Medals, and the headers of this table are Nation,Gold,Silver,Total,Ratio."

DBBENCH: list[dict[str, Any]] = [
    # 0-3: select-like rows (label is the answer)
    {"description": "Which nation won more than 10 gold medals and has the largest total?", "label": ["Norway"],
     "table": MEDALS, "type": ["other"], "add_description": ADD,
     "sql": {"query": "SELECT Nation FROM `Olympic Medals` WHERE Gold > 10 ORDER BY Total DESC LIMIT 1"}},
    {"description": "How many nations won at least 9 gold medals?", "label": ["4"], "table": MEDALS,
     "type": ["counting"], "add_description": ADD},
    {"description": "What is the total number of silver medals?", "label": [40.0], "table": [MEDALS],
     "type": ["aggregation-SUM"], "add_description": ADD},
    {"description": "Which nations won 8 silver medals?", "label": ["Norway", "Canada", "United States"],
     "table": MEDALS, "type": ["comparison"], "add_description": ADD},
    # 4: INSERT, gold SQL in label, answer_md5 as published (MySQL's printed result)
    {"description": "Add Japan with 3 gold, 6 silver, 13 in total and a ratio of 0.50.",
     "label": ["INSERT INTO `Olympic Medals` (Nation, Gold, Silver, Total, Ratio) VALUES ('Japan', '3', '6', '13', '0.50')"],
     "table": MEDALS, "type": ["INSERT"], "add_description": ADD, "answer_md5": printed(mysql_md5(INSERTED))},
    # 5: UPDATE whose answer_md5 is empty: AgentBench hashes the gold SQL's result itself
    {"description": "Set Canada's gold count to 12.", "label": ["UPDATE `Olympic Medals` SET Gold = '12' WHERE Nation = 'Canada'"],
     "table": MEDALS, "type": ["UPDATE"], "add_description": ADD, "answer_md5": ""},
    # 6: DELETE with the gold in sql.query (older files) and a bare hash
    {"description": "Remove nations with fewer than 25 medals in total.", "table": MEDALS, "type": ["DELETE"],
     "sql": {"query": "DELETE FROM `Olympic Medals` WHERE Total < 25"}, "answer_md5": mysql_md5(DELETED)},
    # 7: a gold that changed nothing in MySQL (no such nation): doing nothing is correct
    {"description": "Delete Atlantis.", "label": ["DELETE FROM `Olympic Medals` WHERE Nation = 'Atlantis'"],
     "table": MEDALS, "type": ["DELETE"], "answer_md5": printed(mysql_md5(MEDALS_ROWS))},
    # 8: MySQL backslash escape in the gold: translated, verified, kept
    {"description": "Rename Germany to Germany's team.",
     "label": ["UPDATE `Olympic Medals` SET Nation = 'Germany\\'s team' WHERE Nation = 'Germany'"],
     "table": MEDALS, "type": ["UPDATE"], "answer_md5": printed(mysql_md5(ESCAPED))},
    # 9: a MySQL-only function SQLite lacks: excluded with the reason
    {"description": "Cut Norway's name at its first r.",
     "label": ["UPDATE `Olympic Medals` SET Nation = SUBSTRING_INDEX(Nation, 'r', 1) WHERE Nation = 'Norway'"],
     "table": MEDALS, "type": ["UPDATE"], "answer_md5": printed("0" * 32)},
    # 10: SQLite's result differs from the published hash: excluded with the reason
    {"description": "Set every total to 0.", "label": ["UPDATE `Olympic Medals` SET Total = '0'"],
     "table": MEDALS, "type": ["UPDATE"], "answer_md5": printed("f" * 32)},
    # 11: a select row without a label cannot be scored
    {"description": "Unlabelled question.", "table": MEDALS, "type": ["other"]},
]
LOADED = ["dbbench-0", "dbbench-1", "dbbench-2", "dbbench-3", "dbbench-4", "dbbench-5", "dbbench-6", "dbbench-7",
          "dbbench-8"]


@pytest.fixture
def dbbench(tmp_path: Path) -> Path:
    p = tmp_path / "standard.jsonl"
    p.write_text("\n".join(json.dumps(e) for e in DBBENCH) + "\n")
    return p


@pytest.fixture
def env(dbbench: Path) -> AgentBenchSQLEnv:
    e = AgentBenchSQLEnv(path=dbbench)
    yield e
    e.close()


def play(e: AgentBenchSQLEnv, task_id: str, *actions: str) -> float:
    e.reset(options={"task_id": task_id})
    reward, term = 0.0, False
    for a in actions:
        _, reward, term, _, _ = e.step(a)
    assert term
    return reward


# ---------------------------------------------------------------------------- loading
def test_every_row_type_loads_and_skips_are_counted_with_reasons(dbbench: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentgym.envs.sql.agentbench"):
        e = AgentBenchSQLEnv(path=dbbench)
    tasks = e.tasks("test")
    assert [t.task_id for t in tasks] == LOADED
    assert [t.task_type for t in tasks] == ["other", "counting", "aggregation-sum", "comparison", "insert", "update",
                                           "delete", "delete", "update"]
    assert [t.data["kind"] for t in tasks] == ["answer"] * 4 + ["state"] * 5
    rep = e.load_report()
    assert rep["loaded"] == 9 and rep["skipped"] == 3
    assert rep["skip_reasons"] == {
        "gold SQL fails in SQLite: MySQL-only function SUBSTRING_INDEX()": 1,
        "SQLite tables after the gold SQL differ from answer_md5": 1,
        "select row without a label": 1,
    }
    assert [i["item"] for i in rep["skipped_items"]] == ["row 9 (UPDATE)", "row 10 (UPDATE)", "row 11 (other)"]
    assert rep["notes"] == {"answer_md5 equals the unchanged tables": 1, "gold SQL translated from MySQL's dialect": 1}
    assert tasks[5].data["answer_md5"] == mysql_md5(UPDATED)  # empty answer_md5: hashed from the gold, as AgentBench does
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "loaded 9 task(s)" in warnings[0] and "skipped 3" in warnings[0]
    assert "1 x select row without a label" in warnings[0]
    e.close()


def test_tool_names_prompt_and_expert(env: AgentBenchSQLEnv) -> None:
    assert env.tools.names == ["execute_sql", "commit_final_answer"]
    obs, _ = env.reset(options={"task_id": "dbbench-0"})
    assert "commit_final_answer" in obs[0]["content"]
    assert obs[1]["content"] == f"Additional table information about the question: {ADD}\nQuestion: " + DBBENCH[0]["description"]
    for t in env.tasks("test"):
        env.reset(options={"task_id": t.task_id})
        reward, steps = 0.0, 0
        while not env.done:
            _, reward, *_ = env.step(env.expert_action())
            steps += 1
        assert reward == 1.0 and steps <= 2, t.task_id


def test_mutations_are_scored_by_the_md5_of_the_tables(env: AgentBenchSQLEnv) -> None:
    commit = call("commit_final_answer", answers=["done"])
    # the change made the agent's own way (numbers written as numbers, other quoting): same table text
    ins = "INSERT INTO `Olympic Medals` VALUES ('Japan', 3, 6, 13, '0.50')"
    assert play(env, "dbbench-4", call("execute_sql", query=ins), commit) == 1.0
    assert play(env, "dbbench-4", commit) == 0.0  # nothing inserted
    bad = "INSERT INTO `Olympic Medals` VALUES ('Japan', 4, 6, 13, '0.50')"
    assert play(env, "dbbench-4", call("execute_sql", query=bad), commit) == 0.0
    # documented difference: a numeric column stores numbers, so '0.5' is held (and hashed) as the
    # column's '0.50' here, where MySQL's TEXT column would keep '0.5' and score 0
    odd = "INSERT INTO `Olympic Medals` VALUES ('Japan', 3, 6, 13, '0.5')"
    assert play(env, "dbbench-4", call("execute_sql", query=odd), commit) == 1.0
    assert play(env, "dbbench-5", call("execute_sql", query="UPDATE `Olympic Medals` SET Gold = 12 WHERE Nation = 'canada'"),
                commit) == 1.0  # MySQL's comparison is case-insensitive
    assert play(env, "dbbench-5", call("execute_sql", query="UPDATE `Olympic Medals` SET Gold = 13 WHERE Nation = 'Canada'"),
                commit) == 0.0
    assert play(env, "dbbench-6", call("execute_sql", query="DELETE FROM `Olympic Medals` WHERE Total <= 20"), commit) == 1.0
    assert play(env, "dbbench-6", call("execute_sql", query="DELETE FROM `Olympic Medals` WHERE Total < 30"), commit) == 0.0
    # a gold that changed nothing: doing nothing scores 1, changing something scores 0
    assert play(env, "dbbench-7", commit) == 1.0
    assert play(env, "dbbench-7", call("execute_sql", query="DELETE FROM `Olympic Medals` WHERE Nation = 'Norway'"),
                commit) == 0.0
    # the agent drops the table: no hash can match
    assert play(env, "dbbench-4", call("execute_sql", query="DROP TABLE `Olympic Medals`"), commit) == 0.0
    # accent-insensitive too, and the answer text of a mutation does not matter
    assert play(env, "dbbench-8", call("execute_sql", query="UPDATE `Olympic Medals` SET Nation = 'Germany''s team' "
                                                          "WHERE Nation = 'GERMANY'"),
                call("commit_final_answer")) == 1.0
    assert env.last_check["kind"] == "state" and env.last_check["scoring"] == "agentbench"


@pytest.mark.parametrize("task_id, answers, want", [
    ("dbbench-0", ["Norway"], 1.0),
    ("dbbench-0", "Norway", 1.0),                 # a bare string is one item
    ("dbbench-0", ["norway"], 0.0),               # no case folding
    ("dbbench-0", [" 'Norway' "], 1.0),           # trimmed and unquoted
    ("dbbench-0", ["Norway "], 1.0),
    ("dbbench-0", ["Nor way"], 0.0),              # no whitespace collapsing
    ("dbbench-0", ["Germany"], 0.0),
    ("dbbench-1", ["4"], 1.0),
    ("dbbench-1", [4], 1.0),
    ("dbbench-1", ["4.009"], 1.0),                # numbers within 0.01
    ("dbbench-1", ["4.02"], 0.0),                 # near miss
    ("dbbench-1", ["5"], 0.0),
    ("dbbench-2", ["40"], 1.0),
    ("dbbench-2", ["40", "1"], 0.0),
    ("dbbench-2", "[(40.0,)]", 1.0),              # a MySQL result pasted as the answer
    ("dbbench-3", ["Canada", "Norway", "United States"], 1.0),  # order does not matter
    ("dbbench-3", ["Canada", "Norway", "Norway", "United States"], 1.0),  # a set: duplicates do not matter
    ("dbbench-3", ["Canada", "Norway"], 0.0),
    ("dbbench-3", '["Canada", "Norway", "United States"]', 1.0),
])
def test_selects_use_agentbench_answer_rule(env: AgentBenchSQLEnv, task_id: str, answers: Any, want: float) -> None:
    assert play(env, task_id, call("commit_final_answer", answers=answers)) == want


def test_answer_rule_edge_cases() -> None:
    assert agentbench_answer_match([None], ["0"]) and agentbench_answer_match("null", [0])
    assert agentbench_answer_match(["None"], [""]) and agentbench_answer_match([], None) is False
    assert agentbench_answer_match(None, ["nan"])  # None and every None-like mean "0"
    assert agentbench_answer_match(["12%"], ["12"]) and agentbench_answer_match(["1,234"], ["1234"])
    assert agentbench_answer_match(["1.005", "2"], ["2", "1"])  # all numbers: one-to-one within 0.01
    assert not agentbench_answer_match(["1", "1"], ["1", "2"])
    assert agentbench_answer_match(["a", "b", "b"], ["b", "a"]) and not agentbench_answer_match(["a"], ["a", "b"])
    assert clean_answer("[('a',), ('b', 'c')]") == ["a"]  # a MySQL result: two-column rows are dropped
    assert clean_answer("[unparsable, 'x, y']") == ["unparsable", "x y"]  # commas inside quotes kept, then thousands-stripped


def test_lenient_scoring_is_an_option_for_training(dbbench: Path) -> None:
    e = AgentBenchSQLEnv(path=dbbench, scoring="lenient")
    assert play(e, "dbbench-0", call("commit_final_answer", answers=["norway"])) == 1.0
    assert play(e, "dbbench-3", call("commit_final_answer", answers=["Canada", "Norway", "Norway", "United States"])) == 0.0
    assert play(e, "dbbench-4", call("execute_sql", query="INSERT INTO `Olympic Medals` VALUES ('Japan', 3, 6, 13, 0.5)"),
                call("commit_final_answer")) == 1.0  # state compared by value, not MySQL text
    e.close()
    with pytest.raises(ConfigurationError, match="scoring"):
        AgentBenchSQLEnv(path=dbbench, scoring="strict")


def test_react_and_json_parsers(dbbench: Path) -> None:
    for parser in ("react", "json"):
        e = AgentBenchSQLEnv(path=dbbench, parser=parser)
        for tid in ("dbbench-3", "dbbench-8"):
            e.reset(options={"task_id": tid})
            while not e.done:
                _, reward, *_ = e.step(e.expert_action())
            assert reward == 1.0, (parser, tid)
        e.close()


def test_check_env(dbbench: Path) -> None:
    env = agentgym.make("agentgym/SQL-AgentBench-v0", path=str(dbbench))
    check_env(env)
    env.close()


# ---------------------------------------------------------------------------- building blocks
def test_column_styles_keep_the_text_mysql_holds() -> None:
    assert column_style(["1", "22", "", "None"]) == "int"
    assert column_style(["1", "022"]) == "text"  # leading zero: a number would lose it
    assert column_style(["1.5", "12"]) == "real:g"
    assert column_style(["1.5", "12.0"]) == "real:py"
    assert column_style(["1.50", "12.00"]) == "real:f2"
    assert column_style(["1.5", "12.00"]) == "text"
    assert column_style(["1e5", "2"]) == "text" and column_style(["nan", "1"]) == "text"
    assert column_style(["Norway", "16"]) == "text" and column_style([]) == "text"


def test_mysql_dialect_translation() -> None:
    sql = "UPDATE t SET a = 'It\\'s \\\\ ok', b = \"x\" WHERE 1st_place = 2 AND c = 1e5 AND `2nd` LIKE 'a\\%'"
    assert mysql_to_sqlite(sql) == "UPDATE t SET a = 'It''s \\ ok', b = 'x' WHERE `1st_place` = 2 AND c = 1e5 AND `2nd` LIKE 'a\\%'"
    assert mysql_to_sqlite("SELECT 1") == "SELECT 1"


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="path="):
        AgentBenchSQLEnv()
    with pytest.raises(ConfigurationError, match="folder"):
        AgentBenchSQLEnv(path=tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"description": "x"\n')
    with pytest.raises(ValidationError, match="line 1"):
        AgentBenchSQLEnv(path=bad)
    bad.write_text(json.dumps({"description": "x", "type": ["other"], "label": ["1"],
                               "table": table("t", ["a", "b"], [["1"]])}) + "\n")
    with pytest.raises(ValidationError, match="length"):
        AgentBenchSQLEnv(path=bad)
    bad.write_text(json.dumps({"description": "x", "type": ["INSERT"], "table": table("t", ["a"], [["1"]])}) + "\n")
    with pytest.raises(ConfigurationError, match=r"no usable task.*without gold SQL or answer_md5"):
        AgentBenchSQLEnv(path=bad)
