"""The one publishing path across a real process boundary: WeightPublisher -> RayRuntime.publish ->
a rollout service actor holding an HFPolicy on SmolLM2 (fp32), with a local Ray started here and stopped after.

The update crosses into the actor signed (HMAC with the runtime's key); the actor verifies it before the
policy sees it, so a payload signed with another key, or an unsigned object, is refused there. The sync
sends bf16 (full, then sparse deltas), so this also checks that an fp32 receiver takes bf16 deltas.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_helpers import own_ray

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    if ray.is_initialized():
        pytest.skip("a Ray runtime is already up in this process")
    with own_ray([TESTS / "dataflow", TESTS / "rollout"], configure_logging=False) as r:
        yield r


async def test_publish_to_a_policy_in_a_ray_service_actor(local_ray: Any) -> None:
    from agentgym.policies.models import resolve_model
    from dataflow_fakes import ENV, hf_workflows
    from safetensors.torch import load_file

    from agentgym.dataflow.config import DataflowConfig, FlowParams
    from agentgym.dataflow.ray_runtime import RayRuntime
    from agentgym.dataflow.spec import ServiceSpec
    from agentgym.dataflow.tasks import TaskRef, TaskStream
    from agentgym.errors import UpdateNotAuthenticated, WeightUpdateRejected
    from agentgym.weights import WeightPublisher, WeightUpdate, crc32, encode

    path = resolve_model("smollm2-135m-instruct")
    base = load_file(f"{path}/model.safetensors")  # bf16, as the publisher sends
    moved = ["model.norm.weight", *(n for n in base if n.startswith("model.layers.3."))]
    step = dict(base)
    g = torch.Generator().manual_seed(0)
    for name in moved:
        t = base[name].clone()
        i = torch.randint(0, t.numel(), (max(1, t.numel() // 50),), generator=g)
        t.view(-1)[i] = (t.view(-1)[i].float() * 3.0 + 0.05).to(t.dtype)
        step[name] = t

    rt = RayRuntime(TaskStream([TaskRef(ENV, "ok-1", seed=0)]), DataflowConfig(), FlowParams(groups_per_step=1),
                    weights_key=b"the runtime's key")
    try:
        await rt.add_service(ServiceSpec("hf", functools.partial(hf_workflows, path)))  # no start(): no rollouts

        async def served(names: list[str]) -> dict[str, int]:
            out: dict[str, int] = await rt.actors["hf"].weight_checksums.remote("policy", names)
            return out

        pub = WeightPublisher("bfloat16")
        p1 = pub.publish(base, 1)
        assert p1.update.kind == "full" and await rt.publish("policy", p1) == {"hf": "ok"}
        p2 = pub.publish(step, 2)
        assert p2.update.kind == "delta" and p2.report is not None and p2.report.bytes_sent * 50 < p2.report.bytes_full
        assert sorted(p2.update.names()) == sorted(moved)
        assert await rt.publish("policy", p2) == {"hf": "ok"}
        # the actor's fp32 weights hold exactly the bf16 values sent
        assert await served(moved) == {n: crc32(step[n].float()) for n in moved}
        # the Ray hop takes only payloads signed with the runtime's key
        forged = encode(WeightUpdate.full({"model.norm.weight": torch.zeros(576)}), 3, b"another key")
        with pytest.raises(ray.exceptions.RayTaskError) as e:
            await rt.actors["hf"].update_weights.remote("policy", forged, 3)
        assert isinstance(e.value.cause, UpdateNotAuthenticated)
        with pytest.raises(ray.exceptions.RayTaskError) as e:
            await rt.actors["hf"].update_weights.remote("policy", WeightUpdate.full({}), 3)
        assert isinstance(e.value.cause, WeightUpdateRejected)
        assert await served(["model.norm.weight"]) == {"model.norm.weight": crc32(step["model.norm.weight"].float())}
        p3 = pub.publish(base, 3)  # back, as a delta again
        assert p3.update.kind == "delta" and await rt.publish("policy", p3) == {"hf": "ok"}
        assert await served(moved) == {n: crc32(base[n].float()) for n in moved}
        assert (await rt.stats())["versions"]["policy"] == 3
    finally:
        await asyncio.wait_for(rt.stop(), 120)
