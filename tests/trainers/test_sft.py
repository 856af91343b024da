"""SFT samples from transcripts: the student's template, assistant-only masks, DAgger branches; collect."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agentgym.trainers.sft import sft_samples, transcript_samples

from agentgym.errors import TrainingDataError
from agentgym.types import Trajectory

HERE = Path(__file__).resolve().parent


def _transcript(actions: list[str], labels: list[str] | None = None) -> Trajectory:
    msgs: list[Any] = [{"role": "user", "content": "key[owl]"}]
    for i, a in enumerate(actions):
        msgs += [{"role": "assistant", "content": a}, {"role": "tool", "content": f"value[red]{i}"}]
    t = Trajectory("owl-red", "agentgym/TinyLookup-v0", messages=msgs, reward=1.0, success=True)
    if labels is not None:
        t.info["labels"] = labels
    return t


def _masked_text(tok: Any, ids: list[int], mask: list[int]) -> str:
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_plain_transcript_trains_only_assistant_tokens(tiny_tokenizer: Any) -> None:
    tok = tiny_tokenizer
    [s] = transcript_samples(_transcript(["lookup[]", "answer[red]"]), tok)
    assert _masked_text(tok, s.token_ids, s.loss_mask) == "lookup[]<|im_end|>answer[red]<|im_end|>"
    # the sequence is exactly the rendered conversation (what a token-in/token-out rollout sees)
    full = tok.apply_chat_template(_transcript(["lookup[]", "answer[red]"]).messages[:-1], tokenize=False)
    assert tok.decode(s.token_ids) == full
    assert s.logprobs is None and s.advantage == 1.0


def test_relabelled_transcript_branches_at_mistakes(tiny_tokenizer: Any) -> None:
    tok = tiny_tokenizer
    # the actor's second move was wrong; the expert would have answered
    t = _transcript(["lookup[]", "lookup[]", "answer[red]"], labels=["lookup[]", "answer[red]", "answer[red]"])
    main, branch = transcript_samples(t, tok)
    # main sequence: the wrong move stays in the context with mask 0
    assert _masked_text(tok, main.token_ids, main.loss_mask) == "lookup[]<|im_end|>answer[red]<|im_end|>"
    assert tok.decode(main.token_ids).count("lookup[]") == 2
    # branch: context up to the mistake, then the expert's label (the recovery) is trained
    assert _masked_text(tok, branch.token_ids, branch.loss_mask) == "answer[red]<|im_end|>"
    assert tok.decode(branch.token_ids).endswith("value[red]0<|im_end|>\n<|im_start|>assistant\nanswer[red]<|im_end|>\n")
    samples, counts = sft_samples([t, _transcript(["lookup[]"])], tok)
    assert counts["relabelled_turns"] == 1 and counts["samples"] == 3
    with pytest.raises(TrainingDataError, match="labels"):
        transcript_samples(_transcript(["lookup[]"], labels=[]), tok)


def test_filters(tiny_tokenizer: Any) -> None:
    bad = _transcript(["lookup[]"])
    bad.success = False
    lost = _transcript(["lookup[]"])
    lost.error = "EnvError: x"
    samples, counts = sft_samples([bad, lost, _transcript(["answer[red]"])], tiny_tokenizer, only_success=True,
                                  max_len=10_000)
    assert counts["failed_skipped"] == 1 and counts["error_skipped"] == 1 and len(samples) == 1
    _, counts = sft_samples([_transcript(["answer[red]"])], tiny_tokenizer, max_len=5)
    assert counts["too_long_skipped"] == 1


def test_collect_workflow_relabels_random_moves() -> None:
    import tiny_lookup  # noqa: F401  (registers the env)
    from agentgym.policies.scripted import ExpertPolicy

    from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime
    from agentgym.rollout.collect import CollectWorkflow

    async def run() -> list[Any]:
        rt = RolloutRuntime(4)
        wf = CollectWorkflow(ExpertPolicy(), 4, labeler=ExpertPolicy(), random_prob=1.0,
                             limits=RolloutLimits(max_turns=3))
        groups = await RolloutEngine(rt).run(wf, [GroupRequest("agentgym/TinyLookup-v0", "owl-red", seed=0)])
        rt.close()
        return groups

    [g] = asyncio.run(run())
    for t in g:
        # TinyLookup has no admissible_actions(): the expert acts, every state is labelled
        assert t.success and t.info["labels"] == ["lookup[]", "answer[red]"]
        assert t.info["acting"] == ["policy", "policy"] and t.info["tools"]


def test_collect_cli_writes_transcripts(tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    args = [sys.executable, "-m", "agentgym", "collect", "--env", "agentgym/ALFWorld-v0", "--policy", "expert",
            "--relabel", "--random-prob", "0.3", "--tasks", "3", "--max-turns", "40", "--out", str(out)]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # what it wrote, said plainly (not "{}"): episodes, successes, the labels, the file
    labelled = sum(len(r["info"]["labels"]) for r in rows)
    random_steps = sum(a == "random" for r in rows for a in r["info"]["acting"])
    succ = sum(bool(r["success"]) for r in rows)
    assert f"wrote 3 episodes of agentgym/ALFWorld-v0 (train split, 3 tasks x 1, policy expert) to {out}" in res.stdout
    assert f"successful: {succ} of 3 ({100 * succ / 3:.1f}%)" in res.stdout
    assert f"expert labels: {labelled} states labelled" in res.stdout and f"{random_steps} random steps" in res.stdout
    assert random_steps > 0
    summary = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=300, check=True).stdout)
    assert summary["episodes"] == 3 and summary["out"] == str(out) and summary["labelled_states"] > 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for r in rows:
        n_asst = sum(1 for m in r["messages"] if m["role"] == "assistant")
        assert len(r["info"]["labels"]) == n_asst == len(r["info"]["acting"])
        taken = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        for lab, act, src in zip(r["info"]["labels"], taken, r["info"]["acting"], strict=True):
            assert (src == "random") == (lab != act) or src == "random"
    bad = subprocess.run([sys.executable, "-m", "agentgym", "collect", "--env", "agentgym/Nope-v0", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "No env registered" in bad.stderr


def test_collect_writes_in_task_order_whatever_finishes_first(tmp_path: Path) -> None:
    # Groups are appended as they finish (short episodes first), then the file is rewritten in the order the tasks
    # were chosen: SFT shuffles samples by their position, so a timing-dependent order would train a different
    # model from the same transcripts.
    import gymnasium as gym

    import agentgym  # noqa: F401  (registers the envs)
    from agentgym.eval.runner import select_tasks

    env = gym.make("agentgym/ALFWorld-v0")
    try:
        want = [t.task_id for t in select_tasks(list(env.get_wrapper_attr("tasks")("train")), 24)]
    finally:
        env.close()
    out = tmp_path / "t.jsonl"
    args = [sys.executable, "-m", "agentgym", "collect", "--env", "agentgym/ALFWorld-v0", "--policy", "expert",
            "--tasks", "24", "--samples", "2", "--concurrency", "24", "--out", str(out)]
    subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["member"]) for r in rows] == [(t, m) for t in want for m in (0, 1)]
    turns = [len(r["messages"]) for r in rows]
    assert len(set(turns)) > 1  # episodes of unequal length: finishing order is not the task order by itself


def test_dagger_cap_keeps_the_first_disagreements_and_still_loads(tiny_tokenizer: Any, tmp_path: Path) -> None:
    """The ALFWorld DAgger round cuts each relabelled transcript after its cap-th disagreement
    (``bench_alfworld_learning.cap_disagreements``): the cut must count disagreements as the loader does and
    leave messages and labels aligned, or the round fails after its collection (it did once: a stale import)."""
    import importlib.util

    root = HERE.parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_alfworld_learning",
                                                      root / "benchmarks" / "bench_alfworld_learning.py")
        assert spec and spec.loader
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(root / "benchmarks"))
    acts = ["lookup[]", "lookup[x]", "lookup[y]", "lookup[]", "lookup[z]", "answer[red]"]
    labels = ["lookup[]", "answer[red]", "answer[red]", "lookup[]", "answer[red]", "answer[red]"]  # 3 differ
    src, dst = tmp_path / "relabelled.jsonl", tmp_path / "capped.jsonl"
    rows = [_transcript(acts, labels), _transcript(acts[:2], labels[:2])]
    src.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in rows))
    assert bench.cap_disagreements(src, dst, cap=2) == {"transcripts": 2, "cut": 1, "cap": 2}
    long, short = [Trajectory.from_dict(json.loads(x)) for x in dst.read_text().splitlines()]
    # cut right after the second disagreement (the third move): three moves, three labels
    assert [m["content"] for m in long.messages if m["role"] == "assistant"] == acts[:3]
    assert long.info["labels"] == labels[:3] and long.info["cut_after_disagreement"] == 2
    assert short.messages == rows[1].messages and "cut_after_disagreement" not in short.info
    main, *branches = transcript_samples(long, tiny_tokenizer)
    assert len(branches) == 2  # both kept disagreements train the expert's label
    samples, counts = sft_samples([long, short], tiny_tokenizer)
    assert counts["relabelled_turns"] == 3
