"""Group replay for one policy: which already-trained groups come back, and with what weight.

:class:`GroupReplay` keeps the *informative* groups a trainer has consumed (members got different
rewards; a zero-variance group has zero advantage, so replaying it would train nothing) together
with the weight version they were generated at, and hands some back on request. Two rules:

* ``priority="latest"``: the ``n`` most recently added groups, weight 1 (plain replay).
* ``priority="recency"`` (POPO-style prioritized group replay): group ``i`` of age
  ``a_i = version_now - version_i`` has priority ``q_i = 0.5 ** (a_i / half_life)`` and is drawn
  with probability ``P_i = q_i / sum(q)``, with replacement. Recent groups are less off-policy, so
  they come back more often. Prioritized sampling biases the batch towards recent tasks; each draw
  carries the importance-sampling weight ``w_i = (N * P_i) ** -beta / max_j (N * P_j) ** -beta``
  (``N`` groups in the buffer; Schaul et al.'s prioritized experience replay), which the trainer
  multiplies into that group's per-token loss weights. With ``beta = 1`` the weighted replay gradient
  equals, in expectation, that of uniform replay over the buffer (up to the constant ``max_j``
  normaliser, which keeps every weight in ``(0, 1]``); ``beta = 0`` leaves the bias uncorrected.

The weights correct *which groups* are replayed. That a replayed group's tokens were sampled by an
older policy is corrected token by token in the loss (truncated importance sampling against the
behaviour logprobs, ``loss.tis_cap``), as POPO's decoupled importance sampling does.

``max_age``: groups more than this many versions old are dropped (``None``: kept until the buffer's
``size`` pushes them out).

The buffer is part of a training checkpoint (:meth:`GroupReplay.state_dict`, through
:meth:`~agentgym.dataflow.flow.DataFlow.state_dict`), so a resumed run replays what the interrupted
one would have: the kept groups (gzip-compressed JSON, base64), their versions, the counters and the
draw RNG.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from agentgym.errors import ConfigurationError
from agentgym.types import TrajectoryGroup

__all__ = ["GroupReplay", "ReplayPriority"]

ReplayPriority = Literal["latest", "recency"]


@dataclass
class _Entry:
    group: TrajectoryGroup
    version: int


class GroupReplay:
    """Replay buffer of informative groups for one policy (see the module docstring).

    Args:
        policy_id: Whose rewards decide whether a group is informative.
        size: Most groups kept (oldest out first).
        priority: ``"latest"`` or ``"recency"``.
        half_life: Recency priority halves every ``half_life`` versions.
        beta: Importance-sampling exponent (0: no correction, 1: full).
        max_age: Drop groups more than this many versions old (``None``: keep).
        seed: Seeds the draws.
    """

    def __init__(self, policy_id: str = "policy", size: int = 256, *, priority: ReplayPriority = "latest",
                 half_life: float = 4.0, beta: float = 1.0, max_age: int | None = None, seed: int = 0) -> None:
        problems = []
        if size < 1:
            problems.append(f"replay size must be >= 1, got {size}")
        if priority not in ("latest", "recency"):
            problems.append(f"replay priority must be 'latest' or 'recency', got {priority!r}")
        if half_life <= 0:
            problems.append(f"replay half_life must be > 0, got {half_life}")
        if not 0 <= beta <= 1:
            problems.append(f"replay beta must be in [0, 1], got {beta}")
        if max_age is not None and max_age < 0:
            problems.append(f"replay max_age must be >= 0, got {max_age}")
        if problems:
            raise ConfigurationError("; ".join(problems))
        self.policy_id = policy_id
        self.priority: ReplayPriority = priority
        self.half_life = float(half_life)
        self.beta = float(beta)
        self.max_age = max_age
        self.rng = random.Random(seed)
        self.entries: deque[_Entry] = deque(maxlen=size)
        self.added = 0
        self.refused = 0  # zero-variance groups not kept

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, group: TrajectoryGroup, version: int) -> bool:
        """Keep ``group`` (generated at ``version``) if it is informative; returns whether it was kept."""
        if group.early_stopped or len(group) < 2 or group.zero_variance(self.policy_id):
            self.refused += 1
            return False
        self.entries.append(_Entry(group, int(version)))
        self.added += 1
        return True

    def evict(self, now: int) -> int:
        """Drop groups older than ``max_age`` versions; returns how many."""
        if self.max_age is None:
            return 0
        keep = deque((e for e in self.entries if now - e.version <= self.max_age), maxlen=self.entries.maxlen)
        n = len(self.entries) - len(keep)
        self.entries = keep
        return n

    def probabilities(self, now: int) -> list[float]:
        """``P_i`` of each kept group, oldest first (``"latest"``: uniform, for reference)."""
        if not self.entries:
            return []
        if self.priority == "latest":
            return [1.0 / len(self.entries)] * len(self.entries)
        q = [0.5 ** (max(0, now - e.version) / self.half_life) for e in self.entries]
        s = sum(q)
        return [x / s for x in q]

    def weights(self, now: int) -> list[float]:
        """The importance-sampling weight a draw of each group carries (``"latest"``: all 1)."""
        if self.priority == "latest" or not self.entries:
            return [1.0] * len(self.entries)
        n = len(self.entries)
        raw = [(n * p) ** -self.beta for p in self.probabilities(now)]
        top = max(raw)
        return [r / top for r in raw]

    def state_dict(self) -> dict[str, Any]:
        """The buffer's contents, counters and RNG, JSON-serialisable (groups as compressed JSON)."""
        rows = [{"version": e.version, "group": e.group.to_dict()} for e in self.entries]
        blob = gzip.compress(json.dumps(rows, separators=(",", ":")).encode(), compresslevel=6)
        version, internal, gauss = self.rng.getstate()
        return {"added": self.added, "refused": self.refused,
                "rng": [version, list(internal), gauss], "entries_gz_b64": base64.b64encode(blob).decode("ascii")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (the buffer's own ``size`` bounds what is kept)."""
        rows = json.loads(gzip.decompress(base64.b64decode(state["entries_gz_b64"])))
        self.entries = deque((_Entry(TrajectoryGroup.from_dict(r["group"]), int(r["version"])) for r in rows),
                             maxlen=self.entries.maxlen)
        self.added = int(state.get("added", len(self.entries)))
        self.refused = int(state.get("refused", 0))
        if state.get("rng") is not None:
            version, internal, gauss = state["rng"]
            self.rng.setstate((version, tuple(internal), gauss))

    def sample(self, n: int, now: int) -> list[tuple[TrajectoryGroup, float]]:
        """``n`` groups to replay at version ``now`` with their weights (fewer if the buffer is short
        under ``"latest"``; none if it is empty)."""
        self.evict(now)
        if n <= 0 or not self.entries:
            return []
        if self.priority == "latest":
            picked = list(self.entries)[::-1][:n]
            return [(e.group, 1.0) for e in picked]
        probs = self.probabilities(now)
        w = self.weights(now)
        idx = self.rng.choices(range(len(self.entries)), weights=probs, k=n)
        return [(self.entries[i].group, w[i]) for i in idx]
