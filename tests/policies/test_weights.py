"""The weights layer: the update type, the bit-pattern diff, the signed codec, versions, and the policy-side
apply (validate everything, then write all or nothing)."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agentgym.errors import (
    ConfigurationError,
    VersionNotNewer,
    WeightUpdateRejected,
)
from agentgym.weights import (
    LoRAAdapter,
    WeightPublisher,
    WeightUpdate,
    check_version,
    crc32,
    decode,
    diff,
    encode,
)

torch = pytest.importorskip("torch")
from agentgym.policies.weights import apply_update  # noqa: E402

KEY = b"k" * 32


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(4, 5, generator=g).to(torch.bfloat16), "b": torch.zeros(3)}


def _copy(s: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() for k, v in s.items()}


def _same(x: dict[str, Any], y: dict[str, Any]) -> bool:
    return set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)


def test_publisher_full_then_delta_touches_only_changed_elements() -> None:
    old = _state()
    pub = WeightPublisher("bfloat16")
    first = pub.publish(old, 1)
    assert first.update.kind == "full" and first.full is None and first.report is not None
    assert first.report.reason == "first"
    new = _copy(old)
    new["a"][1, 2] = 7.0
    new["a"][3, 4] = -1.0
    p = pub.publish(new, 2)
    assert p.update.kind == "delta" and p.base_version == 1 and p.update.num_changed() == 2
    assert list(p.update.indices) == ["a"] and p.update.indices["a"].dtype == torch.int32
    assert p.update.base_crc == {"a": crc32(old["a"])}
    target = _copy(old)
    target["b"] = target["b"].to(torch.bfloat16)
    assert apply_update(target, p.update) == ["a"]
    assert torch.equal(target["a"], new["a"])
    with pytest.raises(VersionNotNewer):
        pub.publish(new, 2)


def test_diff_compares_bit_patterns() -> None:
    a = torch.tensor([0.0, 1.0, float("nan"), 2.0]).to(torch.bfloat16)
    b = torch.tensor([-0.0, 1.0, float("nan"), 3.0]).to(torch.bfloat16)
    i, v = diff(a, b)
    assert i.tolist() == [0, 3] and i.dtype == torch.int32 and v[1].item() == 3.0


def test_full_update_and_bad_updates_are_rejected_before_writing() -> None:
    s = _state()
    assert apply_update(s, WeightUpdate.full({"b": torch.ones(3)})) == ["b"] and s["b"].tolist() == [1.0, 1.0, 1.0]
    before = _copy(s)
    for bad, match in [
        (WeightUpdate.full({"zzz": torch.ones(1)}), "does not have"),
        (WeightUpdate.full({"b": torch.ones(4)}), "shape"),
        (WeightUpdate.full({"b": torch.ones(3, dtype=torch.int64)}), "float"),
        (WeightUpdate.lora(LoRAAdapter({"m": (torch.zeros(2, 3), torch.zeros(3, 2))}, rank=2, alpha=2)), "LoRA"),
        ({"b": torch.ones(3)}, "WeightUpdate"),  # the old dict forms are gone: one shape per kind
    ]:
        with pytest.raises(WeightUpdateRejected, match=match):
            apply_update(s, bad)  # type: ignore[arg-type]
    assert _same(s, before)


def _delta(state: dict[str, Any], name: str, idx: list[int], vals: list[float], **kw: Any) -> WeightUpdate:
    i = torch.tensor(idx, dtype=torch.int32)
    v = torch.tensor(vals).to(state[name].dtype)
    return WeightUpdate.delta({name: kw.get("indices", i)}, {name: kw.get("values", v)},
                              {name: kw.get("crc", crc32(state[name]))}, kw.get("tensors"))


def test_versions_strictly_increase() -> None:
    assert check_version(2, 3) == 3 and check_version(2, 5) == 5 and check_version(None, 0) == 0
    with pytest.raises(VersionNotNewer, match="not newer"):
        check_version(2, 2)  # an equal version is a second, different update under the same name
    with pytest.raises(VersionNotNewer, match="not newer"):
        check_version(5, 4)
    with pytest.raises(VersionNotNewer):
        check_version(0, -1)
    with pytest.raises(VersionNotNewer):
        check_version(0, True)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the codec
def test_codec_round_trip_for_every_kind() -> None:
    s = _state()
    full = WeightUpdate.full(s)
    delta = _delta(s, "a", [0, 5], [1.5, -2.0], tensors={"b": torch.ones(3)})
    lora = WeightUpdate.lora(LoRAAdapter({"m.q": (torch.randn(2, 5), torch.randn(4, 2))}, rank=2, alpha=4.0, name="x"))
    for u in (full, delta, lora):
        blob = encode(u, 7, KEY)
        for form in (blob, "b64:" + base64.b64encode(blob).decode()):
            d = decode(form, KEY)
            assert d.version == 7 and d.update.kind == u.kind and (d.part, d.parts) == (0, 1)
            assert _same(dict(d.update.tensors), dict(u.tensors)) and _same(dict(d.update.indices), dict(u.indices))
            assert _same(dict(d.update.values), dict(u.values)) and dict(d.update.base_crc) == dict(u.base_crc)
    d = decode(encode(lora, 7, KEY), KEY).update
    assert d.adapter is not None and (d.adapter.rank, d.adapter.alpha, d.adapter.name) == (2, 4.0, "x")
    assert torch.equal(d.adapter.weights["m.q"][1], lora.adapter.weights["m.q"][1])  # type: ignore[union-attr]


# ------------------------------------------------------------------ the HTTP hop's credentials
@pytest.fixture
def recording_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A loopback HTTP server that answers the dev routes a VLLMServerTarget reads, recording each request's headers."""
    seen: list[dict[str, str]] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            out = {"results": [7 if body.get("method") == "agentgym_version" else {"w": [3]}]}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1", seen
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=10)


def test_server_target_sends_credentials(recording_server: tuple[str, list[dict[str, str]]],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym.policies.vllm_server import VLLMServerTarget

    url, seen = recording_server
    monkeypatch.delenv("AGENTGYM_WEIGHTS_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="AGENTGYM_WEIGHTS_KEY"):
        VLLMServerTarget(url)  # it cannot sign without the shared key
    target = VLLMServerTarget(url, api_key="s3cret", weights_key="shared", timeout_s=10)
    try:
        assert target.weight_version == 7 and target.weight_shapes() == {"w": (3,)}
        with pytest.raises(WeightUpdateRejected, match="shape"):  # checked here before anything is sent
            target.update_weights(WeightUpdate.full({"w": torch.ones(4)}), 8)
    finally:
        target.close()
    assert len(seen) == 2 and all(h.get("authorization") == "Bearer s3cret" for h in seen)
