"""The Spider/BIRD loader, on fixture files written here (AgentBench: test_sql_agentbench.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from agentgym.envs.sql.env import SpiderSQLEnv

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
