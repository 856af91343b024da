"""``agentgym report``: compare eval runs side by side (Markdown + PNG plots).

Each run is an ``agentgym eval`` output directory (``summary.json`` + ``episodes.jsonl``). The
report has success by env (with 95% CIs: a bootstrap over tasks, or Wilson), success by task type, and success by number
of turns (the share of episodes solved within t turns), as Markdown tables and matplotlib PNGs
(Agg backend, no display needed).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigurationError
from agentgym.eval.runner import EPISODES_FILE, SUMMARY_FILE, load_episodes
from agentgym.types import Trajectory

__all__ = ["Run", "load_run", "render_markdown", "write_report"]


@dataclass
class Run:
    """One eval run loaded from disk."""

    name: str
    path: Path
    summary: dict[str, Any]
    episodes: list[Trajectory] = field(default_factory=list)

    @property
    def policy(self) -> str:
        pol = self.summary.get("protocol", {}).get("policy", {})
        return str(pol.get("spec") or pol.get("policy_id") or "?")

    @property
    def envs(self) -> list[str]:
        return list(self.summary.get("envs", {}))


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Load ``path/summary.json`` and ``path/episodes.jsonl``; clear errors if they are missing."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigurationError(f"{p} is not a directory; pass the --out directory of an `agentgym eval` run.")
    sp = p / SUMMARY_FILE
    if not sp.exists():
        raise ConfigurationError(f"{p} has no {SUMMARY_FILE}; is it an `agentgym eval` output directory?")
    try:
        summary = json.loads(sp.read_text())
    except json.JSONDecodeError as e:
        raise ConfigurationError(f"{sp} is not valid JSON ({e}).") from None
    keys = None
    if (p / EPISODES_FILE).exists():
        eps = list(load_episodes(p).values())
        proto = summary.get("protocol", {})
        ids = {e: set(v.get("task_ids", [])) for e, v in proto.get("envs", {}).items()}
        keys = [t for t in eps if not ids or t.task_id in ids.get(t.env_id, set())]
    return Run(name or p.name, p, summary, keys or [])


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _succ_cell(block: dict[str, Any] | None) -> str:
    if not block:
        return "–"
    s = block.get("success", {})
    m, ci = s.get("mean"), s.get("ci95")
    if m is None:
        return "–"
    if ci:
        return f"{_pct(m)} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return _pct(m)


def _unique_names(runs: list[Run]) -> None:
    seen: dict[str, int] = defaultdict(int)
    for r in runs:
        seen[r.name] += 1
    for r in runs:
        if seen[r.name] > 1:
            r.name = str(r.path)


def _turn_curve(eps: list[Trajectory], max_t: int) -> list[float]:
    """Share of episodes solved within t turns, t = 1..max_t."""
    n = len(eps)
    if not n:
        return [0.0] * max_t
    return [sum(1 for e in eps if e.success and e.num_turns <= t) / n for t in range(1, max_t + 1)]


def render_markdown(runs: list[Run], images: dict[str, str] | None = None) -> str:
    """The report as Markdown (``images``: title -> relative PNG path, embedded where given)."""
    lines = ["# AgentGym evaluation report", ""]
    lines += ["## Runs", "", "| run | policy | split | seeds | samples | episodes | complete |",
              "|---|---|---|---|---|---|---|"]
    for r in runs:
        p = r.summary.get("protocol", {})
        lines.append(f"| {r.name} | `{r.policy}` | {p.get('split', '?')} | {p.get('seeds', '?')} | "
                     f"{p.get('samples', '?')} | {r.summary.get('finished_episodes', '?')} | "
                     f"{r.summary.get('complete', '?')} |")
    envs = sorted({e for r in runs for e in r.envs})
    lines += ["", "## Success by env", "", "Success rate [95% CI: bootstrap over tasks, or Wilson where every task scores the same].",
              "", "| env | " + " | ".join(r.name for r in runs) + " |", "|---|" + "---|" * len(runs)]
    for e in envs:
        lines.append(f"| {e} | " + " | ".join(_succ_cell(r.summary["envs"].get(e)) for r in runs) + " |")
    lines.append("| **overall** | " + " | ".join(_succ_cell(r.summary.get("overall")) for r in runs) + " |")
    if images and "env" in images:
        lines += ["", f"![success by env]({images['env']})"]
    lines += ["", "## Success by task type", "", "| env | task type | " + " | ".join(r.name for r in runs) + " |",
              "|---|---|" + "---|" * len(runs)]
    for e in envs:
        types = sorted({t for r in runs for t in r.summary["envs"].get(e, {}).get("by_task_type", {})})
        for tt in types:
            cells = []
            for r in runs:
                b = r.summary["envs"].get(e, {}).get("by_task_type", {}).get(tt)
                cells.append(f"{_pct(b['success'])} (n={b['episodes']})" if b else "–")
            lines.append(f"| {e} | {tt} | " + " | ".join(cells) + " |")
    if images and "task_type" in images:
        lines += ["", f"![success by task type]({images['task_type']})"]
    lines += ["", "## Success by number of turns", "",
              "Share of all episodes solved within t turns (cumulative), and mean turns used.", ""]
    max_t = max((e.num_turns for r in runs for e in r.episodes), default=0)
    cols = [t for t in (1, 2, 3, 5, 10, 20, 30, 50) if t <= max(max_t, 1)]
    lines += ["| env | run | mean turns | " + " | ".join(f"≤{t}" for t in cols) + " |",
              "|---|---|---|" + "---|" * len(cols)]
    for e in envs:
        for r in runs:
            eps = [x for x in r.episodes if x.env_id == e]
            if not eps:
                continue
            curve = _turn_curve(eps, max(cols))
            mt = sum(x.num_turns for x in eps) / len(eps)
            lines.append(f"| {e} | {r.name} | {mt:.1f} | " + " | ".join(_pct(curve[t - 1]) for t in cols) + " |")
    if images and "turns" in images:
        lines += ["", f"![success by turns]({images['turns']})"]
    lines.append("")
    return "\n".join(lines)



def _finish_bars(plt: Any, fig: Any, ax: Any, labels: list[str], n_runs: int, width: float, title: str,
                 path: Path, rotation: int, fontsize: int | None = None) -> None:
    """Label a grouped success-% bar chart (one bar per run at each label) and save it."""
    ax.set_xticks([j + width * (n_runs - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=rotation, ha="right", fontsize=fontsize)
    ax.set_ylabel("success (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

def _plots(runs: list[Run], out: Path) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    images: dict[str, str] = {}
    envs = sorted({e for r in runs for e in r.envs})
    width = 0.8 / max(1, len(runs))

    # success by env, with CI error bars
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(envs) + 2), 4))
    for i, r in enumerate(runs):
        xs, ys, lo, hi = [], [], [], []
        for j, e in enumerate(envs):
            s = r.summary["envs"].get(e, {}).get("success", {})
            if s.get("mean") is None:
                continue
            xs.append(j + i * width)
            ys.append(100 * s["mean"])
            ci = s.get("ci95") or [s["mean"], s["mean"]]
            lo.append(100 * (s["mean"] - ci[0]))
            hi.append(100 * (ci[1] - s["mean"]))
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=r.name)
    _finish_bars(plt, fig, ax, [e.replace("agentgym/", "") for e in envs], len(runs), width,
                 "Success by env (95% CI, bootstrap over tasks)", out / "success_by_env.png", rotation=20)
    images["env"] = "success_by_env.png"

    # success by task type
    labels = sorted({(e, tt) for r in runs for e in envs for tt in r.summary["envs"].get(e, {}).get("by_task_type", {})})
    if labels:
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) + 2), 4))
        for i, r in enumerate(runs):
            xs, ys = [], []
            for j, (e, tt) in enumerate(labels):
                b = r.summary["envs"].get(e, {}).get("by_task_type", {}).get(tt)
                if b:
                    xs.append(j + i * width)
                    ys.append(100 * b["success"])
            ax.bar(xs, ys, width, label=r.name)
        _finish_bars(plt, fig, ax, [f"{e.replace('agentgym/', '')}\n{tt}" for e, tt in labels], len(runs), width,
                     "Success by task type", out / "success_by_task_type.png", rotation=30, fontsize=7)
        images["task_type"] = "success_by_task_type.png"

    # cumulative success by number of turns
    max_t = max((e.num_turns for r in runs for e in r.episodes), default=0)
    if max_t:
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in runs:
            for e in envs:
                eps = [x for x in r.episodes if x.env_id == e]
                if eps:
                    curve = _turn_curve(eps, max_t)
                    label = f"{r.name} · {e.replace('agentgym/', '')}"
                    ax.plot(range(1, max_t + 1), [100 * c for c in curve], marker=".", label=label)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("turns")
        ax.set_ylabel("solved within t turns (%)")
        ax.set_ylim(0, 105)
        ax.set_title("Success by number of turns")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "success_by_turns.png", dpi=110)
        plt.close(fig)
        images["turns"] = "success_by_turns.png"
    return images


def write_report(run_dirs: list[str | Path], out: str | Path, plots: bool = True) -> Path:
    """Compare runs; writes ``out/report.md`` (and PNGs). Returns the Markdown path."""
    if not run_dirs:
        raise ConfigurationError("give at least one eval output directory to report on.")
    runs = [load_run(d) for d in run_dirs]
    _unique_names(runs)
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    images = _plots(runs, outp) if plots else {}
    md = render_markdown(runs, images)
    path = outp / "report.md"
    path.write_text(md)
    return path
