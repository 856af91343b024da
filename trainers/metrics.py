"""Run logging: JSONL metrics (always), TensorBoard (optional), a rich progress line, PNG curves.

``OUT/metrics.jsonl`` gets one JSON object per step (nested dicts flattened to ``a/b`` keys), appended
and flushed, so it survives a crash and a resumed run keeps appending to the same curve.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "flatten", "plot_curves", "read_metrics"]


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
    """

    def __init__(self, out_dir: str | Path, total_steps: int, *, tensorboard: bool = False, progress: bool = True,
                 start_step: int = 0) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "metrics.jsonl"
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
