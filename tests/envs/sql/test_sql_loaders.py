"""Spider/BIRD and AgentBench dbbench loaders, on fixture files written here."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from agentgym.envs.sql.env import AgentBenchSQLEnv, SpiderSQLEnv

import agentgym
from agentgym.checker import check_env
from agentgym.errors import ConfigurationError, ValidationError


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def make_db(path: Path, script: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.close()


CONCERT = """
CREATE TABLE singer (Singer_ID INTEGER PRIMARY KEY, Name TEXT, Country TEXT, Age INTEGER);
INSERT INTO singer VALUES (1, 'Joe Sharp', 'Netherlands', 52), (2, 'Timbaland', 'United States', 32),
  (3, 'Justin Brown', 'France', 29), (4, 'Rose White', 'France', 41);
CREATE TABLE concert (concert_ID INTEGER PRIMARY KEY, concert_Name TEXT, Year TEXT, Singer_ID INTEGER);
INSERT INTO concert VALUES (1, 'Auditions', '2014', 1), (2, 'Super bootcamp', '2014', 2), (3, 'Home Visits', '2015', 2);
"""
PETS = """
CREATE TABLE pets (PetID INTEGER PRIMARY KEY, PetType TEXT, weight REAL);
INSERT INTO pets VALUES (1, 'cat', 12.0), (2, 'dog', 13.4), (3, 'dog', 9.3);
"""


@pytest.fixture
def spider(tmp_path: Path) -> Path:
    root = tmp_path / "spider"
    make_db(root / "database" / "concert_singer" / "concert_singer.sqlite", CONCERT)
    make_db(root / "database" / "pets_1" / "pets_1.sqlite", PETS)
    tables = [{"db_id": "concert_singer", "table_names_original": ["singer", "concert"]},
              {"db_id": "pets_1", "table_names_original": ["pets"]}]
    (root / "tables.json").write_text(json.dumps(tables))
    dev = [
        {"db_id": "concert_singer", "question": "How many singers do we have?", "query": "SELECT count(*) FROM singer"},
        {"db_id": "concert_singer", "question": "List singer names ordered by age descending.",
         "query": "SELECT Name FROM singer ORDER BY Age DESC"},
        {"db_id": "pets_1", "question": "Average weight of each pet type?",
         "query": "SELECT PetType, avg(weight) FROM pets GROUP BY PetType"},
    ]
    train = [
        {"db_id": "concert_singer", "question": "Names of singers from France?",
         "query": "SELECT Name FROM singer WHERE Country = 'France'"},
        {"db_id": "concert_singer", "question": "Concerts per singer name?",
         "query": "SELECT T2.Name, count(*) FROM concert AS T1 JOIN singer AS T2 ON T1.Singer_ID = T2.Singer_ID "
                  "GROUP BY T2.Name"},
    ]
    (root / "dev.json").write_text(json.dumps(dev))
    (root / "train_spider.json").write_text(json.dumps(train))
    return root


def test_spider_layout_loads_and_oracle_wins(spider: Path) -> None:
    e = SpiderSQLEnv(path=spider)
    assert e.splits == ("train", "test")
    assert [t.data["db_id"] for t in e.tasks("test")] == ["concert_singer", "concert_singer", "pets_1"]
    assert len(e.tasks("train")) == 2
    for split in e.splits:
        for t in e.tasks(split):
            obs, _ = e.reset(options={"task_id": t.task_id})
            assert t.data["question"] in obs[1]["content"] and "CREATE TABLE" in obs[1]["content"]
            _, reward, term, _, info = e.step(e.expert_action())
            assert term and reward == 1.0 and info["success"], t.task_id
    e.close()


def test_spider_rewards(spider: Path) -> None:
    e = SpiderSQLEnv(path=spider)
    count_task, order_task, _ = e.tasks("test")
    e.reset(options={"task_id": count_task.task_id})
    _, reward, *_ = e.step(call("submit", query="SELECT count(*) + 1 FROM singer"))
    assert reward == 0.0
    e.reset(options={"task_id": count_task.task_id})
    _, reward, *_ = e.step(call("submit", query="SELECT COUNT(Singer_ID) FROM singer"))
    assert reward == 1.0
    e.reset(options={"task_id": order_task.task_id})  # gold has ORDER BY: order matters
    _, reward, *_ = e.step(call("submit", query="SELECT Name FROM singer ORDER BY Age ASC"))
    assert reward == 0.0
    e.close()


def test_spider_source_file_untouched(spider: Path) -> None:
    db_file = spider / "database" / "concert_singer" / "concert_singer.sqlite"
    before = db_file.read_bytes()
    e = SpiderSQLEnv(path=spider)
    e.reset(options={"task_id": e.tasks("test")[0].task_id})
    obs, *_ = e.step(call("execute_sql", query="DROP TABLE singer"))
    assert obs[0]["content"].startswith("OK")
    e.reset(options={"task_id": e.tasks("test")[0].task_id})
    obs, *_ = e.step(call("execute_sql", query="SELECT count(*) FROM singer"))
    assert "4" in obs[0]["content"]
    e.close()
    assert db_file.read_bytes() == before


def test_spider_check_env(spider: Path) -> None:
    env = agentgym.make("agentgym/SQL-Spider-v0", path=str(spider))
    report = check_env(env)
    assert "expert finishes an episode; step after end raises ResetNeeded" in report.passed
    env.close()


def test_bird_layout(tmp_path: Path) -> None:
    root = tmp_path / "bird_dev"
    make_db(root / "dev_databases" / "pets_1" / "pets_1.sqlite", PETS)
    dev = [{"db_id": "pets_1", "question": "Heaviest dog weight?", "evidence": "dog refers to PetType = 'dog'",
            "SQL": "SELECT max(weight) FROM pets WHERE PetType = 'dog'"}]
    (root / "dev.json").write_text(json.dumps(dev))
    e = SpiderSQLEnv(path=root)
    assert e.splits == ("test",)
    obs, _ = e.reset()
    assert "Evidence: dog refers to PetType = 'dog'" in obs[1]["content"]
    _, reward, *_ = e.step(call("submit", query="SELECT 13.4"))
    assert reward == 1.0
    e.close()


def test_spider_bad_layouts(tmp_path: Path, spider: Path) -> None:
    with pytest.raises(ConfigurationError, match="path="):
        SpiderSQLEnv()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigurationError, match=r"dev\.json"):
        SpiderSQLEnv(path=empty)
    (spider / "dev.json").write_text(json.dumps([{"db_id": "nope", "question": "q", "query": "SELECT 1"}]))
    with pytest.raises(ValidationError, match=r"tables\.json"):
        SpiderSQLEnv(path=spider)
    (spider / "tables.json").unlink()
    with pytest.raises(ValidationError, match="no database for 'nope'"):
        SpiderSQLEnv(path=spider)
    (spider / "dev.json").write_text(json.dumps([{"db_id": "pets_1", "question": "q"}]))
    with pytest.raises(ValidationError, match="query"):
        SpiderSQLEnv(path=spider)


# ---------------------------------------------------------------------------- AgentBench

def table(name: str, cols: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"table_name": name, "table_info": {"columns": [{"name": c, "type": "TEXT"} for c in cols], "rows": rows}}


MEDALS = table("Olympic Medals", ["Nation", "Gold", "Silver", "Total"], [
    ["Norway", "16", "8", "39"], ["Germany", "12", "10", "31"], ["Canada", "11", "8", "26"],
    ["United States", "9", "8", "37"], ["Netherlands", "8", "6", "20"],
])
DBBENCH = [
    {"description": "Which nation won more than 10 gold medals and has the largest total?",
     "label": ["Norway"], "table": MEDALS, "type": ["SELECT"], "add_description": "The table is Olympic Medals.",
     "sql": {"query": "SELECT Nation FROM `Olympic Medals` WHERE Gold > 10 ORDER BY Total DESC LIMIT 1"}},
    {"description": "How many nations won at least 9 gold medals?", "label": ["4"], "table": MEDALS,
     "type": ["counting"], "add_description": "", "sql": {"query": "SELECT COUNT(*) FROM `Olympic Medals` WHERE Gold >= 9"}},
    {"description": "What is the total number of silver medals?", "label": [40.0], "table": [MEDALS],
     "type": "aggregation-SUM", "sql": {"query": "SELECT SUM(Silver) FROM `Olympic Medals`"}},
    {"description": "Add Japan with 3 gold, 6 silver and 13 in total.", "label": "", "table": MEDALS,
     "type": ["INSERT"], "add_description": "",
     "sql": {"query": "INSERT INTO `Olympic Medals` (Nation, Gold, Silver, Total) VALUES ('Japan', '3', '6', '13')"}},
    {"description": "Set Canada's gold count to 12.", "table": MEDALS, "type": ["UPDATE"],
     "answer_md5": "abc", "sql": {"query": "UPDATE `Olympic Medals` SET Gold = 12 WHERE Nation = 'Canada'"}},
    {"description": "Remove nations with fewer than 25 medals in total.", "table": MEDALS, "type": ["DELETE"],
     "sql": {"query": "DELETE FROM `Olympic Medals` WHERE Total < 25"}},
    {"description": "A modification task without gold SQL cannot be scored in SQLite.", "table": MEDALS,
     "type": ["UPDATE"], "answer_md5": "abc"},
]


@pytest.fixture
def dbbench(tmp_path: Path) -> Path:
    p = tmp_path / "standard.jsonl"
    p.write_text("\n".join(json.dumps(e) for e in DBBENCH) + "\n")
    return p


def test_agentbench_loads_and_scores_by_type(dbbench: Path) -> None:
    e = AgentBenchSQLEnv(path=dbbench)
    tasks = e.tasks("test")
    assert [t.data["kind"] for t in tasks] == ["answer", "answer", "answer", "state", "state", "state"]
    assert [t.task_type for t in tasks] == ["select", "counting", "aggregation-sum", "insert", "update", "delete"]
    for t in tasks:
        obs, _ = e.reset(options={"task_id": t.task_id})
        assert t.data["question"] in obs[1]["content"]
        _, reward, term, _, info = e.step(e.expert_action())
        assert term and reward == 1.0 and info["success"], t.task_id
    obs, _ = e.reset(options={"task_id": tasks[0].task_id})
    assert "Additional table information about the question: The table is Olympic Medals." in obs[1]["content"]
    e.close()


def test_agentbench_numeric_columns_compare_as_numbers(dbbench: Path) -> None:
    e = AgentBenchSQLEnv(path=dbbench)
    e.reset(options={"task_id": "dbbench-0"})
    obs, *_ = e.step(call("execute_sql", query="SELECT Nation FROM `Olympic Medals` WHERE Gold > 10 ORDER BY Gold"))
    assert obs[0]["content"].split("\n")[1:4] == ["Canada", "Germany", "Norway"]
    obs, *_ = e.step(call("execute_sql", query="SELECT typeof(Gold), typeof(Nation) FROM `Olympic Medals` LIMIT 1"))
    assert "integer | text" in obs[0]["content"]
    e.close()


def test_agentbench_wrong_and_alternative_answers(dbbench: Path) -> None:
    e = AgentBenchSQLEnv(path=dbbench)
    cases = [
        ("dbbench-0", call("submit", answer=["Germany"]), 0.0),
        ("dbbench-0", call("submit", answer=[" norway "]), 1.0),
        ("dbbench-1", call("submit", answer=["5"]), 0.0),
        ("dbbench-1", call("submit", answer=[4]), 1.0),
        ("dbbench-1", call("submit", query="SELECT COUNT(*) FROM `Olympic Medals` WHERE Gold >= 9"), 1.0),
        ("dbbench-2", call("submit", answer=["40"]), 1.0),
        ("dbbench-2", call("submit", answer=["40", "1"]), 0.0),
        ("dbbench-3", call("submit"), 0.0),  # nothing inserted
        ("dbbench-4", call("submit", query="UPDATE `Olympic Medals` SET Gold = 13 WHERE Nation = 'Canada'"), 0.0),
        ("dbbench-5", call("submit", query="DELETE FROM `Olympic Medals` WHERE Total < 20"), 0.0),
    ]
    for task_id, action, want in cases:
        e.reset(options={"task_id": task_id})
        _, reward, term, *_ = e.step(action)
        assert term and reward == want, (task_id, action)
    # the change made through execute_sql, then a bare submit
    e.reset(options={"task_id": "dbbench-4"})
    e.step(call("execute_sql", query="UPDATE `Olympic Medals` SET Gold = '12' WHERE Nation = 'Canada'"))
    _, reward, *_ = e.step(call("submit"))
    assert reward == 1.0
    e.close()


def test_agentbench_react_parser(dbbench: Path) -> None:
    e = AgentBenchSQLEnv(path=dbbench, parser="react")
    e.reset(options={"task_id": "dbbench-0"})
    assert e.expert_action() == 'Action: submit[["Norway"]]'
    _, reward, *_ = e.step(e.expert_action())
    assert reward == 1.0
    e.close()


def test_agentbench_check_env(dbbench: Path) -> None:
    env = agentgym.make("agentgym/SQL-AgentBench-v0", path=str(dbbench))
    check_env(env)
    env.close()


def test_agentbench_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="path="):
        AgentBenchSQLEnv()
    with pytest.raises(ConfigurationError, match="folder"):
        AgentBenchSQLEnv(path=tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"description": "x"\n')
    with pytest.raises(ValidationError, match="line 1"):
        AgentBenchSQLEnv(path=bad)
    bad.write_text(json.dumps({"description": "x", "type": ["SELECT"], "label": ["1"],
                               "table": table("t", ["a", "b"], [["1"]])}) + "\n")
    with pytest.raises(ValidationError, match="length"):
        AgentBenchSQLEnv(path=bad)
    bad.write_text(json.dumps({"description": "x", "type": ["SELECT"], "table": table("t", ["a"], [["1"]])}) + "\n")
    with pytest.raises(ValidationError, match="label"):
        AgentBenchSQLEnv(path=bad)


def test_spider_big_databases_open_read_only(spider: Path) -> None:
    db_file = spider / "database" / "concert_singer" / "concert_singer.sqlite"
    before = db_file.read_bytes()
    e = SpiderSQLEnv(path=spider, max_copy_mb=0)  # every database counts as too big to copy
    task = e.tasks("test")[0]
    e.reset(options={"task_id": task.task_id})
    assert e.db is not None and e.db.readonly
    for sql in ("DROP TABLE singer", "DELETE FROM singer", "CREATE TEMP TABLE t (x)",
                "PRAGMA query_only = 0", "ATTACH DATABASE ':memory:' AS m"):
        obs, _, term, *_ = e.step(call("execute_sql", query=sql))
        assert obs[0]["content"].startswith("Error: ") and not term, sql
    obs, *_ = e.step(call("execute_sql", query="SELECT count(*) FROM singer"))
    assert "4" in obs[0]["content"]
    _, reward, *_ = e.step(e.expert_action())
    assert reward == 1.0
    e.close()
    assert db_file.read_bytes() == before
