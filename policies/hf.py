"""``HFPolicy``: a transformers causal LM behind the async Policy contract, with continuous batching.

One decode loop runs in a background thread and owns the model. :meth:`HFPolicy.generate` only
enqueues rows (one per sample) and awaits them, so concurrent calls from many episodes *join the
running batch* at the next step instead of waiting for it to finish:

1. Rows that arrived since the last step are prefilled together (left-padded) and their KV caches
   are merged into the running batch (left-padded to a common length).
2. One decode step runs for every active row (``[B, 1]`` input, per-row attention mask and
   positions), then each row samples its next token with its own settings (temperature, top-k,
   top-p, greedy; a seeded row draws from its own ``torch.Generator``, so it is reproducible even
   in a batch up to batch-dependent float rounding).
3. Finished rows (EOS, stop string, ``max_tokens``, abort, deadline) leave the batch; their cache
   rows are dropped and all-padding columns trimmed.

The logprob returned for each sampled token is the model's own log-probability at temperature 1,
before temperature, top-k and top-p (what vLLM returns by default), which is what the trainer
recomputes. Weight updates are applied between decode steps; every token records the weight
version it was sampled under, so a generation that spans an update reports one version per token.
``abort()`` ends in-flight rows early with ``finish_reason="abort"`` and the tokens so far (the
rollout resumes them).

**Prefix cache (multi-turn sessions).** A token-exact session sends its *whole* context every turn;
prefilling it again each turn made multi-turn episodes quadratic. When a row finishes, its KV cache
(prompt + completion, all but the last sampled token) is kept in a :class:`PrefixCache`, keyed by its
token ids. A new row looks up the longest cached prefix of its prompt (its own previous turn, or a
system prompt another episode shares) and prefills only the tokens after it, as vLLM's prefix cache
does; rows of one call with the same prompt (``n`` samples of a group) are prefilled once. The cache
is an LRU over entries under a byte budget (``prefix_cache_gib``; 0 turns it off and gives the
uncached path). Every weight change through :meth:`HFPolicy.update_weights` or
:meth:`HFPolicy.load_state_dict` empties it, and a row whose weights changed while it ran is not
stored, so cached KV always comes from the weights now served. A session that restarts (a re-rendered
conversation) no longer extends its old ids, so its old entry is never reused and ages out. Weights
changed behind the policy's back (``policy.model`` trained in place) need :meth:`HFPolicy.clear_prefix_cache`.

On CPUs with native bf16 (AMX / AVX512-BF16) ``dtype="auto"`` loads bfloat16; elsewhere float32, where
bf16 matmuls are emulated and were measured slower (``benchmarks/bench_policies.py``, dtype section).
When an HF policy on CPU generates slowly and vLLM is installed, one log line says to use ``vllm:``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import ConfigurationError, DependencyNotInstalled, PolicyError, PolicyTimeout
from agentgym.policy import (
    Capabilities,
    Generation,
    GenRequest,
    PolicyLifecycle,
    SamplingParams,
    describe_policy,
)
from agentgym.weights import WeightUpdate, check_version, shared_key

from ._common import Truncation, cut_at_stop, prepare_prompts
from .session import OnMismatch, TokenizerChatSession
from .weights import signed_update, stage

__all__ = ["HFPolicy", "PrefixCache", "cpu_has_native_bf16"]

log = logging.getLogger(__name__)

# The vLLM hint: after this much busy generation time, a CPU policy below this rate says to use vllm:.
_HINT_AFTER_S = 20.0
_HINT_BELOW_TOK_S = 50.0

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "auto": "auto"}


def _vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def cpu_has_native_bf16() -> bool:
    """True if this CPU has bf16 matrix instructions (AMX or AVX512-BF16)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


@dataclass(eq=False)
class _Row:
    """One sample in flight (a request with ``n`` samples has ``n`` rows)."""

    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    generator: Any  # torch.Generator for seeded rows, else None
    future: asyncio.Future[Generation]
    loop: asyncio.AbstractEventLoop
    request_id: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    finish: str | None = None  # set when the row is done
    cancelled: bool = False  # the caller gave up (deadline, cancellation): drop silently
    aborted: bool = False  # abort(): finish with what we have
    error: BaseException | None = None
    epoch: int = -1  # the prefix cache's weight epoch when this row was prefilled


@dataclass(eq=False)
class _Entry:
    """One cached prefix: ``tokens [T]`` and per layer ``[1, H, T, D]`` keys and values."""

    tokens: Any  # np.ndarray int64
    layers: list[tuple[Any, Any]]
    nbytes: int


class PrefixCache:
    """KV caches of finished rows keyed by their token ids: an LRU under a byte budget.

    Thread-safe: the decode loop looks up and stores; weight updates call :meth:`invalidate` from
    other threads. ``epoch`` counts invalidations; :meth:`store` refuses KV computed under an older epoch.

    Args:
        budget_bytes: Most bytes of keys and values held; least recently used entries go first.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = int(budget_bytes)
        self.epoch = 0
        self.bytes = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.counters = {"lookups": 0, "hits": 0, "reused_tokens": 0, "stored": 0, "evicted": 0, "invalidated": 0}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens held over all entries."""
        return sum(len(e.tokens) for e in self._entries.values())

    def lookup(self, prompt: Sequence[int]) -> tuple[_Entry | None, int]:
        """The entry sharing the longest prefix with ``prompt`` and that length (at most ``len(prompt) - 1``,
        so at least one token is left to prefill); ``(None, 0)`` when nothing is shared."""
        import numpy as np

        p = np.asarray(prompt, dtype=np.int64)
        limit = len(p) - 1
        best: tuple[int, _Entry] | None = None
        best_len = 0
        with self._lock:
            self.counters["lookups"] += 1
            for key, e in self._entries.items():
                n = min(limit, len(e.tokens))
                if n <= best_len:
                    continue
                diff = np.flatnonzero(e.tokens[:n] != p[:n])
                shared = int(diff[0]) if diff.size else n
                if shared > best_len:
                    best, best_len = (key, e), shared
            if best is None:
                return None, 0
            self._entries.move_to_end(best[0])
            self.counters["hits"] += 1
            self.counters["reused_tokens"] += best_len
            return best[1], best_len

    def store(self, tokens: Sequence[int], layers: list[tuple[Any, Any]], epoch: int) -> bool:
        """Keep ``layers`` (per layer ``[1, H, T, D]``) for ``tokens [T]``; returns whether it was kept.

        Refused when computed under an older epoch or bigger than the whole budget. An entry whose
        tokens are a prefix of the new one is dropped (the new one serves every lookup it would); a
        new entry that is a prefix of an existing one only refreshes that one.
        """
        import numpy as np

        nbytes = sum(int(k.nbytes) + int(v.nbytes) for k, v in layers)
        if nbytes > self.budget_bytes:
            return False
        t = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            if epoch != self.epoch:
                return False
            for key, e in list(self._entries.items()):
                n = len(e.tokens)
                if n <= len(t) and np.array_equal(e.tokens, t[:n]):
                    self._drop(key)
                elif n > len(t) and np.array_equal(e.tokens[: len(t)], t):
                    self._entries.move_to_end(key)
                    return False
            self._entries[next(self._ids)] = _Entry(t, layers, nbytes)
            self.bytes += nbytes
            self.counters["stored"] += 1
            while self.bytes > self.budget_bytes and self._entries:
                self._drop(next(iter(self._entries)))
                self.counters["evicted"] += 1
            return True

    def invalidate(self) -> None:
        """Drop every entry and start a new epoch (the weights changed)."""
        with self._lock:
            self.epoch += 1
            self._entries.clear()
            self.bytes = 0
            self.counters["invalidated"] += 1

    def stats(self) -> dict[str, Any]:
        """Entries, tokens and bytes held, the budget, and the counters."""
        with self._lock:
            return {"entries": len(self._entries), "tokens": sum(len(e.tokens) for e in self._entries.values()),
                    "bytes": self.bytes, "budget_bytes": self.budget_bytes, "epoch": self.epoch, **self.counters}

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key)
        self.bytes -= e.nbytes


class _Cache:
    """The running batch's KV cache: per layer ``[B, H, T, D]`` keys and values, left-padded.

    Wraps a transformers ``DynamicCache`` (rebuilt only when rows join).
    """

    def __init__(self) -> None:
        self.cache: Any = None
        self.mask: Any = None  # [B, T] 1 on real positions
        self.positions: Any = None  # [B] position id of the next token

    @staticmethod
    def layers_of(cache: Any) -> list[tuple[Any, Any]]:
        return [(layer.keys, layer.values) for layer in cache.layers]

    def merge(self, new_cache: Any, new_mask: Any, new_pos: Any) -> None:
        import torch
        import torch.nn.functional as F
        from transformers import DynamicCache

        if self.cache is None:
            self.cache, self.mask, self.positions = new_cache, new_mask, new_pos
            return
        old_layers, new_layers = self.layers_of(self.cache), self.layers_of(new_cache)
        t_old, t_new = self.mask.shape[1], new_mask.shape[1]
        t = max(t_old, t_new)
        merged = DynamicCache()
        for i, ((ko, vo), (kn, vn)) in enumerate(zip(old_layers, new_layers, strict=True)):
            ko, vo = F.pad(ko, (0, 0, t - t_old, 0)), F.pad(vo, (0, 0, t - t_old, 0))
            kn, vn = F.pad(kn, (0, 0, t - t_new, 0)), F.pad(vn, (0, 0, t - t_new, 0))
            merged.update(torch.cat([ko, kn]), torch.cat([vo, vn]), i)
        self.mask = torch.cat([F.pad(self.mask, (t - t_old, 0)), F.pad(new_mask, (t - t_new, 0))])
        self.positions = torch.cat([self.positions, new_pos])
        self.cache = merged

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (batch indices); trim all-padding columns on the left."""
        import torch

        if not rows:
            self.cache = self.mask = self.positions = None
            return
        idx = torch.tensor(rows, dtype=torch.long)
        self.cache.batch_select_indices(idx.to(self.cache.layers[0].keys.device))  # the model's device
        self.mask = self.mask.index_select(0, idx)
        self.positions = self.positions.index_select(0, idx)
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else self.mask.shape[1]
        if first > 0:
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, first:, :]
                layer.values = layer.values[:, :, first:, :]
            self.mask = self.mask[:, first:]


class HFPolicy(PolicyLifecycle):
    """A transformers model as a :class:`~agentgym.policy.TokenPolicy` (continuous batching on CPU or GPU).

    Args:
        model: Known short name (``smollm2-135m-instruct``), local folder or HF hub id.
        policy_id: Tag written on every turn this policy generates.
        device: Torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``...).
        dtype: ``"auto"`` (bf16 on CPUs with native bf16 and on GPUs, else fp32), ``"float32"``,
            ``"bfloat16"`` or ``"float16"``.
        max_batch_size: Rows decoded at once; more wait in the queue and join as rows finish.
        context_length: Override the model's context (default: ``max_position_embeddings``).
        truncation: ``"error"`` raises ContextLengthExceeded for an over-long prompt; ``"left"``
            drops its oldest tokens.
        timeout_s: Deadline of one :meth:`generate` call.
        on_mismatch: Passed to :class:`~agentgym.policies.session.TokenizerChatSession`.
        seed: Seeds the generator of unseeded rows (the global torch RNG is never touched).
        weights_key: The key that signed weight payloads must verify with (default: the process's
            ``AGENTGYM_WEIGHTS_KEY``); :class:`~agentgym.weights.WeightUpdate` objects need none.
        prefix_cache_gib: Byte budget of the prefix cache (KV of finished rows reused by later turns;
            see the module docstring); ``0`` turns it off.

    Attributes:
        prefill_tokens: Prompt tokens run through the model in prefills (cached prefixes excluded).
        prefix_cache: The :class:`PrefixCache`, or ``None`` when off.
    """

    capabilities = Capabilities(sessions=True, weight_updates=True, abort=True)

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        *,
        policy_id: str = "hf",
        device: str = "cpu",
        dtype: str = "auto",
        max_batch_size: int = 32,
        context_length: int | None = None,
        truncation: Truncation = "error",
        timeout_s: float = 600.0,
        on_mismatch: OnMismatch = "raise",
        seed: int = 0,
        weights_key: str | None = None,
        prefix_cache_gib: float = 1.0,
        _model: Any = None,
        _tokenizer: Any = None,
    ) -> None:
        try:
            import torch
            import transformers
        except ImportError as e:
            raise DependencyNotInstalled("HFPolicy", "agentgym[hf]") from e
        from .models import load_tokenizer, resolve_model

        if dtype not in _DTYPES:
            raise ConfigurationError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if truncation not in ("error", "left"):
            raise ConfigurationError(f"truncation must be 'error' or 'left', got {truncation!r}")
        if max_batch_size < 1:
            raise ConfigurationError("max_batch_size must be >= 1")
        if not prefix_cache_gib >= 0:
            raise ConfigurationError(f"prefix_cache_gib must be >= 0, got {prefix_cache_gib!r}")
        self.policy_id = policy_id
        self._model_name = model
        if _model is not None:
            self.model_path = str(getattr(_model, "name_or_path", "") or "<in-memory model>")
            self.tokenizer = _tokenizer
            self.model: Any = _model
        else:
            self.model_path = resolve_model(model)
            self.tokenizer = load_tokenizer(self.model_path)
            name = _DTYPES[dtype]
            if name == "auto":
                name = "bfloat16" if (str(device).startswith("cuda") or cpu_has_native_bf16()) else "float32"
            try:
                self.model = transformers.AutoModelForCausalLM.from_pretrained(self.model_path,
                                                                              dtype=getattr(torch, name))
            except OSError as e:
                raise ConfigurationError(f"cannot load model {model!r} from {self.model_path}: {e}") from e
            self.model = self.model.to(device).eval()  # type: ignore[arg-type]
        self.device = device
        self.max_batch_size = max_batch_size
        self.truncation: Truncation = truncation
        self.timeout_s = timeout_s
        self.on_mismatch: OnMismatch = on_mismatch
        cfg_len = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.context_length = int(context_length or cfg_len)
        eos = self.model.generation_config.eos_token_id if self.model.generation_config is not None else None
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.weight_version = 0
        self._weights_key = weights_key.encode() if weights_key else None
        self._rng = torch.Generator(device="cpu").manual_seed(seed)
        self._lock = threading.Lock()  # held by the decode loop during a step, and by weight updates
        self._inbox: queue.SimpleQueue[_Row | None] = queue.SimpleQueue()
        self._active: list[_Row] = []
        self._outstanding: set[_Row] = set()  # rows enqueued and not yet delivered (guarded by _out_lock)
        self._out_lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._cache = _Cache()
        self._ids = itertools.count()
        self.steps = 0  # decode steps run (for tests and benchmarks)
        self.batch_sizes: list[int] = []  # rows in each decode step (for tests and benchmarks)
        self.prefill_tokens = 0
        self.prefix_cache_gib = float(prefix_cache_gib)
        self.prefix_cache: PrefixCache | None = (PrefixCache(int(prefix_cache_gib * 2**30)) if prefix_cache_gib > 0
                                                 else None)
        self._busy_s = 0.0  # generation loop time with work, and tokens sampled in it (for the vLLM hint)
        self._sampled = 0
        self._hinted = False

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, **kwargs: Any) -> HFPolicy:
        """Serve an already-loaded model (e.g. the trainer's own) without loading weights again."""
        device = str(next(model.parameters()).device)
        return cls(device=device, _model=model, _tokenizer=tokenizer, **kwargs)

    # ---------------------------------------------------------------- contract
    def new_session(self) -> TokenizerChatSession:
        """A token-exact chat session over this model's tokenizer."""
        return TokenizerChatSession(self.tokenizer, on_mismatch=self.on_mismatch)

    def describe(self) -> dict[str, Any]:
        return describe_policy(self, backend="transformers (continuous batching)", model_path=str(self.model_path),
                               device=str(self.device), dtype=str(self.model.dtype).replace("torch.", ""),
                               weight_version=self.weight_version, context_length=self.context_length,
                               max_batch_size=self.max_batch_size, prefix_cache_gib=self.prefix_cache_gib)

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        """Generate ``n`` completions per request (request-major order); joins the running batch."""
        if not requests:
            return []
        if self._closed:
            raise PolicyError("this HFPolicy was closed; create a new one")
        import torch

        prompts = prepare_prompts(self.tokenizer, requests, self.context_length, self.truncation)
        loop = asyncio.get_running_loop()
        rows: list[_Row] = []
        for req, p in zip(requests, prompts, strict=True):
            for j in range(req.n):
                seed = req.sampling.seed
                gen = None if seed is None else torch.Generator(device="cpu").manual_seed(int(seed) + j)
                rows.append(_Row(list(p.ids), req.sampling, p.max_tokens, gen, loop.create_future(), loop,
                                 request_id=req.request_id, stop=[s for s in (req.sampling.stop or []) if s]))
        self._ensure_thread()
        for r in rows:
            if r.max_tokens <= 0:
                r.future.set_result(self._result(r, "length"))
            else:
                with self._out_lock:
                    self._outstanding.add(r)
                self._inbox.put(r)
        gathered = asyncio.gather(*(r.future for r in rows))
        try:
            return list(await asyncio.wait_for(gathered, timeout=self.timeout_s))
        except asyncio.TimeoutError:
            for r in rows:
                r.cancelled = True
            raise PolicyTimeout(
                f"HFPolicy.generate exceeded timeout_s={self.timeout_s:g}s for {len(requests)} request(s); "
                "raise timeout_s or lower max_tokens") from None
        except BaseException:
            for r in rows:
                r.cancelled = True
            raise
        finally:
            # A cancelled wait_for waits for the gather it cancelled but never reads its outcome, and CPython then
            # logs "_GatheringFuture exception was never retrieved" when it is collected (a group cancelled at
            # shutdown, e.g. in flight under dynamic sampling). Read it here.
            if gathered.done() and not gathered.cancelled():
                gathered.exception()

    def abort(self, request_ids: Sequence[str] | None = None) -> int:
        """End in-flight rows (all, or those of ``request_ids``) with ``finish_reason="abort"``.

        Returns:
            How many rows were marked (queued rows not yet started are aborted too, with no tokens).
        """
        wanted = None if request_ids is None else set(request_ids)
        n = 0
        with self._out_lock:
            rows = list(self._outstanding)
        for r in rows:
            if r.finish is None and not r.aborted and (wanted is None or r.request_id in wanted):
                r.aborted = True
                n += 1
        return n

    async def aclose(self) -> None:
        """Stop the decode loop; pending generations fail with PolicyError."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(None)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 60)

    # ----------------------------------------------------------------- weights
    def state_dict(self) -> dict[str, Any]:
        """The model's current weights (tensors shared with the model)."""
        return dict(self.model.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any], version: int | None = None, strict: bool = True) -> None:
        """Load full weights between decode steps and optionally bump the version."""
        with self._lock:
            if version is not None:
                check_version(self.weight_version, version)
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
            tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
            self.clear_prefix_cache()  # loaded tensors may already have changed, even if the check below fails
            if strict and (set(missing) - tied or unexpected):
                raise ConfigurationError(f"state dict mismatch: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
            if version is not None:
                self.weight_version = version

    def update_weights(self, update: WeightUpdate | bytes, version: int) -> list[str]:
        """Apply a full or delta update between decode steps, all of it or nothing
        (:func:`agentgym.policies.weights.stage`).

        Tokens sampled after this returns carry ``version``; rows in flight keep going on the new
        weights with per-token versions.

        Args:
            update: A :class:`~agentgym.weights.WeightUpdate`, or its signed wire form (checked with
                ``weights_key``; it must be signed for ``version``).
            version: Strictly greater than the served version.

        Returns:
            The names of the tensors that changed.

        Raises:
            VersionNotNewer, ChecksumMismatch, WeightUpdateRejected (UpdateNotAuthenticated): nothing
            was written.
        """
        if not isinstance(update, WeightUpdate):
            update = signed_update(update, version, self._weights_key or shared_key())
        with self._lock:
            check_version(self.weight_version, version)
            state = self.model.state_dict(keep_vars=True)
            try:
                changed = stage({k: v.data for k, v in state.items()}, update).commit()
            finally:
                self.clear_prefix_cache()  # the weights the cached keys/values came from are gone
            self.weight_version = version
            return changed

    async def update_weights_async(self, update: WeightUpdate | bytes, version: int) -> list[str]:
        """:meth:`update_weights` without blocking the event loop."""
        return await asyncio.to_thread(self.update_weights, update, version)

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix (called on every weight change; call it after changing
        ``self.model``'s weights any other way)."""
        if self.prefix_cache is not None:
            self.prefix_cache.invalidate()

    # --------------------------------------------------------------- the loop
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=f"hf-{self.policy_id}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        import torch

        stop = False
        while not stop:
            try:
                if not self._active:
                    first = self._inbox.get()  # idle: block until work arrives
                    if first is None:
                        break
                    pending = [first]
                else:
                    pending = []
                while len(self._active) + len(pending) < self.max_batch_size:
                    try:
                        nxt = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    pending.append(nxt)
                pending = [r for r in pending if not self._skip(r)]
                with self._lock, torch.inference_mode():
                    t0 = time.perf_counter()  # after the lock: time a trainer holds it is not generation time
                    logits: list[Any] = []
                    if self._active:
                        logits.append(self._decode_step())
                    if pending:
                        logits.append(self._prefill(pending))
                        self._active += pending
                    if logits:
                        self._sample(torch.cat(logits) if len(logits) > 1 else logits[0])
                    busy = time.perf_counter() - t0
                self._retire()
                self._note_speed(busy)
            except Exception as e:  # a failing step fails its rows, never the loop
                for r in self._active:
                    r.error = e
                    r.finish = "error"
                self._cache = _Cache()
                self._retire()
        for r in self._active:
            r.error = PolicyError("HFPolicy was closed")
            r.finish = "error"
        self._retire()
        while True:
            try:
                r2 = self._inbox.get_nowait()
            except queue.Empty:
                break
            if r2 is not None:
                self._deliver(r2, PolicyError("HFPolicy was closed"))

    def _skip(self, r: _Row) -> bool:
        if r.cancelled:
            return True
        if r.aborted:
            self._deliver(r, self._result(r, "abort"))
            return True
        return False

    def _prefill(self, rows: list[_Row]) -> Any:
        """Forward the new rows' prompts and merge their caches; return last logits ``[N, V]`` (row order).

        With the prefix cache on, rows with the same prompt are forwarded once, and each distinct prompt
        starts from its longest cached prefix: only the tokens after it are forwarded. Layout of the
        batch (``B`` distinct prompts): the cached keys/values ``[B, H, P, D]`` right-aligned in ``P`` (the
        longest cached prefix), then the new tokens ``[B, S]`` right-aligned in ``S``; the attention mask
        ``[B, P + S]`` is 1 exactly on each row's real positions, so a row's padding sits between its
        prefix and its new tokens, and its positions continue from its prefix length.
        """
        import torch
        from transformers import DynamicCache

        prefix = self.prefix_cache
        if prefix is None:
            uniq, index = [r.prompt for r in rows], list(range(len(rows)))
            hits: list[tuple[_Entry | None, int]] = [(None, 0)] * len(rows)
        else:
            seen: dict[tuple[int, ...], int] = {}
            index = [seen.setdefault(tuple(r.prompt), len(seen)) for r in rows]
            uniq = [list(k) for k in seen]
            hits = [prefix.lookup(u) for u in uniq]
            for r in rows:
                r.epoch = prefix.epoch
        dev = self.device
        b = len(uniq)
        plen = max(n for _, n in hits)
        suffix = [u[n:] for u, (_, n) in zip(uniq, hits, strict=True)]
        width = max(len(x) for x in suffix)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, plen + width), dtype=torch.long)
        start = torch.tensor([n for _, n in hits], dtype=torch.long)  # [B] position of the first new token
        for i, ((_, n), x) in enumerate(zip(hits, suffix, strict=True)):
            ids[i, width - len(x):] = torch.tensor(x, dtype=torch.long)
            mask[i, plen - n:plen] = 1
            mask[i, plen + width - len(x):] = 1
        new = mask[:, plen:]
        pos = ((new.cumsum(-1) - 1).clamp(min=0) + start.unsqueeze(1))
        cache = DynamicCache()
        if plen:
            first = next(e for e, _ in hits if e is not None)
            for layer, (k0, v0) in enumerate(first.layers):
                shape = (b, k0.shape[1], plen, k0.shape[3])
                k, v = k0.new_zeros(shape), v0.new_zeros(shape)
                for i, (e, n) in enumerate(hits):
                    if e is not None and n:
                        k[i, :, plen - n:] = e.layers[layer][0][0, :, :n]
                        v[i, :, plen - n:] = e.layers[layer][1][0, :, :n]
                cache.update(k.to(dev), v.to(dev), layer)
        self.prefill_tokens += sum(len(x) for x in suffix)
        out = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits[:, -1, :].float()
        if index != list(range(b)):  # rows sharing a prompt: one forward, copied per row
            sel = torch.tensor(index, dtype=torch.long)
            cache.batch_select_indices(sel.to(dev))
            mask, logits = mask.index_select(0, sel), logits.index_select(0, sel.to(logits.device))
        self._cache.merge(cache, mask, mask.sum(-1))
        return logits

    def _decode_step(self) -> Any:
        """One token for every active row; returns logits ``[B, V]``."""
        import torch

        c = self._cache
        last = torch.tensor([[r.tokens[-1]] for r in self._active], dtype=torch.long)
        c.mask = torch.cat([c.mask, torch.ones((c.mask.shape[0], 1), dtype=c.mask.dtype)], dim=1)
        dev = self.device
        out = self.model(input_ids=last.to(dev), attention_mask=c.mask.to(dev), position_ids=c.positions.view(-1, 1).to(dev),
                         past_key_values=c.cache, use_cache=True)
        c.cache = out.past_key_values
        c.positions = c.positions + 1
        return out.logits[:, -1, :].float()

    def _sample(self, logits: Any) -> None:
        """Sample one token per active row from ``logits [B, V]`` (row order == self._active)."""
        import torch

        rows = self._active
        self.steps += 1
        self.batch_sizes.append(len(rows))
        self._sampled += len(rows)
        # sampling runs on the CPU whatever the model's device: the per-request generators are CPU generators
        # (a seed draws the same tokens from the same logits on any device), and the tokens go to Python anyway
        logits = logits.to("cpu")
        logp = torch.log_softmax(logits, dim=-1)  # [B, V] raw logprobs, before any warping
        temps = torch.tensor([r.sampling.temperature for r in rows], dtype=logits.dtype)
        greedy = temps <= 0
        chosen = torch.empty(len(rows), dtype=torch.long)
        if bool(greedy.any()):
            chosen[greedy] = logits[greedy].argmax(-1)
        samp = (~greedy).nonzero().view(-1).tolist()
        if samp:
            sl = logits[samp] / temps[samp].unsqueeze(1)
            neg = torch.finfo(sl.dtype).min
            ks = [rows[i].sampling.top_k for i in samp]
            ps = [rows[i].sampling.top_p for i in samp]
            if any(0 < k < sl.shape[1] for k in ks):
                for j, k in enumerate(ks):
                    if 0 < k < sl.shape[1]:
                        kth = torch.topk(sl[j], k).values[-1]
                        sl[j].masked_fill_(sl[j] < kth, neg)
            if any(p < 1.0 for p in ps):
                for j, p in enumerate(ps):
                    if p < 1.0:
                        vals, order = torch.sort(sl[j], descending=True)
                        probs = torch.softmax(vals, dim=-1)
                        drop = probs.cumsum(-1) - probs > p  # keep the smallest set reaching p
                        sl[j, order[drop]] = neg
            probs = torch.softmax(sl, dim=-1)
            shared = [j for j, i in enumerate(samp) if rows[i].generator is None]
            if shared:
                picks = torch.multinomial(probs[shared], 1, generator=self._rng).view(-1)
                for j, t in zip(shared, picks.tolist(), strict=True):
                    chosen[samp[j]] = t
            for j, i in enumerate(samp):
                g = rows[i].generator
                if g is not None:
                    chosen[i] = torch.multinomial(probs[j], 1, generator=g)
        lps = logp.gather(1, chosen.view(-1, 1)).view(-1).tolist()
        version = self.weight_version
        for r, t, lp in zip(rows, chosen.tolist(), lps, strict=True):
            r.tokens.append(int(t))
            if r.sampling.logprobs:
                r.logprobs.append(float(lp))
            r.versions.append(version)
            if int(t) in self.eos_ids or (r.stop and self._hit_stop(r)):
                r.finish = "stop"
            elif len(r.tokens) >= r.max_tokens:
                r.finish = "length"
            elif r.aborted:
                r.finish = "abort"
            elif r.cancelled:
                r.finish = "cancelled"

    def _hit_stop(self, r: _Row) -> bool:
        tail_len = max(len(s) for s in r.stop) + 8
        tail = self.tokenizer.decode(r.tokens[-tail_len:], skip_special_tokens=True)
        return any(s in tail for s in r.stop)

    def _retire(self) -> None:
        """Cache, deliver and drop finished rows (cached first: a caller's next turn always finds its KV)."""
        keep: list[int] = []
        done: list[tuple[int, _Row]] = []
        for i, r in enumerate(self._active):
            if r.finish is None and r.aborted:
                r.finish = "abort"
            if r.finish is None and not r.cancelled:
                keep.append(i)
            else:
                done.append((i, r))
        if not done:
            return
        if self.prefix_cache is not None and self._cache.cache is not None:
            for i, r in done:
                if r.error is None and not r.cancelled and r.tokens:
                    self._store_prefix(i, r)
        for _, r in done:
            if r.error is not None:
                self._deliver(r, r.error if isinstance(r.error, PolicyError) else PolicyError(f"HF generation failed: {r.error}"))
            elif not r.cancelled:
                self._deliver(r, self._result(r, r.finish or "length"))
        self._active = [self._active[i] for i in keep]
        if self._cache.cache is not None:
            self._cache.keep(keep)

    def _store_prefix(self, i: int, r: _Row) -> None:
        """Put batch row ``i``'s KV (prompt + completion but its last token, which was never forwarded) in
        the prefix cache, unless the weights changed while it ran."""
        assert self.prefix_cache is not None
        if r.epoch != self.prefix_cache.epoch:
            return
        c = self._cache
        cols = c.mask[i].nonzero().view(-1)
        tokens = r.prompt + r.tokens[:-1]
        if cols.numel() != len(tokens):  # never expected: the mask's real positions are exactly these tokens
            return
        cols = cols.to(self.device)
        layers = [(k[i:i + 1].index_select(2, cols), v[i:i + 1].index_select(2, cols)) for k, v in c.layers_of(c.cache)]
        self.prefix_cache.store(tokens, layers, r.epoch)

    def _note_speed(self, seconds: float) -> None:
        """Once per policy: a CPU policy generating slowly, with vLLM installed, says to use ``vllm:``."""
        self._busy_s += seconds
        if self._hinted or self._busy_s < _HINT_AFTER_S or not str(self.device).startswith("cpu"):
            return
        self._hinted = True
        rate = self._sampled / self._busy_s
        if rate < _HINT_BELOW_TOK_S and _vllm_installed():
            log.warning("HFPolicy generated %.1f tokens/s (prefills included) on this CPU; vLLM is installed and batches faster here: "
                        "use --policy vllm:%s (training: rollout.backend = \"vllm\")", rate, self._model_name)

    def _result(self, r: _Row, reason: str) -> Generation:
        text = self.tokenizer.decode(r.tokens, skip_special_tokens=True) if r.tokens else ""
        text, _ = cut_at_stop(text, r.stop)
        versions = list(r.versions)
        wv: int | list[int] = versions[0] if versions and len(set(versions)) == 1 else (versions or self.weight_version)
        return Generation(text=text, token_ids=list(r.tokens), logprobs=list(r.logprobs), finish_reason=reason,
                          weight_version=wv, prompt_token_ids=list(r.prompt))

    def _deliver(self, r: _Row, value: Generation | BaseException) -> None:
        with self._out_lock:
            self._outstanding.discard(r)

        def _set() -> None:
            if r.future.done():
                return
            if isinstance(value, BaseException):
                r.future.set_exception(value)
            else:
                r.future.set_result(value)

        with contextlib.suppress(RuntimeError):  # the caller's loop is gone
            r.loop.call_soon_threadsafe(_set)

