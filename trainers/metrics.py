"""Run logging: JSONL metrics (always), TensorBoard (optional), a rich progress line, PNG curves.

``OUT/metrics.jsonl`` gets one JSON object per step (nested dicts flattened to ``a/b`` keys), appended
and flushed, so it survives a crash and a resumed run keeps appending to the same curve.

``OUT/groups.jsonl`` (``log.groups``) gets one compact line per finished rollout group, kept or
filtered: members' actions, tool calls, per-turn tokens and rewards, and the gate records. It is
what an offline audit of a rollout-saving strategy needs (:func:`group_summary`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["GroupLog", "MetricsLogger", "flatten", "flow_counters", "gate_metrics", "group_summary", "plot_curves",
           "read_metrics"]


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
            "generated_tokens": g.get("generated_tokens", 0),
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
        keep = [r for r in read_metrics(self.path) if isinstance(r.get("step"), int) and r["step"] < start_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in keep))
        tmp.replace(self.path)

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


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` (a torn last line is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def plot_curves(metrics_path: str | Path, out_png: str | Path, keys: list[str] | None = None) -> Path | None:
    """Plot the curves of ``keys`` (default: reward, success, loss, KL/entropy) against the step.

    Returns the PNG path, or ``None`` if matplotlib is missing or there is nothing to plot.
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
    wanted = keys or [k for k in rows[-1] if k.endswith(("reward_mean", "success_rate", "/loss", "entropy",
                                                          "grad_norm", "eval/success"))]
    series = {k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
              for k in wanted}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    n = len(series)
    cols = min(3, n)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.2 * nrows), squeeze=False)
    for ax, (k, pts) in zip(axes.flat, series.items(), strict=False):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 40 else None)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
