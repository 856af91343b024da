"""SQLEnv (built-in generated tasks): contract, oracle, rewards, tools and safety in the env."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import pytest
from agentgym.envs.sql.env import SQLEnv
from agentgym.envs.sql.tasks import SPLIT_SCHEMAS, generate_tasks

import agentgym
from agentgym.checker import check_env
from agentgym.errors import ConfigurationError


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def env():
    e = SQLEnv(timeout_s=0.5, format_penalty=0.5)
    yield e
    e.close()


def first_task(env: SQLEnv, split: str, task_type: str):
    return next(t for t in env.tasks(split) if t.task_type == task_type)


def sample(tasks, per_type: int):
    groups = defaultdict(list)
    for t in tasks:
        groups[t.task_type].append(t)
    return [t for ts in groups.values() for t in ts[:: max(1, len(ts) // per_type)][:per_type]]


@pytest.mark.parametrize("parser", ["hermes", "json", "react"])
def test_check_env_passes(parser: str) -> None:
    e = agentgym.make("agentgym/SQL-v0", parser=parser)
    report = check_env(e, expert_episodes=3)
    assert "expert finishes an episode; step after end raises ResetNeeded" in report.passed
    e.close()


def test_registered_ids_need_a_path() -> None:
    for env_id, hint in (("agentgym/SQL-Spider-v0", "Spider"), ("agentgym/SQL-AgentBench-v0", "JSONL")):
        with pytest.raises(ConfigurationError, match="path=") as ei:
            agentgym.make(env_id)
        assert hint in str(ei.value)
        with pytest.raises(ConfigurationError, match="does not exist"):
            agentgym.make(env_id, path="/nonexistent/agentgym-sql")


def test_task_pool_scale_splits_and_types() -> None:
    train, test = generate_tasks("train"), generate_tasks("test")
    assert len(train) + len(test) >= 2000
    assert {t.data["db_id"] for t in train} == set(SPLIT_SCHEMAS["train"])
    assert {t.data["db_id"] for t in test} == set(SPLIT_SCHEMAS["test"])
    assert not set(SPLIT_SCHEMAS["train"]) & set(SPLIT_SCHEMAS["test"])
    types = Counter(t.task_type for t in train)
    for ty in ("filter", "join", "aggregation", "group_by", "having", "ordering", "nested", "join_group_by",
               "join_having", "insert", "update", "delete"):
        assert types[ty] >= 10, ty
        assert any(t.task_type == ty for t in test), ty
    ids = [t.task_id for t in train + test]
    assert len(ids) == len(set(ids))


def test_tables_per_schema() -> None:
    from agentgym.envs.sql.schemas import SCHEMAS

    assert len(SCHEMAS) >= 4
    for s in SCHEMAS.values():
        assert 3 <= len(s.tables) <= 8, s.name


def test_generation_is_deterministic() -> None:
    from agentgym.envs.sql.tasks import _schema_tasks, builtin_db

    a = [(t.task_id, t.data["sql"]) for t in _schema_tasks("clinic", 7, 2)]
    b = [(t.task_id, t.data["sql"]) for t in _schema_tasks("clinic", 7, 2)]
    assert a == b
    assert builtin_db("clinic", 7).snapshot == builtin_db("clinic", 7).snapshot
    assert builtin_db("clinic", 7).rows != builtin_db("clinic", 8).rows


@pytest.mark.parametrize("split", ["train", "test"])
def test_oracle_scores_100_percent_on_a_sample(env: SQLEnv, split: str) -> None:
    tasks = sample(env.tasks(split), per_type=6)
    assert len({t.task_type for t in tasks}) >= 12
    for t in tasks:
        env.reset(options={"task_id": t.task_id})
        _, reward, term, trunc, info = env.step(env.expert_action())
        assert (reward, term, trunc, info["success"]) == (1.0, True, False, True), t.task_id


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "test"])
def test_oracle_scores_100_percent_on_every_task(split: str) -> None:
    e = SQLEnv()
    tasks = e.tasks(split)
    wins = 0
    for t in tasks:
        e.reset(options={"task_id": t.task_id})
        _, reward, _, _, info = e.step(e.expert_action())
        wins += int(reward == 1.0 and info["success"])
    assert wins == len(tasks)
    e.close()


def test_wrong_answers_score_zero(env: SQLEnv) -> None:
    for t in sample(env.tasks("test"), per_type=4):
        env.reset(options={"task_id": t.task_id})
        if t.data["kind"] == "state":
            action = call("submit")  # no change made
        else:
            # same columns, but one row too few or too many
            action = call("submit", query=f"SELECT * FROM ({t.data['sql']}) LIMIT 0")
            if t.task_type == "ordering":
                action = call("submit", query=f"SELECT * FROM ({t.data['sql']}) LIMIT 1 OFFSET 1")
        _, reward, term, _, info = env.step(action)
        assert term and reward == 0.0 and info["success"] is False, t.task_id


def test_order_matters_only_with_order_by(env: SQLEnv) -> None:
    ordered = next(t for t in env.tasks("train") if t.task_type == "ordering" and "LIMIT" not in t.data["sql"])
    env.reset(options={"task_id": ordered.task_id})
    rev = ordered.data["sql"].replace("ASC, ", "DESC, ", 1)
    _, reward, *_ = env.step(call("submit", query=rev))
    assert reward == 0.0
    plain = first_task(env, "train", "filter")
    env.reset(options={"task_id": plain.task_id})
    _, reward, *_ = env.step(call("submit", query=plain.data["sql"] + " ORDER BY 1 DESC"))
    assert reward == 1.0


def test_equivalent_query_scores_one(env: SQLEnv) -> None:
    t = first_task(env, "train", "join")
    env.reset(options={"task_id": t.task_id})
    # a different but equivalent query: a subquery instead of the join
    sql = t.data["sql"]
    assert " JOIN " in sql
    env.reset(options={"task_id": t.task_id})
    _, reward, *_ = env.step(call("submit", query=f"SELECT * FROM ({sql}) AS sub WHERE 1 = 1"))
    assert reward == 1.0


def test_state_task_via_execute_then_submit(env: SQLEnv) -> None:
    t = first_task(env, "test", "update")
    env.reset(options={"task_id": t.task_id})
    obs, reward, term, _, _ = env.step(call("execute_sql", query=t.data["sql"]))
    assert not term and "row(s) affected" in obs[0]["content"]
    _, reward, term, _, info = env.step(call("submit"))
    assert term and reward == 1.0 and info["success"]
    # an increase applied twice (execute_sql, then again through submit) is wrong
    t2 = next(x for x in env.tasks("test") if x.task_type == "update" and "+" in x.data["sql"])
    env.reset(options={"task_id": t2.task_id})
    env.step(call("execute_sql", query=t2.data["sql"]))
    _, reward, *_ = env.step(call("submit", query=t2.data["sql"]))
    assert reward == 0.0


def test_format_penalty_for_unscorable_submission(env: SQLEnv) -> None:
    t = first_task(env, "train", "filter")
    env.reset(options={"task_id": t.task_id})
    obs, reward, term, _, info = env.step(call("submit", answer=["x"]))
    assert term and reward == -0.5 and info["success"] is False
    assert "execution match" in obs[0]["content"]
    assert info["metrics"]["bad_submissions"] == 1
    env.reset(options={"task_id": t.task_id})
    _, reward, term, *_ = env.step(call("submit", query="SELEC broken"))
    assert term and reward == -0.5
    env.reset(options={"task_id": t.task_id})
    _, reward, term, _, info = env.step("I think the answer is 42.")
    assert not term and reward == -0.5 and info.get("parse_error")


def test_execute_sql_observations(env: SQLEnv) -> None:
    t = first_task(env, "train", "filter")
    env.reset(options={"task_id": t.task_id})
    obs, reward, term, trunc, info = env.step(call("execute_sql", query="SELECT name FROM employees ORDER BY id"))
    text = obs[0]["content"]
    assert obs[0]["role"] == "tool" and not term and reward == 0.0
    assert text.startswith("name\n") and "only the first 50 rows" in text
    obs, *_ , info = env.step(call("execute_sql", query="SELECT nope FROM employees"))
    assert obs[0]["content"].startswith("Error: ") and "no such column" in obs[0]["content"]
    obs, *_ , info = env.step(call("execute_sql", query="WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL "
                                                          "SELECT n + 1 FROM r) SELECT count(*) FROM r"))
    assert "timed out" in obs[0]["content"]
    obs, *_ , info = env.step(call("execute_sql", query="ATTACH DATABASE '/tmp/agentgym-x.db' AS x"))
    assert "not authorized" in obs[0]["content"]
    obs, *_ , info = env.step(call("execute_sql", query="SELECT 1; SELECT 2"))
    assert "one statement per call" in obs[0]["content"]
    m = info["metrics"]
    assert m["sql_queries"] == 5 and m["sql_errors"] == 4 and m["sql_timeouts"] == 1


def test_episode_changes_never_leak(env: SQLEnv) -> None:
    t = first_task(env, "train", "filter")
    env.reset(options={"task_id": t.task_id})
    env.step(call("execute_sql", query="DROP TABLE employees"))
    obs, *_ = env.step(call("execute_sql", query="SELECT COUNT(*) FROM employees"))
    assert "no such table" in obs[0]["content"]
    env.reset(options={"task_id": t.task_id})
    obs, *_ = env.step(call("execute_sql", query="SELECT COUNT(*) FROM employees"))
    assert "160" in obs[0]["content"]
    other = SQLEnv()
    other.reset(options={"task_id": t.task_id})
    env.step(call("execute_sql", query="DELETE FROM employees"))
    obs, *_ = other.step(call("execute_sql", query="SELECT COUNT(*) FROM employees"))
    assert "160" in obs[0]["content"]
    other.close()


def test_concurrent_envs_in_threads() -> None:
    tasks = sample(generate_tasks("test"), per_type=2)
    errors: list[str] = []

    def worker(chunk) -> None:
        e = SQLEnv()
        for t in chunk:
            e.reset(options={"task_id": t.task_id})
            e.step(call("execute_sql", query="DELETE FROM bookings"))
            e.reset(options={"task_id": t.task_id})
            _, r, *_ = e.step(e.expert_action())
            if r != 1.0:
                errors.append(t.task_id)
        e.close()

    threads = [threading.Thread(target=worker, args=(tasks[i::3],)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert errors == []


def test_task_type_filter_and_seeded_reset() -> None:
    e = SQLEnv(task_types=["nested"])
    assert {t.task_type for t in e.tasks("train")} == {"nested"}
    o1, i1 = e.reset(seed=5)
    o2, i2 = e.reset(seed=5)
    assert o1 == o2 and i1["task_id"] == i2["task_id"]
    assert "Question:" in o1[1]["content"] and "CREATE TABLE" in o1[1]["content"]
    e.close()


def test_tool_schema_states_the_caps() -> None:
    e = SQLEnv(max_rows=7, max_chars=900, timeout_s=1.5)
    desc = e.tools["execute_sql"].description
    assert "7 rows" in desc and "900 characters" in desc and "1.5 s" in desc
    assert "7 rows" not in SQLEnv().tools["execute_sql"].description  # per instance, not per class
    e.close()


def test_huge_results_are_never_fetched_whole(env: SQLEnv) -> None:
    t = first_task(env, "test", "filter")
    env.reset(options={"task_id": t.task_id})
    cross = "SELECT * FROM bookings AS a, bookings AS b, bookings AS c"  # 216 million rows
    t0 = time.perf_counter()
    obs, *_ = env.step(call("execute_sql", query=cross))
    assert "only the first 50 rows" in obs[0]["content"]
    _, reward, term, *_ = env.step(call("submit", query=cross))
    assert term and reward == 0.0
    assert time.perf_counter() - t0 < 2.0
