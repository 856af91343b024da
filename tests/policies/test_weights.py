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
    ChecksumMismatch,
    ConfigurationError,
    UpdateNotAuthenticated,
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
from agentgym.policies.weights import apply_update, stage  # noqa: E402

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


def test_malformed_deltas_are_rejected_and_nothing_is_written() -> None:
    """Issue 23: a delta whose values are 2-D (right element count) passed validation, and the whole tensors
    of the same update were written before it failed. Every check now runs before any write."""
    s = _state()
    before = _copy(s)
    whole = {"b": torch.full((3,), 5.0)}  # a valid whole tensor in the same update: must not be written either
    cases = [
        (_delta(s, "a", [0, 1, 2, 3], [1, 2, 3, 4], values=torch.ones(2, 2).to(torch.bfloat16), tensors=whole), "1-D"),
        (_delta(s, "a", [0, 1], [1, 2], indices=torch.tensor([[0, 1]], dtype=torch.int32), tensors=whole), "1-D"),
        (_delta(s, "a", [0, 1], [1, 2], indices=torch.tensor([0.0, 1.0]), tensors=whole), "int32"),
        (_delta(s, "a", [0, 99], [1, 2], tensors=whole), "outside"),
        (_delta(s, "a", [-1], [1], tensors=whole), "outside"),
        (_delta(s, "a", [0, 1, 2], [1, 2], values=torch.ones(2).to(torch.bfloat16), tensors=whole), "indices but"),
        (WeightUpdate.delta({"a": torch.tensor([0], dtype=torch.int32)}, {"a": torch.ones(1)}, {}, whole), "base checksum"),
    ]
    for bad, match in cases:
        with pytest.raises(WeightUpdateRejected, match=match):
            apply_update(s, bad)
        assert _same(s, before), match
    with pytest.raises(ChecksumMismatch):  # a delta computed against other weights
        apply_update(s, _delta(s, "a", [0], [3.0], crc=crc32(s["a"]) ^ 1, tensors=whole))
    assert _same(s, before)


def test_a_failing_write_is_undone() -> None:
    s = _state()
    before = _copy(s)
    staged = stage(s, WeightUpdate.full({"a": torch.ones(4, 5), "b": torch.ones(3)}))
    staged.whole["b"] = torch.ones(7)  # a write that fails after "a" was written
    with pytest.raises(WeightUpdateRejected, match="undone"):
        staged.commit()
    assert _same(s, before)
    staged = stage(s, _delta(s, "a", [2], [9.0]))
    staged.commit()
    assert s["a"].view(-1)[2].item() == 9.0
    staged.rollback()  # what the vLLM worker does when the engine's reload fails
    assert _same(s, before)


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


def test_codec_refuses_unauthenticated_forged_and_oversized_payloads() -> None:
    from safetensors.torch import save

    u = WeightUpdate.full({"b": torch.ones(3)})
    blob = encode(u, 3, KEY)
    with pytest.raises(UpdateNotAuthenticated, match="no weights key"):
        decode(blob, None)  # a receiver without the key takes nothing
    with pytest.raises(UpdateNotAuthenticated, match="does not verify"):
        decode(blob, b"another key")
    forged = bytearray(blob)
    forged[-3] ^= 0xFF  # one value byte changed on the way
    with pytest.raises(UpdateNotAuthenticated, match="does not verify"):
        decode(bytes(forged), KEY)
    raw = save({"t/b": torch.ones(3)}, metadata={"agentgym": json.dumps({"kind": "full", "version": 9})})
    with pytest.raises(UpdateNotAuthenticated, match="no HMAC"):
        decode(raw, KEY)  # a well-formed payload without a MAC
    with pytest.raises(WeightUpdateRejected, match="larger"):
        decode(blob, KEY, max_bytes=16)
    for bad in ("http://nope", "b64:!!!", 12):
        with pytest.raises(WeightUpdateRejected):
            decode(bad, KEY)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="AGENTGYM_WEIGHTS_KEY"):
        encode(u, 3, None)


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


# ------------------------------------------------------------------ attacks on HFPolicy
@pytest.fixture(scope="module")
def tiny_hf() -> Any:
    """A real HFPolicy over a tiny randomly initialised Llama (built from a config: no download)."""
    transformers = pytest.importorskip("transformers")
    from agentgym.policies.hf import HFPolicy
    from agentgym.policies.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model("smollm2-135m-instruct"))
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return HFPolicy.from_model(model, tok, weights_key="hf key")


def test_hf_policy_refuses_forged_replayed_and_malformed_updates(tiny_hf: Any) -> None:
    """Issue 23: signed payloads with no key, a wrong key or changed bytes, a replayed older version, and a
    malformed delta are refused before anything is written; a good signed update then applies."""
    pol = tiny_hf
    state = pol.state_dict()
    name = "model.layers.0.mlp.down_proj.weight"
    before = {k: v.detach().clone() for k, v in state.items()}
    v = pol.weight_version
    good = WeightUpdate.full({name: torch.ones(16, 32)})
    bad_key = encode(good, v + 1, b"not the policy's key")
    forged = bytearray(encode(good, v + 1, b"hf key"))
    forged[-5] ^= 0x40
    malformed = WeightUpdate.delta({name: torch.tensor([0, 1, 2, 3], dtype=torch.int32)}, {name: torch.ones(2, 2)},
                                   {name: crc32(state[name])}, {"model.norm.weight": torch.zeros(16)})
    for attack, exc in [(bad_key, UpdateNotAuthenticated), (bytes(forged), UpdateNotAuthenticated),
                        (encode(malformed, v + 1, b"hf key"), WeightUpdateRejected),
                        (encode(good, v + 2, b"hf key"), WeightUpdateRejected)]:  # signed for v+2, offered as v+1
        with pytest.raises(exc):
            pol.update_weights(attack, v + 1)
        assert pol.weight_version == v and all(torch.equal(before[k], s) for k, s in pol.state_dict().items())
    with pytest.raises(WeightUpdateRejected, match="1-D"):  # the same malformed delta as an object
        pol.update_weights(malformed, v + 1)
    assert all(torch.equal(before[k], s) for k, s in pol.state_dict().items())
    old = encode(good, v + 1, b"hf key")
    assert pol.update_weights(old, v + 1) == [name] and torch.equal(pol.state_dict()[name], torch.ones(16, 32))
    pol.update_weights(encode(WeightUpdate.full({name: before[name]}), v + 2, b"hf key"), v + 2)
    with pytest.raises(VersionNotNewer):  # the v+1 payload, captured and replayed
        pol.update_weights(old, v + 1)
    assert pol.weight_version == v + 2 and torch.equal(pol.state_dict()[name], before[name])


def test_hf_policy_without_a_key_takes_no_signed_payload(tiny_hf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym.policies.hf import HFPolicy

    monkeypatch.delenv("AGENTGYM_WEIGHTS_KEY", raising=False)
    keyless = HFPolicy.from_model(tiny_hf.model, tiny_hf.tokenizer)
    with pytest.raises(UpdateNotAuthenticated, match="no weights key"):
        keyless.update_weights(encode(WeightUpdate.full({}), 1, b"any key"), 1)
    assert keyless.weight_version == 0


def test_worker_methods_take_no_path_from_the_caller(tmp_path: Any) -> None:
    """Issue 23: ``POST /collective_rpc`` reaches the worker's methods without vLLM's API key, so none of AgentGym's
    may take a path to load from. The master copy comes from the engine's own model folder, whatever is asked."""
    import inspect
    from types import SimpleNamespace

    from agentgym.policies.vllm_worker import WeightWorkerExtension
    from safetensors.torch import save_file

    for name, fn in inspect.getmembers(WeightWorkerExtension, inspect.isfunction):
        if name.startswith("agentgym_"):
            params = [p for p in inspect.signature(fn).parameters if p != "self"]
            assert not any("path" in p or "dir" in p or "file" in p for p in params), (name, params)
    own, other = tmp_path / "own", tmp_path / "other"
    for folder, value in ((own, 1.0), (other, 2.0)):
        folder.mkdir()
        save_file({"w": torch.full((2,), value)}, str(folder / "model.safetensors"))
    worker = WeightWorkerExtension()
    worker.model_runner = SimpleNamespace(model_config=SimpleNamespace(model=str(own)))  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        worker.agentgym_init_master(str(other))  # type: ignore[call-arg]
    assert worker.agentgym_init_master() == 1
    assert torch.equal(worker._master()["w"], torch.full((2,), 1.0))
