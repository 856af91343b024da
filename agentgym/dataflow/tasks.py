"""The task stream: which task the dataflow layer submits next.

:class:`TaskStream` walks a pool of :class:`TaskRef` in a seeded order (a new permutation per epoch),
through two optional hooks:

* a curriculum, ``curriculum(task, stats) -> weight`` (0 skips the task this time; weights are
  relative sampling chances within an epoch); ``stats`` holds the task's recent group outcomes;
* a :class:`ZeroVarianceSkipper` (GRESO-style): a task whose last ``patience`` groups all had zero
  reward variance is skipped, except with probability ``explore`` (the exploration floor), so a
  skipped task comes back and can show that it became informative.

The stream's position and the skipper's memory are part of a training checkpoint
(:meth:`TaskStream.state_dict`).
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import ConfigurationError

__all__ = ["TaskRef", "TaskStats", "TaskStream", "ZeroVarianceSkipper"]


@dataclass(frozen=True)
class TaskRef:
    """A task the dataflow layer can submit: env, task id and env seed."""

    env_id: str
    task_id: str
    seed: int | None = 0
    info: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.env_id}|{self.task_id}|{self.seed}"


@dataclass
class TaskStats:
    """Recent outcomes of one task: zero-variance flags and mean rewards of its last groups."""

    zero_variance: deque[bool] = field(default_factory=lambda: deque(maxlen=16))
    mean_reward: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    skipped: int = 0
    submitted: int = 0


class ZeroVarianceSkipper:
    """Skip tasks whose recent groups were all zero-variance (GRESO), with an exploration floor.

    Args:
        patience: How many consecutive zero-variance groups make a task skippable.
        explore: Probability of submitting a skippable task anyway (the floor; 0 < explore <= 1).
    """

    def __init__(self, patience: int = 1, explore: float = 0.1) -> None:
        if patience < 1 or not 0 < explore <= 1:
            raise ConfigurationError("ZeroVarianceSkipper needs patience >= 1 and 0 < explore <= 1")
        self.patience = patience
        self.explore = explore

    def skippable(self, stats: TaskStats) -> bool:
        recent = list(stats.zero_variance)[-self.patience:]
        return len(recent) == self.patience and all(recent)

    def skip(self, stats: TaskStats, rng: random.Random) -> bool:
        """True if the task should be skipped this time."""
        return self.skippable(stats) and rng.random() >= self.explore


Curriculum = Callable[[TaskRef, TaskStats], float]


class TaskStream:
    """Seeded, epoch-based task sampling with a curriculum hook and zero-variance skipping.

    Args:
        tasks: The pool.
        seed: Seeds the order (each epoch is a new permutation) and the hooks' randomness.
        shuffle: Permute each epoch (else the pool order).
        curriculum: Optional ``(task, stats) -> weight``; 0 skips the task this time.
        skipper: Optional :class:`ZeroVarianceSkipper`.
        max_skips: Give up skipping after this many skips in a row (returns the task anyway), so a
            pool where everything is skippable still makes progress.
    """

    def __init__(self, tasks: Sequence[TaskRef], *, seed: int = 0, shuffle: bool = True,
                 curriculum: Curriculum | None = None, skipper: ZeroVarianceSkipper | None = None,
                 max_skips: int = 10_000) -> None:
        if not tasks:
            raise ConfigurationError("the task stream needs at least one task")
        self.tasks = list(tasks)
        self.seed = seed
        self.shuffle = shuffle
        self.curriculum = curriculum
        self.skipper = skipper
        self.max_skips = max_skips
        self.rng = random.Random(seed)
        self.epoch = 0
        self.pos = 0
        self.order = self._order()
        self.stats: dict[str, TaskStats] = defaultdict(TaskStats)
        self.skipped = 0  # total skips (both hooks)

    def _order(self) -> list[int]:
        idx = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(idx)
        return idx

    def _advance(self) -> TaskRef:
        if self.pos >= len(self.order):
            self.epoch += 1
            self.pos = 0
            self.order = self._order()
        t = self.tasks[self.order[self.pos]]
        self.pos += 1
        return t

    def next(self) -> TaskRef:
        """The next task to submit."""
        for _ in range(self.max_skips):
            t = self._advance()
            st = self.stats[t.key]
            if self.skipper is not None and self.skipper.skip(st, self.rng):
                st.skipped += 1
                self.skipped += 1
                continue
            if self.curriculum is not None:
                w = float(self.curriculum(t, st))
                if w <= 0 or (w < 1 and self.rng.random() >= w):
                    st.skipped += 1
                    self.skipped += 1
                    continue
            st.submitted += 1
            return t
        t = self._advance()
        self.stats[t.key].submitted += 1
        return t

    def feedback(self, task: TaskRef, zero_variance: bool, mean_reward: float) -> None:
        """Record a finished group's outcome for the hooks."""
        st = self.stats[task.key]
        st.zero_variance.append(bool(zero_variance))
        st.mean_reward.append(float(mean_reward))

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos, "rng": self.rng.getstate(), "skipped": self.skipped,
                "stats": {k: {"zero_variance": list(v.zero_variance), "mean_reward": list(v.mean_reward),
                              "skipped": v.skipped, "submitted": v.submitted} for k, v in self.stats.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.order = self._order()
        self.pos = int(state["pos"])
        rs = state["rng"]
        self.rng.setstate((rs[0], tuple(rs[1]), rs[2]) if isinstance(rs, list) else rs)
        self.skipped = int(state.get("skipped", 0))
        self.stats = defaultdict(TaskStats)
        for k, v in state.get("stats", {}).items():
            st = self.stats[k]
            st.zero_variance.extend(v["zero_variance"])
            st.mean_reward.extend(v["mean_reward"])
            st.skipped, st.submitted = int(v["skipped"]), int(v["submitted"])
