"""WeightSync to a real policy inside a real Ray actor (a local Ray started here and stopped after).

The actor holds an HFPolicy on SmolLM2 in fp32; the sync sends bf16 (full, then sparse deltas),
so this also checks that an fp32 receiver takes bf16 deltas as deltas.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    if ray.is_initialized():
        pytest.skip("a Ray runtime is already up in this process")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_publish_to_a_policy_in_a_ray_actor(local_ray: Any) -> None:
    from agentgym.policies.hf import HFPolicy
    from agentgym.policies.models import resolve_model
    from safetensors.torch import load_file

    from agentgym.dataflow.weightsync import PolicyActor, RayPolicyTarget, WeightSync, crc32_of
    from agentgym.policy import GenRequest, SamplingParams

    path = resolve_model("smollm2-135m-instruct")
    base = load_file(f"{path}/model.safetensors")  # bf16, as the sync sends
    moved = ["model.norm.weight", *(n for n in base if n.startswith("model.layers.3."))]
    step = dict(base)
    g = torch.Generator().manual_seed(0)
    for name in moved:
        t = base[name].clone()
        i = torch.randint(0, t.numel(), (max(1, t.numel() // 50),), generator=g)
        t.view(-1)[i] = (t.view(-1)[i].float() * 3.0 + 0.05).to(t.dtype)
        step[name] = t

    actor = ray.remote(PolicyActor).options(num_cpus=1).remote(HFPolicy, path, dtype="float32", max_batch_size=2)
    target = RayPolicyTarget(actor, timeout_s=300)
    assert not target.supports_lora
    names = target.names()
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: one tensor
    req = [GenRequest(prompt_token_ids=[1, 504, 3458, 282, 4649, 314, 2], sampling=SamplingParams(temperature=0.0, max_tokens=8))]

    def generate() -> Any:
        (gen,) = ray.get(actor.generate.remote(req), timeout=300)
        return gen

    before = generate()
    sync = WeightSync(target)
    r1 = sync.publish(base, 1)
    assert (r1.kind, r1.reason) == ("full", "first") and target.version() == 1
    assert generate().token_ids == before.token_ids  # the same weights, through bf16 -> fp32
    r2 = sync.publish(step, 2)
    assert r2.kind == "delta" and r2.bytes_sent * 50 < r2.bytes_full and sorted(r2.changed_tensors) == sorted(moved)
    # the actor's fp32 weights hold exactly the bf16 values sent
    served = target.checksums(moved)
    assert served == {n: crc32_of(step[n].float()) for n in moved}
    after = generate()
    assert after.weight_version == 2 and after.token_ids != before.token_ids
    r3 = sync.publish(base, 3)  # back, as a delta again
    assert r3.kind == "delta" and target.checksums(moved) == {n: crc32_of(base[n].float()) for n in moved}
    assert generate().token_ids == before.token_ids
    ray.kill(actor)
