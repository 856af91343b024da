"""Run logging: JSONL metrics (always), TensorBoard (optional), progress lines, PNG curves.

What a user sees while ``agentgym train`` runs (``[log] progress``, on stderr):

* while a step's rollouts run, a line every ``log.progress_every_s`` seconds (:class:`RolloutProgress`):
  groups and episodes finished, how many groups were kept and how many filtered and why, the success
  rate of every finished episode, and generated tokens per second;
* after every step, one line (:func:`step_line`): what was trained (loss, reward, KL, clip fraction)
  or, plainly, that the step made no update and why;
* every held-out evaluation with its interval.

``OUT/metrics.jsonl`` gets one JSON object per step (nested dicts flattened to ``a/b`` keys), appended
and flushed, so it survives a crash and a resumed run keeps appending to the same curve.

``OUT/groups.jsonl`` (``log.groups``) gets one compact line per finished rollout group, kept or
filtered: members' actions, tool calls, per-turn tokens and rewards, and the gate records. It is
what an offline audit of a rollout-saving strategy needs (:func:`group_summary`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["GroupLog", "MetricsLogger", "Panel", "RolloutDelta", "RolloutProgress", "curve_panels", "eval_line",
           "flatten", "flow_counters", "gate_metrics", "group_summary", "plot_curves", "read_metrics", "step_line"]

T = TypeVar("T")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def gate_metrics(counters: dict[str, float]) -> dict[str, Any]:
    """One gate's cumulative decision counters (``DataFlow.stats()["gates"][name]``) with the rates.

    * ``stop_rate``: stops / decisions.
    * ``precision``: of the audited stops, the share whose group really ended with zero reward
      variance; ``recall``: of the audited zero-variance groups, the share the gate stopped (audit
      mode runs every group to the end, so both are known; enforced stops have no final outcome).
    * ``stop_token_share``: tokens the stopped groups had generated at the decision over their final
      tokens (audit: ``1 - stop_token_share`` is what enforcing the stops would have saved of them).
    ``None`` where a rate is undefined (nothing audited yet)."""
    c = {k: float(v) for k, v in counters.items()}
    return {
        **c,
        "stop_rate": _ratio(c.get("stops", 0.0), c.get("decisions", 0.0)),
        "precision": _ratio(c.get("audited_correct_stops", 0.0), c.get("audited_stops", 0.0)),
        "recall": _ratio(c.get("audited_correct_stops", 0.0), c.get("audited_zero_variance", 0.0)),
        "stop_token_share": _ratio(c.get("stop_tokens_at_decision", 0.0), c.get("stop_final_tokens", 0.0)),
    }


def flow_counters(stats: dict[str, Any]) -> dict[str, Any]:
    """The cumulative rollout counters of a dataflow ``stats()`` (for each step's metrics), with each
    gate's precision and recall (:func:`gate_metrics`)."""
    g = stats.get("groups") or {}
    return {"groups_finished": g.get("finished", 0), "episodes_finished": g.get("episodes", 0),
            "episodes_succeeded": g.get("successes", 0), "generated_tokens": g.get("generated_tokens", 0),
            "tasks_skipped": (stats.get("task_stream") or {}).get("skipped", 0),
            "outcomes": g.get("outcomes", {}),
            "gates": {name: gate_metrics(c) for name, c in (stats.get("gates") or {}).items()}}


def group_summary(group: Any) -> dict[str, Any]:
    """A compact, JSON-ready record of one finished :class:`~agentgym.types.TrajectoryGroup`."""
    from agentgym.rollout.gates import canonical_calls

    return {
        "group_id": group.group_id, "task_id": group.task_id, "env_id": group.env_id,
        "early_stopped": group.early_stopped, "stop_reason": group.stop_reason,
        "rewards": [t.reward for t in group], "success": [bool(t.success) for t in group],
        "errors": [t.error for t in group], "truncated": [bool(t.truncated) for t in group],
        "members": [t.member for t in group],
        "actions": [list(t.info.get("actions", [])) for t in group],
        "calls": [[canonical_calls(tu.tool_calls) for tu in t.turns] for t in group],
        "turn_tokens": [[len(tu.completion_token_ids) for tu in t.turns] for t in group],
        "gate_records": [{k: r.get(k) for k in ("gate", "action", "reason", "score", "step", "enforced",
                                                 "tokens_at_decision", "final_zero_variance", "final_tokens")}
                         for r in group.gate_records],
    }


class GroupLog:
    """A dataflow group observer that appends :func:`group_summary` lines to a JSONL file.

    Args:
        path: The file (appended to, flushed per line).
        owner: Anything with ``step`` and ``version`` attributes (the recipe), recorded on each line.
    """

    def __init__(self, path: str | Path, owner: Any = None) -> None:
        self.path = Path(path)
        self.owner = owner

    def resume_at(self, start_step: int) -> None:
        """A resumed run redoes the steps from ``start_step`` on: drop the lines an interrupted attempt wrote for
        them (its groups finished before the step's update, which the checkpoint does not hold), and a torn line,
        so each step's groups appear once."""
        if start_step > 0 and self.path.exists():
            _keep_steps_before(self.path, start_step)

    def __call__(self, group: Any, outcome: dict[str, str | None]) -> None:
        rec = group_summary(group)
        rec["outcome"] = outcome
        if self.owner is not None:
            rec["step"] = getattr(self.owner, "step", None)
            rec["version"] = getattr(self.owner, "version", None)
        with self.path.open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


@dataclass
class RolloutDelta:
    """What the rollout services finished between two dataflow ``stats()`` snapshots (one step's window).

    Every finished group counts, kept or filtered, so :attr:`success_rate` is the unfiltered success
    rate (the trained reward only averages the groups that survived the filters).
    """

    groups: int = 0
    episodes: int = 0
    successes: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)  # policy -> {"kept" | "filtered:why": groups}

    @classmethod
    def between(cls, a: Mapping[str, Any], b: Mapping[str, Any], wall_s: float) -> RolloutDelta:
        ga, gb = a.get("groups") or {}, b.get("groups") or {}

        def d(k: str) -> int:
            return int(gb.get(k, 0) or 0) - int(ga.get(k, 0) or 0)

        oa, ob = ga.get("outcomes") or {}, gb.get("outcomes") or {}
        outcomes = {p: {k: n - int((oa.get(p) or {}).get(k, 0)) for k, n in (ob.get(p) or {}).items()} for p in ob}
        outcomes = {p: {k: n for k, n in o.items() if n} for p, o in outcomes.items()}
        return cls(d("finished"), d("episodes"), d("successes"), d("generated_tokens"), wall_s, outcomes)

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.episodes if self.episodes else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.wall_s if self.wall_s > 0 else None

    def filtered(self, policy: str) -> dict[str, int]:
        """``{reason: groups}`` this policy's filters dropped."""
        return {k.split(":", 1)[1]: n for k, n in self.outcomes.get(policy, {}).items() if k.startswith("filtered:")}

    def kept(self, policy: str) -> int:
        return self.outcomes.get(policy, {}).get("kept", 0)

    def describe(self) -> str:
        """``"5 groups finished (3 kept, 2 filtered: zero_variance 2), 40 episodes, success 30.0%, 2,100 tokens
        generated in them (95 tok/s)"``: tokens count when their group finishes."""
        parts = []
        policies = sorted(self.outcomes)
        for p in policies or [""]:
            f = self.filtered(p)
            why = ", ".join(f"{k} {n}" for k, n in sorted(f.items()))
            who = f"{p}: " if len(policies) > 1 else ""
            parts.append(f"{who}{self.kept(p)} kept, {sum(f.values())} filtered" + (f": {why}" if why else ""))
        sr = self.success_rate
        tps = self.tokens_per_s
        return (f"{self.groups} groups finished ({'; '.join(parts)}), {self.episodes} episodes, "
                f"success {'-' if sr is None else f'{100 * sr:.1f}%'}, {self.tokens:,} tokens generated in them"
                f"{'' if tps is None else f' ({tps:,.0f} tok/s)'}")

    def to_metrics(self) -> dict[str, Any]:
        return {"groups": self.groups, "episodes": self.episodes, "success_rate": self.success_rate,
                "generated_tokens": self.tokens, "tokens_per_s": self.tokens_per_s}


class RolloutProgress:
    """Progress lines while a trainer waits for its batch (the rollouts of a step).

    Args:
        stats: The dataflow runtime's ``stats()`` (works the same embedded or on Ray).
        note: Prints one line (``MetricsLogger.note``).
        every_s: Seconds between lines (``0``: none; the step's summary line still comes).
    """

    def __init__(self, stats: Callable[[], Awaitable[dict[str, Any]]], note: Callable[[str], None],
                 every_s: float = 10.0) -> None:
        self.stats = stats
        self.note = note
        self.every_s = every_s

    async def watch(self, label: str, work: Awaitable[T]) -> tuple[T, RolloutDelta]:
        """Await ``work`` (the batch), printing ``label: <progress>`` every ``every_s`` seconds meanwhile;
        returns its result and what the services finished in the meantime."""
        start = await self.stats()
        t0 = time.monotonic()
        task = asyncio.ensure_future(work)
        try:
            while self.every_s > 0:
                done, _ = await asyncio.wait({task}, timeout=self.every_s)
                if done:
                    break
                now = await self.stats()
                delta = RolloutDelta.between(start, now, time.monotonic() - t0)
                busy = sum(s.get("in_flight", 0) for s in (now.get("services") or {}).values())
                self.note(f"{label}: rolling out for {delta.wall_s:.0f} s: {delta.describe()}; "
                          f"{busy} groups in flight")
            result = await task
        finally:
            if not task.done():
                task.cancel()
        return result, RolloutDelta.between(start, await self.stats(), time.monotonic() - t0)


def _fmt(v: Any, spec: str = ".3g") -> str:
    return "-" if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, spec)


def step_line(step: int, total: int, rec: Mapping[str, Any], delta: RolloutDelta | None = None) -> str:
    """One line per step: what was trained, or plainly that nothing was and why.

    ``rec`` is the step's (nested) metrics; multi-policy records hold one sub-dict per policy.
    """
    head = f"step {step}/{total}"
    per = {p: v for p, v in rec.items() if isinstance(v, dict) and "train" in v}
    if "train" in rec:
        per = {"": dict(rec)}
    bits = []
    if delta is not None:
        bits.append(f"rollout {delta.wall_s:.0f} s: {delta.describe()}")
    for pid, m in per.items():
        who = f"{pid}: " if pid else ""
        tr = m.get("train") or {}
        ro = m.get("rollout") or {}
        if tr.get("optimizer_steps", 0) == 0:
            why = tr.get("skip_reason") or tr.get("skipped") or (
                "every step had a non-finite loss or gradient" if tr.get("skipped_steps") else "no trainable tokens")
            bits.append(f"{who}NO UPDATE ({why}; the learning-rate schedule moves on)")
            continue
        parts = [f"{tr['optimizer_steps']} optimizer step(s)", f"loss {_fmt(tr.get('loss'))}"]
        if ro:
            parts.append(f"reward {_fmt(ro.get('reward_mean'))} over {ro.get('groups', '-')} trained groups")
        if tr.get("kl") is not None:
            parts.append(f"kl {_fmt(tr.get('kl'))}")
        if tr.get("clip_frac") is not None:
            parts.append(f"clip {_fmt(tr.get('clip_frac'))}")
        parts.append(f"lr {_fmt(tr.get('lr'))}")
        bits.append(who + ", ".join(parts))
    return f"{head}: " + "; ".join(bits)


def eval_line(stage: str, res: Mapping[str, Any]) -> str:
    """``eval after: success 68.8% [44.4, 85.8] (Wilson 95%, 16 episodes, test split)``."""
    s, iv = res.get("success"), res.get("success_interval")
    txt = "-" if s is None else f"{100 * s:.1f}%"
    if iv:
        txt += f" [{100 * iv[0]:.1f}, {100 * iv[1]:.1f}]"
    return (f"eval {stage}: success {txt} ({res.get('interval_kind') or 'no interval'}, {res.get('episodes')} "
            f"episodes, {res.get('split')} split)")


class MetricsLogger:
    """Writes ``metrics.jsonl``, optionally TensorBoard scalars, and drives a rich progress bar.

    Args:
        out_dir: Run folder.
        total_steps: For the progress bar.
        tensorboard: Also write TensorBoard event files to ``OUT/tensorboard`` (needs ``tensorboard``).
        progress: Show a rich progress bar (off when not a terminal).
        start_step: The step a resumed run continues from; records of later steps (lost with the
            crash, redone now) are dropped from ``metrics.jsonl``.
    """

    def __init__(self, out_dir: str | Path, total_steps: int, *, tensorboard: bool = False, progress: bool = True,
                 start_step: int = 0) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "metrics.jsonl"
        if start_step > 0 and self.path.exists():
            self._drop_lost_steps(start_step)
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                from agentgym.errors import DependencyNotInstalled

                raise DependencyNotInstalled("log.tensorboard", "tensorboard") from e
            self._tb = SummaryWriter(str(self.out / "tensorboard"))
        self._progress: Any = None
        self._task: Any = None
        if progress:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            console = Console(stderr=True)
            if console.is_terminal:
                self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                          TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console)
                self._task = self._progress.add_task("train", total=total_steps, completed=start_step, info="")
                self._progress.start()

    def _drop_lost_steps(self, start_step: int) -> None:
        """A resumed run redoes the steps after its checkpoint: drop their records (and a torn line)
        so the curve has each step once."""
        _keep_steps_before(self.path, start_step)

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        flat = {"step": step, **{k: _clean(v) for k, v in flatten(metrics).items()}}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(flat, default=str) + "\n")
            fh.flush()
        if self._tb is not None:
            for k, v in flat.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._progress is not None:
            bits = [f"{k.split('/')[-1]}={flat[k]:.3g}" for k in flat
                    if k.endswith(("reward_mean", "success_rate")) and isinstance(flat[k], (int, float))]
            self._progress.update(self._task, completed=step + 1, info=" ".join(bits[:4]))
        return flat

    def note(self, message: str) -> None:
        """A line above the progress bar (or on stderr)."""
        if self._progress is not None:
            self._progress.console.print(message, highlight=False)
        else:
            import sys

            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _keep_steps_before(path: Path, start_step: int) -> None:
    """Rewrite a JSONL log keeping the records of steps before ``start_step`` (atomically; torn lines dropped)."""
    keep = [r for r in read_metrics(path) if isinstance(r.get("step"), int) and r["step"] < start_step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in keep))
    tmp.replace(path)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` (a torn last line is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


@dataclass
class Panel:
    """One panel of ``curves.png``: a title, and the metric keys drawn in it with their legend labels.

    ``interval``: ``(lo_key, hi_key)`` drawn as error bars around the first series. ``empty_note``: what
    the panel says when none of its series has data (e.g. no KL term configured)."""

    title: str
    series: list[tuple[str, str]]
    interval: tuple[str, str] | None = None
    empty_note: str | None = None


def _prefixes(keys: set[str]) -> list[str]:
    """Per-policy key prefixes of a multi-policy run (``"solver/"``...), or ``[""]``."""
    pre = sorted({k[: -len("train/loss")] for k in keys if k.endswith("/train/loss") and k.count("/") == 2})
    return pre or [""]


def curve_panels(rows: list[dict[str, Any]]) -> list[Panel]:
    """The panels of a run's curves: SFT gets the training loss; RL the reward of the trained groups beside
    the success rate of every finished episode (filtered or not), the loss, the KL to the reference and the
    clip fraction; both get the held-out success with its interval."""
    keys = {k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    rl = any(k.startswith("rollout") or "/rollout/" in k for r in rows for k in r)
    panels: list[Panel] = []
    for pre in _prefixes(keys):
        who = pre.rstrip("/") + ": " if pre else ""
        if rl:
            panels.append(Panel(f"{who}training reward and success", [
                (f"{pre}rollout/reward_mean", "reward, trained groups only (filtered groups left out)"),
                (f"{pre}rollout/success_rate", "success, trained groups only"),
                ("rollout_all/success_rate", "success, every finished episode (unfiltered)")]))
        panels.append(Panel(f"{who}training loss", [(f"{pre}train/loss", "loss")]))
        if rl:
            panels.append(Panel(f"{who}KL to the reference", [(f"{pre}train/kl", "k3 KL")],
                                empty_note="no reference model (loss.kl_coef = 0)"))
            panels.append(Panel(f"{who}clip fraction", [(f"{pre}train/clip_frac", "clipped share of trained tokens")]))
    panels.append(Panel("held-out success", [("eval/success", "success")],
                        interval=("eval/success_lo", "eval/success_hi"), empty_note="no held-out evaluation"))
    return panels


def plot_curves(metrics_path: str | Path, out_png: str | Path) -> tuple[Path, list[dict[str, Any]]] | None:
    """Draw :func:`curve_panels` of a ``metrics.jsonl`` against the step.

    Returns the PNG path and what was drawn, read back from the figure's axes (per panel: its title, the
    legend label and point count of every line, and the error bars), which is also stored in the PNG's
    ``agentgym:panels`` text chunk. ``None`` if matplotlib is missing or there is nothing to plot.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = read_metrics(metrics_path)
    if not rows:
        return None

    def pts(key: str) -> list[tuple[int, float]]:
        return [(r["step"], float(r[key])) for r in rows
                if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]

    panels = [p for p in curve_panels(rows) if any(pts(k) for k, _ in p.series) or p.empty_note]
    if not panels:
        return None
    cols = min(3, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.8 * cols, 3.4 * nrows), squeeze=False)
    drawn: list[dict[str, Any]] = []
    for ax, panel in zip(axes.flat, panels, strict=False):
        for i, (key, label) in enumerate(panel.series):
            xy = pts(key)
            if not xy:
                continue
            xs, ys = [p[0] for p in xy], [p[1] for p in xy]
            marker = "." if len(xy) < 40 else None
            if i == 0 and panel.interval is not None:
                lo, hi = dict(pts(panel.interval[0])), dict(pts(panel.interval[1]))
                err = [[y - lo.get(x, y) for x, y in xy], [hi.get(x, y) - y for x, y in xy]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{label} (95% interval)")
            else:
                ax.plot(xs, ys, marker=marker, label=label, linestyle="--" if "trained groups only" in label and
                        "success" in label else "-")
        if not ax.get_lines() and panel.empty_note:
            ax.text(0.5, 0.5, panel.empty_note, ha="center", va="center", transform=ax.transAxes, fontsize=8)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=6)
        lines = [{"label": ln.get_label(), "points": len(ln.get_xdata())} for ln in ax.get_lines()
                 if not str(ln.get_label()).startswith("_")]
        lines += [{"label": c.get_label(), "points": len(c[0].get_xdata())} for c in ax.containers]  # error bars
        drawn.append({"title": ax.get_title(), "lines": lines, "errorbars": len(ax.containers),
                      "note": panel.empty_note if not ax.get_lines() else None})
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"agentgym:panels": json.dumps(drawn)})
    plt.close(fig)
    return out, drawn
