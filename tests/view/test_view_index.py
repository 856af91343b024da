"""The viewer's index: JSONL spans and rows, run discovery, summaries, comparisons, training series, documents."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from view_runs import ENV, bisect, compare_links, trajectory

from agentgym.errors import ConfigurationError, DocumentNotFound
from agentgym.rollout.jsonl import append_jsonl, dumps_trajectory
from agentgym.view import Site, discover_runs
from agentgym.view.analysis import breakdown, compare, heldout_curve, metric_series, success_interval
from agentgym.view.index import (
    MAX_TEXT,
    JsonlIndex,
    episode_head,
    episode_key,
    episode_row,
    episode_view,
    group_row,
    group_view,
)


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(x + "\n" for x in lines))


# --------------------------------------------------------------------------------------------- JsonlIndex
def test_index_rows_spans_and_records_read_back(tmp_path: Path) -> None:
    trajs = [trajectory(f"t{i}", success=i % 2 == 0) for i in range(5)]
    append_jsonl(tmp_path / "e.jsonl", trajs)
    idx = JsonlIndex(tmp_path / "e.jsonl", episode_row, episode_key)
    assert idx.refresh()
    assert [r["task"] for r in idx.rows] == [f"t{i}" for i in range(5)]
    assert [r["id"] for r in idx.rows] == list(range(5))
    assert [r["success"] for r in idx.rows] == [True, False, True, False, True]
    recs = idx.records([3, 1, 99])  # out of range ids are left out
    assert [r["task_id"] for r in recs] == ["t3", "t1"]
    assert recs[0] == json.loads(dumps_trajectory(trajs[3]))
    assert not idx.refresh()  # unchanged file: nothing to do


def test_index_last_record_of_an_episode_wins_in_place(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    append_jsonl(path, [trajectory("a", success=False), trajectory("b")])
    append_jsonl(path, [trajectory("a", success=True)])  # a resumed eval reran episode "a"
    idx = JsonlIndex(path, episode_row, episode_key)
    idx.refresh()
    assert len(idx) == 2
    assert idx.rows[0]["task"] == "a" and idx.rows[0]["success"] is True and idx.rows[0]["id"] == 0
    assert idx.records([0])[0]["success"] is True


def test_index_reads_appended_lines_only_and_waits_for_an_unfinished_line(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    seen: list[str] = []

    def row(rec: dict[str, Any]) -> dict[str, Any]:
        seen.append(rec["task_id"])
        return episode_row(rec)

    append_jsonl(path, [trajectory("a"), trajectory("b")])
    idx = JsonlIndex(path, row, episode_key)
    idx.refresh()
    line = dumps_trajectory(trajectory("c"))
    with open(path, "a") as f:
        f.write(line[:20])  # a writer in the middle of a line
    assert not idx.refresh() or len(idx) == 2
    assert len(idx) == 2 and seen == ["a", "b"]
    with open(path, "a") as f:
        f.write(line[20:] + "\n")
    assert idx.refresh()
    assert [r["task"] for r in idx.rows] == ["a", "b", "c"]
    assert seen == ["a", "b", "c"]  # a and b were not parsed again


def test_index_counts_torn_and_non_object_lines_and_rereads_a_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    _write(path, [dumps_trajectory(trajectory("a")), '{"task_id": "torn", "tur', "[1, 2]", "", dumps_trajectory(trajectory("b"))])
    idx = JsonlIndex(path, episode_row, episode_key)
    idx.refresh()
    assert [r["task"] for r in idx.rows] == ["a", "b"] and idx.skipped == 2
    replacement = tmp_path / "new.jsonl"
    _write(replacement, [dumps_trajectory(trajectory("z"))])
    replacement.replace(path)
    assert idx.refresh()
    assert [r["task"] for r in idx.rows] == ["z"] and idx.skipped == 0
    path.unlink()
    assert idx.refresh() and len(idx) == 0


# --------------------------------------------------------------------------------------------- rows and views
def test_episode_row_and_view_of_a_trajectory() -> None:
    t = trajectory("guess-9", seed=3, sample=1, success=False, text="I think 7", parse_error="bad JSON")
    rec = json.loads(dumps_trajectory(t))
    row = episode_row(rec)
    assert row == {**row, "env": ENV, "task": "guess-9", "type": "guess", "seed": 3, "sample": 1, "success": False,
                   "reward": 0.0, "parse_errors": 1, "turns": 1, "tool_calls": 1, "gen_tokens": 2, "prompt_tokens": 3,
                   "wall_s": 0.6, "truncated": False, "error": None}
    view = episode_view(rec, 7)
    assert view["id"] == 7
    assert [m["role"] for m in view["opening"]] == ["system", "user"]
    (turn,) = view["turns"]
    assert turn["text"] == "I think 7"
    assert turn["tool_calls"] == [{"id": "c0", "name": "guess", "arguments": '{"n": 7}'}]
    assert turn["observation"] == [{"role": "tool", "content": "higher", "name": "guess", "tool_call_id": "c0"}]
    assert (turn["prompt_tokens"], turn["completion_tokens"], turn["version"]) == (3, 2, "2–3")
    assert turn["parse_error"] == "bad JSON" and turn["timing"] == {"policy_s": 0.5, "env_s": 0.01}
    assert "completion_token_ids" not in json.dumps(view) and "actions" not in view["info"]


APP_JS = Path(__file__).resolve().parents[2] / "agentgym" / "view" / "static" / "app.js"


def _filter_episodes(path: Path) -> None:
    """Episodes that differ in every field the episode filters read (env, type, task, seed, outcome, truncation,
    error, parse errors), written as JSONL the way the runners write them, plus two hand-made records."""
    trunc = trajectory("guess-11", seed=1, success=False)
    trunc.truncated, trunc.truncated_reason, trunc.terminated = True, "max_turns", False
    err = trajectory("guess-21", seed=0, success=False)
    err.error, err.error_source = "env crashed: boom", "env"
    other = trajectory("lookup-3", seed=1, env="agentgym/Other-v0")
    other.info["task_type"] = "lookup"
    append_jsonl(path, [trajectory("guess-1", seed=0), trunc, err,
                        trajectory("guess-43", seed=1, success=False, parse_error="not valid JSON"), other])
    # parse errors counted from the turns where metrics lack the count; no seed, no type; not-quite-true flags
    turns_perr = json.loads(dumps_trajectory(trajectory("guess-53", seed=0)))
    del turns_perr["metrics"]["parse_errors"]
    turns_perr["turns"] = [dict(turns_perr["turns"][0], parse_error="bad"), dict(turns_perr["turns"][0], parse_error="worse")]
    odd = {"task_id": "sft-7", "env_id": ENV, "success": "yes", "truncated": 1, "error": "", "turns": [],
           "info": {"seed": "zero"}}
    with open(path, "a") as f:
        f.write(json.dumps(turns_perr) + "\n" + json.dumps(odd) + "\n")


FILTER_FIELDS = {  # per episode of _filter_episodes: what the filters see
    "env": [ENV, ENV, ENV, ENV, "agentgym/Other-v0", ENV, ENV],
    "type": ["guess", "guess", "guess", "guess", "lookup", "guess", "default"],
    "task": ["guess-1", "guess-11", "guess-21", "guess-43", "lookup-3", "guess-53", "sft-7"],
    "seed": [0, 1, 0, 1, 1, 0, None],
    "success": [True, False, False, False, True, True, False],
    "truncated": [False, True, False, False, False, False, False],
    "reason": [None, "max_turns", None, None, None, None, None],
    "error": [None, None, "env crashed: boom", None, None, None, ""],
    "error_source": [None, None, "env", None, None, None, None],
    "parse_errors": [0, 0, 0, 1, 0, 2, 0],
}


def test_episode_table_holds_what_the_filters_read(tmp_path: Path) -> None:
    """The episode filters run in the page (app.js ``rowMatches``) over the run document's table; here, without a
    browser: every field ``rowMatches`` reads is a column of the table, right for every episode."""
    _filter_episodes(tmp_path / "eps.jsonl")
    site = Site([tmp_path / "eps.jsonl"])
    doc = site.document("run/0")
    table = doc["table"]
    assert doc["episodes"] == 7 and table["id"] == list(range(7))
    for key, want in FILTER_FIELDS.items():
        assert table[key] == want, key
    js = APP_JS.read_text(encoding="utf-8")
    body = re.search(r"function rowMatches\(r, f\) \{(.*?)\n  \}", js, re.S)
    assert body is not None
    read = set(re.findall(r"\br\.(\w+)", body.group(1)))
    assert read == {"env", "type", "task", "seed", "success", "truncated", "error", "parse_errors"}
    assert read <= set(table) and read <= set(FILTER_FIELDS)
    # the breakdown counts the same fields
    blocks = {(b["env"], b["type"]): b for b in doc["breakdown"]}
    mine = blocks[(ENV, None)]
    assert (mine["episodes"], mine["successes"], mine["truncated"], mine["errors"], mine["parse_errors"]) == (6, 2, 1, 1, 3)


NODE = shutil.which("node") or shutil.which("nodejs")


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed: the page's filter functions are run in a browser test")
def test_page_filter_functions_over_the_table_without_a_browser(tmp_path: Path) -> None:
    """app.js's own ``AGV.filters`` (loaded in Node with a stub document) over the table of _filter_episodes."""
    _filter_episodes(tmp_path / "eps.jsonl")
    table = Site([tmp_path / "eps.jsonl"]).document("run/0")["table"]
    specs: list[dict[str, Any]] = [
        {}, {"env": ENV}, {"type": "lookup"}, {"task": "GUESS-5"}, {"seed": "1"}, {"seed": "0", "success": "no"},
        {"success": "yes"}, {"truncated": "yes"}, {"truncated": "no", "error": "no"}, {"error": "yes"},
        {"parse_errors": "yes"}, {"parse_errors": "no", "success": "no"}, {"seed": ""}]
    want = [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 5, 6], [4], [5], [1, 3, 4], [2], [0, 4, 5], [1], [0, 3, 4, 5, 6],
            [2], [3, 5], [1, 2, 6], [0, 1, 2, 3, 4, 5, 6]]
    script = tmp_path / "run.js"
    script.write_text("""
        const vm = require("vm"), fs = require("fs");
        const [app, data] = process.argv.slice(2).map((p) => fs.readFileSync(p, "utf8"));
        const window = {};
        const document = { querySelector: () => null, readyState: "loading", addEventListener: () => {} };
        vm.runInNewContext(app, { window, document });
        const { table, specs } = JSON.parse(data);
        const rows = window.AGV.filters.rowsOf(table);
        console.log(JSON.stringify(specs.map((f) => rows.filter((r) => window.AGV.filters.rowMatches(r, f)).map((r) => r.id))));
    """)
    (tmp_path / "data.json").write_text(json.dumps({"table": table, "specs": specs}))
    assert NODE is not None
    p = subprocess.run([NODE, str(script), str(APP_JS), str(tmp_path / "data.json")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == want


def test_the_fast_head_decoder_gives_the_rows_of_whole_records(runs: dict[str, Path]) -> None:
    t = trajectory("nan-task")
    t.reward = float("nan")  # written as NaN, which the typed decoder refuses: read whole instead
    odd = {"task_id": "odd", "turns": "no", "info": {"seed": "zero"}, "metrics": {"parse_errors": 2}}
    lines = [*(runs["xss"] / "episodes.jsonl").read_bytes().splitlines(), dumps_trajectory(trajectory()).encode(),
             dumps_trajectory(t).encode(), json.dumps(odd).encode()]
    for line in lines:
        whole = json.loads(line)
        head = episode_head(line)
        assert episode_row(head) == episode_row(whole) or math.isnan(whole["reward"])
        assert episode_key(head) == episode_key(whole)
    assert episode_row(episode_head(lines[-1]))["parse_errors"] == 2
    with pytest.raises(ValueError):
        episode_head(b'{"task_id": "torn", "tur')


def test_rows_and_views_of_garbage_records_do_not_raise() -> None:
    bad: dict[str, Any] = {"task_id": ["x"], "env_id": None, "turns": [None, 3, {"tool_calls": "no", "observation": [7],
                           "timing": {"policy_s": "fast"}, "weight_version": ["a"]}], "messages": "no",
                           "metrics": [], "info": {"seed": "zero", "eval_key": 5}, "reward": float("nan"), "success": "yes"}
    row = episode_row(bad)
    assert row["task"] == "['x']" and row["env"] == "?" and row["seed"] is None and row["reward"] is None
    assert row["success"] is False  # only a real true counts
    view = episode_view(bad, 0)
    json.dumps(view, allow_nan=False)  # strict JSON
    assert episode_key(bad) is None
    assert group_row({"rewards": "x", "gate_records": [3]})["members"] == 0
    json.dumps(group_view({"rewards": [1, "x"], "actions": "no", "gate_records": [{"score": float("inf")}]}, 0),
               allow_nan=False)


def test_long_strings_are_cut_with_a_note_and_non_finite_numbers_become_text() -> None:
    t = trajectory(text="x" * (MAX_TEXT + 500))
    t.metrics["weird"] = float("inf")
    view = episode_view(json.loads(dumps_trajectory(t)), 0)
    assert view["turns"][0]["text"].startswith("x" * MAX_TEXT)
    assert view["turns"][0]["text"].endswith("[… 500 more characters not shown]")
    assert view["metrics"]["weird"] == "inf"


def test_group_row_and_view(runs: dict[str, Path]) -> None:
    lines = (runs["train"] / "groups.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    row = group_row(rec)
    assert row["early_stopped"] and row["gate_stops"] == 1 and row["gate_enforced"]
    assert row["outcome"] == "filtered: early_stopped" and row["members"] == 2 and row["zero_variance"]
    view = group_view(rec, 0)
    assert [m["member"] for m in view["member_records"]] == [0, 1]
    assert view["member_records"][0]["actions"] == rec["actions"][0]
    assert view["gate_records"][0]["reason"].startswith("mean pairwise distance")
    assert group_row(json.loads(lines[1]))["outcome"] == "kept"


# --------------------------------------------------------------------------------------------- discovery
def test_discovery_of_eval_train_and_jsonl_runs(runs: dict[str, Path], tmp_path: Path) -> None:
    found = discover_runs([runs["root"]])
    kinds = {r.path.name: r.kind for r in found if r.parent is None}
    assert kinds == {"before": "eval", "after": "eval", "xss": "eval", "train": "train"}
    train = next(r for r in found if r.kind == "train")
    assert [found[c].stage for c in train.children] == ["before", "step-000003", "after"]
    assert all(found[c].parent == train.id for c in train.children)
    append_jsonl(tmp_path / "sft.jsonl", [trajectory()])
    (jl,) = discover_runs([tmp_path / "sft.jsonl"])
    assert jl.kind == "episodes" and jl.episodes_file == tmp_path / "sft.jsonl"
    with pytest.raises(ConfigurationError, match="does not exist"):
        discover_runs([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigurationError, match="no run found"):
        discover_runs([tmp_path / "empty"])
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ConfigurationError, match="not a run"):
        discover_runs([tmp_path / "notes.txt"])
    assert len(discover_runs([runs["before"], runs["before"]])) == 1  # the same folder twice is one run


# --------------------------------------------------------------------------------------------- analysis
def _row(task: str, success: bool, *, seed: int = 0, sample: int = 0, id: int = 0, env: str = ENV, type: str = "a",
         turns: int = 2, perr: int = 0) -> dict[str, Any]:
    return {"id": id, "env": env, "task": task, "type": type, "seed": seed, "sample": sample, "success": success,
            "reward": float(success), "turns": turns, "gen_tokens": 10, "prompt_tokens": 20, "parse_errors": perr,
            "truncated": False, "error": None, "wall_s": 1.0}


def test_breakdown_per_env_and_task_type() -> None:
    rows = [_row("a1", True, type="a"), _row("a2", False, type="a", perr=2), _row("b1", True, type="b"),
            _row("x", True, env="other")]
    blocks = breakdown(rows)
    assert [(b["env"], b["type"]) for b in blocks] == [(ENV, None), (ENV, "a"), (ENV, "b"), ("other", None)]
    env, a = blocks[0], blocks[1]
    assert env["episodes"] == 3 and env["successes"] == 2 and env["parse_errors"] == 2
    assert env["parse_errors_per_turn"] == pytest.approx(2 / 6)
    assert a["success"] == 0.5 and a["wilson95"][0] < 0.5 < a["wilson95"][1]


def test_breakdown_pass_at_k_per_task_type() -> None:
    # seed 0: t1 1 of 2, t2 0 of 2; seed 1: t1 0 of 2, t2 2 of 2 (type a); u1 of type b solved once in 2
    rows = [_row("t1", True), _row("t1", False, sample=1), _row("t2", False), _row("t2", False, sample=1),
            _row("t1", False, seed=1), _row("t1", False, seed=1, sample=1), _row("t2", True, seed=1),
            _row("t2", True, seed=1, sample=1), _row("u1", False, type="b"), _row("u1", True, type="b", sample=1)]
    by = {b["type"]: b for b in breakdown(rows)}
    assert by["a"]["pass_at_k"] == {"pass@1": pytest.approx(0.375), "pass@2": pytest.approx(0.5)}
    assert by["b"]["pass_at_k"] == {"pass@1": pytest.approx(0.5), "pass@2": pytest.approx(1.0)}
    assert by[None]["pass_at_k"]["pass@2"] == pytest.approx((0.5 + 2 / 3) / 2)  # seed 1 has no type-b task
    assert breakdown([_row("t1", True), _row("t1", False, seed=1)])[0]["pass_at_k"] == {}  # one episode per seed


def test_breakdown_pass_at_k_agrees_with_the_eval_summary(tmp_path: Path) -> None:
    """Over one env's episodes the breakdown's pass@k is the summary's (agentgym.eval.runner), k for k."""
    import itertools

    from agentgym.policies.scripted import ScriptedPolicy

    from agentgym.eval.runner import EvalConfig, run_eval

    calls = itertools.count()
    solve = bisect(lambda lo, hi: False)

    def flaky(messages: list[Any]) -> str:  # gives up at the start of every third episode
        if not any(m["role"] == "assistant" for m in messages) and next(calls) % 3 == 0:
            return '<tool_call>{"name": "give_up", "arguments": {}}</tool_call>'
        return str(solve(messages))

    run_eval(ScriptedPolicy(flaky), EvalConfig([ENV], split="test", tasks=4, seeds=[0, 1], samples=3, concurrency=1),
             tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["envs"][ENV]["pass_at_k"]
    env = Site([tmp_path / "run"]).document("run/0")["breakdown"][0]
    assert sorted(env["pass_at_k"]) == sorted(summary) == ["pass@1", "pass@2", "pass@3"]
    for k, v in summary.items():
        assert env["pass_at_k"][k] == pytest.approx(v["mean"])
    assert env["pass_at_k"]["pass@1"] < env["pass_at_k"]["pass@3"]


def test_compare_flips_pairs_and_totals() -> None:
    before = [_row("t1", False, id=0), _row("t1", False, seed=1, id=1), _row("t2", True, id=2), _row("t3", True, id=3),
              _row("t4", True, id=4), _row("only-before", True, id=5)]
    after = [_row("t1", True, seed=1, id=0), _row("t1", False, id=1), _row("t2", False, id=2), _row("t3", True, id=3),
             _row("t4", True, id=4)]
    doc = compare([(7, before), (9, after)])
    by = {t["task"]: t for t in doc["tasks"]}
    assert by["t1"]["status"] == "gained" and by["t1"]["episode_flips"] == 1
    assert by["t2"]["status"] == "lost" and by["t3"]["status"] == "same"
    assert by["only-before"]["status"] == "partial"
    assert by["t1"]["pairs"] == [{"seed": 0, "sample": 0, "eps": [0, 1], "success": [False, False]},
                                 {"seed": 1, "sample": 0, "eps": [1, 0], "success": [False, True]}]
    assert doc["totals"]["status"] == {"gained": 1, "lost": 1, "same": 2, "partial": 1}
    assert [r["successes"] for r in doc["totals"]["runs"]] == [3, 3]  # over the 4 shared tasks only
    assert [t["task"] for t in compare([(0, [_row("t10", True), _row("t9", True)])])["tasks"]] == ["t9", "t10"]
    three = compare([(0, before), (1, after), (2, before)])
    assert {t["task"]: t["status"] for t in three["tasks"]}["t2"] == "changed"  # first and last agree


def test_metric_series_and_heldout_curve(runs: dict[str, Path]) -> None:
    m = metric_series(runs["train"] / "metrics.jsonl")
    assert m["skipped"] == 1 and m["records"] == 8
    assert m["steps"][:2] == [0, 0]  # the before-eval record and the first step share step 0
    assert m["series"]["train/loss"][1] == 1.0 and m["series"]["train/loss"][0] is None
    assert "train/skipped" not in m["series"]
    stages = [(10, "before", {"overall": {"success": {"mean": 0.5, "ci95": [0.4, 0.6]}, "episodes": 8}}),
              (11, "step-000003", {"overall": {"success": {"mean": 0.6, "ci95": None, "wilson95": [0.3, 0.8]}}}),
              (12, "after", None)]
    curve = heldout_curve(stages, m, {"steps": 6})
    assert [(p["run"], p["step"]) for p in curve] == [(10, 0), (11, 2), (12, 6)]
    assert curve[0]["ci95"] == [0.4, 0.6] and curve[1]["interval"].startswith("Wilson")
    assert curve[2]["success"] is None
    # the interval is named by the summary's method (agentgym.eval.stats), in the trainer's words
    for method, words in (("wilson", "Wilson 95% over episodes"), ("bootstrap over tasks", "95% bootstrap over tasks")):
        s = success_interval({"overall": {"success": {"mean": 0.5, "ci95": [0.2, 0.8], "method": method}}})
        assert s is not None and s["interval"] == words and s["ci95"] == [0.2, 0.8]


# --------------------------------------------------------------------------------------------- documents
def test_site_documents(runs: dict[str, Path]) -> None:
    site = Site([runs["before"], runs["after"], runs["xss"], runs["train"]], chunk_size=5)
    index = site.document("index")
    assert [r["kind"] for r in index["runs"]] == ["eval", "eval", "eval", "train", "eval", "eval", "eval"]
    assert index["comparisons"][:2] == [[4, 6], [4, 5, 6]]  # the training run's before -> after, then all stages
    assert [0, 1] in index["comparisons"] and [0, 6] in index["comparisons"]  # runs given, and a stage vs a run
    assert [4, 5] not in index["comparisons"] and [0, 5] not in index["comparisons"]  # no middle stage pairs
    assert [r["name"] for r in index["runs"]][3:5] == ["train", "train › before"]
    run = site.document("run/0")
    assert run["episodes"] == 12 and len(run["table"]["task"]) == 12
    assert run["summary"]["finished_episodes"] == 12 and run["summary"]["protocol"]["seeds"] == [0, 1]
    chunk = site.document("run/0/chunk/2")
    assert [e["id"] for e in chunk["episodes"]] == [10, 11]
    paths = site.document_paths()
    assert "run/0/chunk/2" in paths and "run/0/chunk/3" not in paths and "run/3/gchunk/1" in paths
    assert "compare/0,1" in paths
    # the training page links every later stage to the first ("compare with before"): all are exported
    assert "compare/4,5" in paths and "compare/4,6" in paths and "compare/0,5" not in paths
    assert compare_links({p: site.document(p) for p in paths if re.fullmatch(r"index|run/\d+", p)}) <= set(paths)
    for bad in ("run/0/chunk/3", "run/99", "run/3/chunk/0", "run/0/gchunk/0", "../etc/passwd", "compare/0,0", "run/x"):
        with pytest.raises(DocumentNotFound):
            site.document(bad)
    train = site.document("run/3")
    assert train["groups"] == 6 and train["group_table"]["early_stopped"][0] is True
    assert [p["stage"] for p in train["heldout"]] == ["before", "step-000003", "after"]
    cmp = site.document("compare/0,1")
    assert cmp["names"] == ["before", "after"]  # the shortest tails of their paths that tell them apart
    status = {t["task"]: t["status"] for t in cmp["tasks"]}
    assert status == {"guess-1": "lost", "guess-11": "same", "guess-21": "same", "guess-33": "same",
                      "guess-43": "gained", "guess-53": "gained"}
    for p in paths:
        json.dumps(site.document(p), allow_nan=False)


def test_site_sees_episodes_appended_while_it_runs(runs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    live = tmp_path / "live"
    shutil.copytree(runs["before"], live)
    site = Site([live])
    assert site.document("run/0")["episodes"] == 12
    append_jsonl(live / "episodes.jsonl", [trajectory("new-task")])
    doc = site.document("run/0")
    assert doc["episodes"] == 13 and doc["table"]["task"][-1] == "new-task"
    assert not math.isnan(doc["breakdown"][0]["success"])


def test_the_rollout_records_each_turns_parse_error_and_timings(runs: dict[str, Path]) -> None:
    """The eval runner's episodes carry what the episode page shows per turn (Turn.parse_error, Turn.timing)."""
    from agentgym.rollout.jsonl import read_jsonl

    ep = read_jsonl(runs["xss"] / "episodes.jsonl")[0]
    first, second = ep.turns[0], ep.turns[1]
    assert first.parse_error and "not valid JSON" in first.parse_error
    assert second.parse_error is None and second.tool_calls[0]["name"] == "guess"
    for t in ep.turns:
        assert set(t.timing) == {"policy_s", "env_s"} and all(v >= 0 for v in t.timing.values())
    assert sum(t.timing["env_s"] for t in ep.turns) <= ep.timing["env_s"] + 1e-6
