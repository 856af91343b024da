from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agentgym.envs.search.env import SearchEnv

import agentgym


def _call(name: str, **args: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def _run_expert(env: SearchEnv, task_id: str, max_steps: int = 10) -> dict[str, Any]:
    env.reset(options={"task_id": task_id})
    for _ in range(max_steps):
        action = env.expert_action()
        assert action is not None
        _, _, term, trunc, info = env.step(action)
        if term or trunc:
            return info
    return {"success": False}


def test_check_env_passes() -> None:
    env = agentgym.make("agentgym/Search-v0")
    report = agentgym.check_env(env)
    assert not report.skipped
    env.close()


def test_expert_solves_at_least_95_percent(env: SearchEnv) -> None:
    for split in ("test", "train"):
        tasks = env.tasks(split)
        solved = sum(bool(_run_expert(env, t.task_id).get("success")) for t in tasks)
        assert solved / len(tasks) >= 0.95, (split, solved, len(tasks))


def test_expert_really_depends_on_search_results(env: SearchEnv) -> None:
    """With the retriever returning nothing useful, the expert cannot answer."""

    class Blind:
        def search(self, query: str, k: int = 3) -> list:
            return []

        def batch_search(self, queries: list[str], k: int = 3) -> list:
            return [[] for _ in queries]

    blind = SearchEnv(retriever=Blind())
    tasks = blind.tasks("test")[:30]
    assert not any(_run_expert(blind, t.task_id).get("success") for t in tasks)


@pytest.mark.parametrize("parser", ["json", "react"])
def test_expert_speaks_every_parser(parser: str) -> None:
    env = SearchEnv(parser=parser)
    tasks = env.tasks("test")[:40]
    solved = sum(bool(_run_expert(env, t.task_id).get("success")) for t in tasks)
    assert solved >= 36


def test_search_returns_numbered_titled_passages(env: SearchEnv) -> None:
    obs, _ = env.reset(options={"split": "test", "index": 0})
    assert obs[0]["role"] == "system" and "search" in obs[0]["content"]
    assert obs[1]["content"].startswith("Question: ")
    msgs, reward, term, trunc, info = env.step(_call("search", query="was born in", k=4))
    text = msgs[0]["content"]
    assert msgs[0]["role"] == "tool"
    assert [f"Doc {i} (Title: " in text for i in range(1, 5)] == [True] * 4
    assert "Doc 5" not in text
    assert (reward, term, trunc) == (0.0, False, False)
    assert info["metrics"]["searches"] == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"query": ""}, "empty"),
        ({"query": "   "}, "empty"),
        ({"query": "x" * 5000}, "at most 1000"),
        ({"query": 42}, "invalid arguments"),
        ({"query": ["a", "b"]}, "invalid arguments"),
        ({"query": None}, "invalid arguments"),
        ({"query": "born", "k": 0}, "at least 1"),
        ({"query": "born", "k": "many"}, "invalid arguments"),
        ({}, "invalid arguments"),
    ],
)
def test_bad_search_input_is_an_observation(env: SearchEnv, args: dict[str, Any], needle: str) -> None:
    env.reset(seed=3)
    msgs, reward, term, trunc, info = env.step(_call("search", **args))
    assert needle in msgs[0]["content"]
    assert msgs[0]["content"].startswith("Error")
    assert not term and not trunc
    assert info["metrics"]["tool_errors"] == 1


def test_k_above_max_is_capped(env: SearchEnv) -> None:
    env.reset(seed=3)
    msgs, *_ = env.step(_call("search", query="was born in", k=50))
    assert "capped at 10" in msgs[0]["content"] and "Doc 10 " in msgs[0]["content"]


def test_no_match_message(env: SearchEnv) -> None:
    env.reset(seed=3)
    msgs, *_ = env.step(_call("search", query="qqqqzzzz"))
    assert "No passages match" in msgs[0]["content"]


def test_answer_tool_em_reward(env: SearchEnv) -> None:
    task = env.tasks("test")[0]
    gold = task.data["answers"][0]
    env.reset(options={"task_id": task.task_id})
    _, reward, term, trunc, info = env.step(_call("answer", answer=f"The {gold.upper()}."))
    assert (reward, term, trunc, info["success"]) == (1.0, True, False, True)
    env.reset(options={"task_id": task.task_id})
    _, reward, term, _, info = env.step(_call("answer", answer="Nobody"))
    assert (reward, term, info["success"]) == (0.0, True, False)


def test_answer_and_search_tags_in_text(env: SearchEnv) -> None:
    task = env.tasks("test")[1]
    env.reset(options={"task_id": task.task_id})
    msgs, _, term, _, _ = env.step("<think>look it up</think><search>was born in</search>")
    assert not term and msgs[0]["role"] == "user"
    assert msgs[0]["content"].startswith("<information>Doc 1 (Title:")
    _, reward, term, _, info = env.step(f"I know it. <answer>{task.data['answers'][0]}</answer>")
    assert term and reward == 1.0 and info["success"]


def test_plain_text_without_tags_is_a_format_error() -> None:
    env = SearchEnv(format_penalty=0.1)
    env.reset(seed=0)
    msgs, reward, term, _, info = env.step("I think the answer is probably 1800.")
    assert "no tool call" in msgs[0]["content"] and info["parse_error"]
    assert reward == pytest.approx(-0.1) and not term


def test_f1_reward() -> None:
    env = SearchEnv()
    comp = next(t for t in env.tasks("test") if t.task_type == "comparison")
    gold = comp.data["answers"][0]
    assert len(gold.split()) >= 2
    f1_env = SearchEnv(reward="f1")
    f1_env.reset(options={"task_id": comp.task_id})
    _, reward, term, _, info = f1_env.step(_call("answer", answer=gold.split()[0]))
    assert term and 0.0 < reward < 1.0 and not info["success"]


def test_same_seed_same_question(env: SearchEnv) -> None:
    a, ia = env.reset(seed=11)
    b, ib = env.reset(seed=11)
    assert a == b and ia["task_id"] == ib["task_id"]


def test_bad_config_raises() -> None:
    from agentgym.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        SearchEnv(reward="bleu")
    with pytest.raises(ConfigurationError):
        SearchEnv(retriever="elastic")
    with pytest.raises(ConfigurationError):
        SearchEnv(topk=20, max_k=10)


def test_search_r1_questions_and_wiki_corpus(wiki_corpus: Path, questions_jsonl: Path) -> None:
    env = SearchEnv(corpus=str(wiki_corpus), questions=str(questions_jsonl))
    assert env.splits == ("test",)
    assert [t.data["question"] for t in env.tasks("test")] == [
        "what is the capital of france?", "who designed the difference engine?"]
    env.reset(options={"task_id": "test-q1"})
    msgs, *_ = env.step(_call("search", query="difference engine", k=1))
    assert "Doc 1 (Title: Charles Babbage)" in msgs[0]["content"]
    _, reward, term, _, _ = env.step(_call("answer", answer="Babbage"))
    assert term and reward == 1.0
    # the generic expert (search the question, answer the top title) runs to the end
    info = _run_expert(env, "test-q0")
    assert info["success"] is True


def test_search_r1_parquet_questions(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    from agentgym.envs.search.data import load_questions

    rows = [  # Search-R1's processed rows keep the answers under reward_model.ground_truth.target
        {"data_source": "nq", "question": "who wrote hamlet?", "prompt": [{"role": "user", "content": "..."}],
         "reward_model": {"ground_truth": {"target": ["Shakespeare", "William Shakespeare"]}, "style": "rule"},
         "extra_info": {"index": 7, "split": "train"}},
        {"data_source": "hotpotqa", "id": "h1", "question": "q2?", "golden_answers": ["a2"]},
    ]
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[1:]), tmp_path / "test.parquet")
    recs = load_questions(tmp_path / "train.parquet")
    assert recs[0]["answers"] == ["Shakespeare", "William Shakespeare"] and recs[0]["id"] == "7"
    assert recs[0]["source"] == "nq"
    env = SearchEnv(questions={"train": str(tmp_path / "train.parquet"), "test": str(tmp_path / "test.parquet")},
                    corpus=None)
    assert env.splits == ("train", "test") and env.tasks("test")[0].data["answers"] == ["a2"]


def test_bad_question_file_raises(tmp_path: Path) -> None:
    from agentgym.errors import ValidationError

    p = tmp_path / "bad.jsonl"
    p.write_text('{"question": "no answers"}\n')
    with pytest.raises(ValidationError, match="golden_answers"):
        SearchEnv(questions=str(p))
    with pytest.raises(ValidationError, match="does not exist"):
        SearchEnv(questions=str(tmp_path / "missing.jsonl"))


def test_saved_index_option(tmp_path: Path, wiki_corpus: Path, questions_jsonl: Path) -> None:
    from agentgym.envs.search.data import load_wiki_corpus
    from agentgym.envs.search.retrieval import BM25Index

    BM25Index.build(load_wiki_corpus(wiki_corpus)).save(tmp_path / "idx")
    env = SearchEnv(index=str(tmp_path / "idx"), questions=str(questions_jsonl), mmap=True)
    env.reset(options={"task_id": "test-q0"})
    msgs, *_ = env.step(_call("search", query="capital of France", k=1))
    assert "Title: Paris" in msgs[0]["content"]


def test_duplicate_question_ids_are_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    p = tmp_path / "nq.jsonl"
    rows = [{"id": "q0", "question": "a?", "golden_answers": ["A"]}, {"id": "q1", "question": "b?", "golden_answers": ["B"]},
            {"id": "q0", "question": "a again?", "golden_answers": ["A"]}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with caplog.at_level(logging.WARNING, logger="agentgym.envs.search.env"):
        env = SearchEnv(questions=str(p), corpus=None)
    assert [t.task_id for t in env.tasks("test")] == ["test-q0", "test-q1"]
    rep = env.load_report("test")
    assert rep["loaded"] == 2 and rep["skipped"] == 1 and rep["skip_reasons"] == {"duplicate question id": 1}
    assert any("Search-v0: loaded 2 task(s)" in r.getMessage() and "1 x duplicate question id" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)
