"""Fakes for the dataflow tests: a coin-flip counter player with real weight versions."""

from __future__ import annotations

import asyncio
import os
import random
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout_fakes import SUBMIT, FakePolicy, counter_action, messages_of

from agentgym.dataflow.config import DataflowConfig, FlowParams
from agentgym.dataflow.service import LocalService, RolloutService
from agentgym.errors import VersionNotNewer
from agentgym.policy import Capabilities, Generation, GenRequest
from agentgym.rollout import MultiTurnWorkflow, RolloutLimits

ENV = "agentgym/TestCounter-v0"


def configs(**kw: Any) -> tuple[DataflowConfig, FlowParams]:
    """Keyword settings split into the ``[dataflow]`` table and the run's derived params."""
    params = {k: kw.pop(k) for k in list(kw) if k in FlowParams.model_fields}
    return DataflowConfig(**kw), FlowParams(**params)


class CoinPolicy(FakePolicy):
    """Plays the counter env, but submits too early with probability ``p_fail`` per episode
    (keyed by group and member, so the outcome does not depend on scheduling). Takes weight updates:
    each token carries the version current when it was generated; ``latency`` per call. ``hold``: a path;
    while it exists, every call waits (a service that keeps its work until a test kills it) and marks each
    group it holds with a file ``<hold>.<ticket>`` (see ``held_tickets``)."""

    capabilities = Capabilities(weight_updates=True)

    def __init__(self, policy_id: str = "policy", p_fail: float = 0.5, latency: float = 0.01,
                 shape: tuple[int, ...] | None = None, hold: str | None = None) -> None:
        self.policy_id = policy_id
        self.hold = hold
        self.p_fail = p_fail
        self.latency = latency
        self.weight_version = 0
        self.updates: list[int] = []
        self.state: dict[str, Any] | None = None
        if shape is not None:  # real tensors, updated by the policies' own apply code (names and shapes checked)
            import torch

            self.state = {"w": torch.zeros(shape)}

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        await asyncio.sleep(self.latency)
        while self.hold is not None and os.path.exists(self.hold):
            for r in requests:
                Path(f"{self.hold}.{str(r.metadata.get('group_id')).split('#')[0]}").touch()
            await asyncio.sleep(0.01)
        out = []
        for r in requests:
            key = f"{r.metadata.get('group_id')}|{r.metadata.get('member')}"
            fail = random.Random(zlib.crc32(key.encode())).random() < self.p_fail
            text = SUBMIT if fail else counter_action(messages_of(r))
            out.append(Generation(text=text, token_ids=[1, 2, 3], logprobs=[-0.1] * 3, weight_version=self.weight_version))
        return out

    def update_weights(self, update: Any, version: int) -> list[str]:
        if version <= self.weight_version:
            raise VersionNotNewer(f"version {version} not newer than {self.weight_version}")
        changed: list[str] = []
        if self.state is not None:
            from agentgym.policies.weights import apply_update

            changed = apply_update(self.state, update)
        self.weight_version = version
        self.updates.append(version)
        return changed


async def held_tickets(hold: Path, timeout: float = 120.0) -> list[str]:
    """Wait until some service holds a group at ``hold`` (the event itself, bounded); return those tickets:
    they cannot finish while the hold file exists."""
    deadline = time.monotonic() + timeout
    while not (marks := sorted(hold.parent.glob(hold.name + ".t*"))):
        assert time.monotonic() < deadline, f"no service held a group at {hold} in {timeout} s"
        await asyncio.sleep(0.01)
    return [m.name.rsplit(".", 1)[1] for m in marks]


def make_service(name: str, group_size: int = 4, max_groups: int = 4, p_fail: float = 0.5, latency: float = 0.01,
                 policy_id: str = "policy") -> LocalService:
    pol = CoinPolicy(policy_id, p_fail=p_fail, latency=latency)
    wf = MultiTurnWorkflow(pol, group_size=group_size, limits=RolloutLimits(max_turns=6))
    return LocalService(RolloutService(name, {"default": wf}, max_groups=max_groups, max_concurrency=16))


def coin_workflows(group_size: int = 4, p_fail: float = 0.5, latency: float = 0.01,
                   policy_id: str = "policy", shape: tuple[int, ...] | None = None,
                   hold: str | None = None) -> dict[str, MultiTurnWorkflow]:
    """A service's workflows (a picklable factory for ServiceSpec: it runs where the service runs)."""
    pol = CoinPolicy(policy_id, p_fail=p_fail, latency=latency, shape=shape, hold=hold)
    return {"default": MultiTurnWorkflow(pol, group_size=group_size, limits=RolloutLimits(max_turns=6))}


def hf_workflows(path: str, group_size: int = 2) -> dict[str, MultiTurnWorkflow]:
    """A service's workflows over a real HFPolicy (fp32) on ``path`` (built where the service runs)."""
    from agentgym.policies.hf import HFPolicy

    pol = HFPolicy(path, policy_id="policy", dtype="float32", max_batch_size=2)
    return {"default": MultiTurnWorkflow(pol, group_size=group_size, limits=RolloutLimits(max_turns=2))}
