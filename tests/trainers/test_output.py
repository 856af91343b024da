"""What a user sees: ``agentgym train`` reports rollout progress, every step, steps without an update and the
held-out success with its interval; ``curves.png`` draws the training loss (SFT) or reward beside the
unfiltered success, KL and clip fraction (RL), and the held-out success with error bars.

The plots are checked by reading back what was drawn (stored in the PNG's ``agentgym:panels`` text
chunk from the figure's own axes), never by pixels.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agentgym.trainers.metrics import RolloutDelta, curve_panels, plot_curves, step_line

HERE = Path(__file__).resolve().parent


def _panels(png: Path) -> dict[str, dict[str, Any]]:
    from PIL import Image

    with Image.open(png) as im:
        drawn = json.loads(im.text["agentgym:panels"])  # type: ignore[attr-defined]
    return {p["title"]: p for p in drawn}


def _lines(panel: dict[str, Any]) -> dict[str, int]:
    return {ln["label"]: ln["points"] for ln in panel["lines"]}


def _train(cfg_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "run.toml"
    cfg.write_text(cfg_text)
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "agentgym", "train", "--config", str(cfg)], env=env,
                          capture_output=True, text=True, timeout=900)


def test_rl_run_reports_progress_and_says_why_a_step_made_no_update(tiny_model: str, tmp_path: Path) -> None:
    """The untrained tiny model never succeeds: every group is zero-variance, dynamic sampling drops it, and
    no step updates. Before, this ran silently (and looked hung)."""
    out = tmp_path / "run"
    res = _train(f"""
[run]
out_dir = "{out}"
steps = 2
threads = 1
[model]
path = "{tiny_model}"
[rollout]
env = "agentgym/TinyLookup-v0"
imports = ["tiny_lookup"]
group_size = 2
groups_per_step = 2
max_tokens = 6
max_turns = 2
[filter]
dynamic_sampling = true
max_refill_rounds = 0
[eval]
split = "test"
tasks = 3
[log]
progress_every_s = 0.01
""", tmp_path)
    assert res.returncode == 0, res.stderr
    err = res.stderr
    # while rolling out (step 2's groups start when step 1 ends, and take far longer than the 10 ms between
    # lines; the exact line is checked with a controlled clock in test_rollout_progress_lines)
    assert re.search(r"step 2/2: rolling out for \d+ s: \d+ groups finished \(\d+ kept, \d+ filtered.*\), \d+ episodes, "
                     r"success [-0-9.%]+, [\d,]+ tokens generated in them.*; \d+ groups in flight", err), err
    # after each step: what was rolled out, and plainly that nothing was trained and why
    for k in (1, 2):
        m = re.search(rf"step {k}/2: rollout \d+ s: (\d+) groups finished \(0 kept, (\d+) filtered: zero_variance (\d+)\), "
                      rf"(\d+) episodes, success 0\.0%, [\d,]+ tokens generated in them \([\d,]+ tok/s\); NO UPDATE \(every group was "
                      rf"filtered: (\d+) dropped by the dataflow filters", err)
        assert m, err
        assert m[1] == m[2] == m[3] == m[5] and int(m[4]) == 2 * int(m[1]) >= 4
    assert "the learning-rate schedule moves on" in err
    # the held-out success, with its interval, printed during the run and at the end
    assert re.search(r"eval before: success 0\.0% \[0\.0, \d+\.\d\] \(Wilson 95% over episodes, 3 episodes, test split\)",
                     err), err
    assert re.search(r"held-out success \(Wilson 95% over episodes\): before 0\.0% \[0\.0, \d+\.\d\] \(3 episodes\) -> "
                     r"after 0\.0% \[0\.0, \d+\.\d\] \(3 episodes\)", res.stdout), res.stdout
    panels = _panels(out / "curves.png")
    reward = _lines(panels["training reward and success"])
    assert reward["success, every finished episode (unfiltered)"] == 2  # one point per step, filtered or not
    assert "reward, trained groups only (filtered groups left out)" not in reward  # nothing was trained
    assert panels["KL to the reference"]["note"] == "no reference model (loss.kl_coef = 0)"
    held = panels["held-out success"]
    assert held["errorbars"] == 1 and _lines(held) == {"success (95% interval)": 2}  # before and after


def test_sft_run_prints_each_step_and_plots_loss_and_held_out_interval(tiny_model: str, tmp_path: Path) -> None:
    from tiny_lookup import protocol_demos

    demos = protocol_demos(tmp_path / "demos.jsonl")
    out = tmp_path / "run"
    res = _train(f"""
[run]
algorithm = "sft"
out_dir = "{out}"
steps = 3
threads = 1
[model]
path = "{tiny_model}"
[data]
paths = ["{demos}"]
batch_size = 8
[optim]
lr = 1e-3
[rollout]
env = "agentgym/TinyLookup-v0"
imports = ["tiny_lookup"]
max_turns = 2
max_tokens = 6
[eval]
split = "test"
tasks = 2
seeds = [0, 1]
""", tmp_path)
    assert res.returncode == 0, res.stderr
    for k in (1, 2, 3):
        assert re.search(rf"step {k}/3: 1 optimizer step\(s\), loss \d", res.stderr), res.stderr
    assert "held-out success (" in res.stdout and "(4 episodes)" in res.stdout
    panels = _panels(out / "curves.png")
    assert _lines(panels["training loss"]) == {"loss": 3}
    assert _lines(panels["held-out success"]) == {"success (95% interval)": 2}
    assert "training reward and success" not in panels  # SFT has no rollouts to plot


def test_rl_panels_and_step_line_with_an_update(tmp_path: Path) -> None:
    rows = [{"step": s, "rollout/reward_mean": 0.5 + 0.1 * s, "rollout/success_rate": 0.5, "rollout_all/success_rate": 0.3,
             "train/loss": 0.1, "train/kl": 0.01 * s, "train/clip_frac": 0.02, "train/optimizer_steps": 1}
            for s in range(4)]
    rows.append({"step": 4, "eval/success": 0.5, "eval/success_lo": 0.3, "eval/success_hi": 0.7})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png")
    assert drawn is not None
    panels = {p["title"]: p for p in drawn[1]}
    assert panels == _panels(tmp_path / "curves.png")
    assert _lines(panels["training reward and success"]) == {
        "reward, trained groups only (filtered groups left out)": 4, "success, trained groups only": 4,
        "success, every finished episode (unfiltered)": 4}
    assert _lines(panels["KL to the reference"]) == {"k3 KL": 4}
    assert _lines(panels["clip fraction"]) == {"clipped share of trained tokens": 4}
    assert _lines(panels["training loss"]) == {"loss": 4}
    # multi-policy runs get one set of panels per policy
    multi = [{"step": 0, "solver/train/loss": 1.0, "verifier/train/loss": 2.0, "solver/rollout/reward_mean": 0.1,
              "verifier/rollout/reward_mean": 0.2}]
    titles = [p.title for p in curve_panels(multi)]
    assert "solver: training loss" in titles and "verifier: training reward and success" in titles
    rec = {"rollout": {"reward_mean": 0.75, "groups": 3},
           "train": {"optimizer_steps": 2, "loss": 0.125, "kl": 0.5, "clip_frac": 0.25, "lr": 1e-5}}
    delta = RolloutDelta(groups=4, episodes=16, successes=4, tokens=3000, wall_s=10.0,
                         outcomes={"policy": {"kept": 3, "filtered:zero_variance": 1}})
    line = step_line(3, 10, rec, delta)
    assert line == ("step 3/10: rollout 10 s: 4 groups finished (3 kept, 1 filtered: zero_variance 1), 16 episodes, "
                    "success 25.0%, 3,000 tokens generated in them (300 tok/s); 2 optimizer step(s), loss 0.125, reward 0.75 over 3 "
                    "trained groups, kl 0.5, clip 0.25, lr 1e-05")


async def test_rollout_progress_lines() -> None:
    """A line per interval while the batch is awaited, from the runtime's counters (here driven by hand: the
    batch arrives only after the second line was printed, so the test waits on events, not on time)."""
    import asyncio

    from agentgym.trainers.metrics import RolloutProgress

    counters = {"finished": 0, "episodes": 0, "successes": 0, "generated_tokens": 0, "outcomes": {"policy": {}}}
    lines: list[str] = []
    two = asyncio.Event()

    async def stats() -> dict[str, Any]:
        return {"groups": json.loads(json.dumps(counters)), "services": {"rollout-0": {"in_flight": 3}}}

    def note(line: str) -> None:
        lines.append(line)
        counters.update(finished=counters["finished"] + 1, episodes=counters["episodes"] + 4,
                        successes=counters["successes"] + 1, generated_tokens=counters["generated_tokens"] + 100)
        counters["outcomes"] = {"policy": {"kept": 1, "filtered:zero_variance": counters["finished"] - 1}}
        if len(lines) == 2:
            two.set()

    async def batch() -> str:
        await two.wait()
        return "the batch"

    result, delta = await asyncio.wait_for(RolloutProgress(stats, note, every_s=0.001).watch("step 4/9", batch()), 60)
    assert result == "the batch"
    assert re.fullmatch(r"step 4/9: rolling out for \d+ s: 0 groups finished \(0 kept, 0 filtered\), 0 episodes, "
                        r"success -, 0 tokens generated in them \(0 tok/s\); 3 groups in flight", lines[0])
    assert re.fullmatch(r"step 4/9: rolling out for \d+ s: 1 groups finished \(1 kept, 0 filtered\), 4 episodes, "
                        r"success 25\.0%, 100 tokens generated in them \([\d,]+ tok/s\); 3 groups in flight", lines[1])
    assert (delta.groups, delta.episodes, delta.successes, delta.tokens) == (2, 8, 2, 200)
    assert delta.filtered("policy") == {"zero_variance": 1} and delta.kept("policy") == 1
    assert RolloutProgress(stats, note, every_s=0) is not None


@pytest.mark.parametrize("skipped", ["no samples", None])
def test_step_line_says_plainly_when_nothing_was_trained(skipped: str | None) -> None:
    tr: dict[str, Any] = {"optimizer_steps": 0, "skipped_steps": 0 if skipped else 1}
    if skipped:
        tr["skipped"] = skipped
    line = step_line(1, 2, {"solver": {"train": tr}, "verifier": {"train": {"optimizer_steps": 1, "loss": 0.5}}})
    why = skipped or "every step had a non-finite loss or gradient"
    assert f"solver: NO UPDATE ({why}; the learning-rate schedule moves on)" in line
    assert "verifier: 1 optimizer step(s), loss 0.5" in line
