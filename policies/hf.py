"""``HFPolicy``: a transformers causal LM behind the async Policy contract (CPU by default).

Requests are batched with left padding; every row keeps its own sampling settings (temperature,
top-k, top-p, ``max_tokens``, stop strings) inside one ``generate`` call. The logprob returned for
each sampled token is the model's own log-probability at temperature 1, before temperature, top-k
and top-p (what vLLM returns by default), which is what the trainer recomputes.

Requests with a ``seed`` run one row at a time and are reproducible (sample ``j`` of ``n`` uses
``seed + j``). Generation runs in a worker thread so the event loop keeps stepping envs; each call has a deadline
(``timeout_s``) after which the batch is stopped and :class:`~agentgym.errors.PolicyTimeout` raised.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
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

from ._common import PreparedPrompt, Truncation, cut_at_stop, prepare_prompts
from .session import OnMismatch, TokenizerChatSession
from .weights import apply_update, check_version

__all__ = ["HFPolicy"]

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "auto": "auto"}


@dataclass
class _Row:
    req_index: int
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    seed: int | None = None  # sample j of a seeded request uses seed + j


class HFPolicy(PolicyLifecycle):
    """A transformers model as a :class:`~agentgym.policy.TokenPolicy`.

    Args:
        model: Known short name (``smollm2-135m-instruct``), local folder or HF hub id.
        policy_id: Tag written on every turn this policy generates.
        device: Torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``...).
        dtype: ``"float32"`` (CPU default), ``"bfloat16"``, ``"float16"`` or ``"auto"``.
        max_batch_size: Rows per ``generate`` call (requests x n are split into chunks).
        context_length: Override the model's context (default: ``max_position_embeddings``).
        truncation: ``"error"`` raises ContextLengthExceeded for an over-long prompt; ``"left"``
            drops its oldest tokens.
        timeout_s: Deadline of one :meth:`generate` call.
        on_mismatch: Passed to :class:`~agentgym.policies.session.TokenizerChatSession`.
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        *,
        policy_id: str = "hf",
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 16,
        context_length: int | None = None,
        truncation: Truncation = "error",
        timeout_s: float = 600.0,
        on_mismatch: OnMismatch = "raise",
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
        self.policy_id = policy_id
        self.model_path = resolve_model(model)
        self.tokenizer = load_tokenizer(self.model_path)
        torch_dtype: Any = "auto" if _DTYPES[dtype] == "auto" else getattr(torch, _DTYPES[dtype])
        try:
            self.model: Any = transformers.AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype)
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
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.weight_version = 0
        self._lock = threading.Lock()
        self._closed = False

    capabilities = Capabilities(sessions=True, weight_updates=True)

    # ---------------------------------------------------------------- contract
    def new_session(self) -> TokenizerChatSession:
        """A token-exact chat session over this model's tokenizer."""
        return TokenizerChatSession(self.tokenizer, on_mismatch=self.on_mismatch)

    def describe(self) -> dict[str, Any]:
        return describe_policy(self, backend="transformers", model_path=str(self.model_path), device=str(self.device),
                               dtype=str(self.model.dtype).replace("torch.", ""), weight_version=self.weight_version,
                               context_length=self.context_length)

    async def aclose(self) -> None:
        """Release the model (the policy cannot generate afterwards)."""
        self._closed = True

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        """Generate ``n`` completions per request (request-major order)."""
        if not requests:
            return []
        if self._closed:
            raise PolicyError("this HFPolicy was closed; create a new one")
        prompts = prepare_prompts(self.tokenizer, requests, self.context_length, self.truncation)
        cancel = threading.Event()
        task = asyncio.ensure_future(asyncio.to_thread(self._generate_sync, list(requests), prompts, cancel))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a timed-out batch's error is not lost noise
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            cancel.set()
            raise PolicyTimeout(
                f"HFPolicy.generate exceeded timeout_s={self.timeout_s:g}s for {len(requests)} request(s); "
                "raise timeout_s or lower max_tokens"
            ) from None
        except asyncio.CancelledError:
            cancel.set()
            raise

    # ----------------------------------------------------------------- weights
    def state_dict(self) -> dict[str, Any]:
        """The model's current weights (tensors shared with the model)."""
        return dict(self.model.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any], version: int | None = None, strict: bool = True) -> None:
        """Load full weights (waits for the batch in flight) and optionally bump the version."""
        with self._lock:
            if version is not None:
                check_version(self.weight_version, version)
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
            tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
            if strict and (set(missing) - tied or unexpected):
                raise ConfigurationError(f"state dict mismatch: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
            if version is not None:
                self.weight_version = version

    def update_weights(self, update: Any, version: int) -> list[str]:
        """Apply full tensors or a delta (see :mod:`agentgym.policies.weights`) between batches.

        Returns:
            The names of the tensors that changed.
        """
        with self._lock:
            check_version(self.weight_version, version)
            state = self.model.state_dict(keep_vars=True)
            changed = apply_update({k: v.data for k, v in state.items()}, update)
            self.weight_version = version
            return changed

    async def update_weights_async(self, update: Any, version: int) -> list[str]:
        """:meth:`update_weights` without blocking the event loop."""
        return await asyncio.to_thread(self.update_weights, update, version)

    # --------------------------------------------------------------- internals
    def _generate_sync(self, requests: list[GenRequest], prompts: list[PreparedPrompt], cancel: threading.Event) -> list[Generation]:
        rows: list[_Row] = []
        for i, (req, p) in enumerate(zip(requests, prompts, strict=True)):
            seed = req.sampling.seed
            rows += [_Row(i, p.ids, req.sampling, p.max_tokens, None if seed is None else seed + j) for j in range(req.n)]
        results: list[Generation | None] = [None] * len(rows)
        with self._lock:
            version = self.weight_version
            # seeded rows run alone (reproducible); the rest in chunks of max_batch_size
            plain = [k for k, r in enumerate(rows) if r.seed is None and r.max_tokens > 0]
            seeded = [[k] for k, r in enumerate(rows) if r.seed is not None and r.max_tokens > 0]
            chunks = [plain[j : j + self.max_batch_size] for j in range(0, len(plain), self.max_batch_size)]
            for k, r in enumerate(rows):
                if r.max_tokens == 0:
                    results[k] = Generation(text="", finish_reason="length", weight_version=version, prompt_token_ids=list(r.prompt))
            for chunk in chunks + seeded:
                if cancel.is_set():
                    break
                for k, gen in zip(chunk, self._run_batch([rows[k] for k in chunk], version, cancel), strict=True):
                    results[k] = gen
        if cancel.is_set() or any(g is None for g in results):
            raise PolicyTimeout("HFPolicy generation was cancelled at its deadline")
        return [g for g in results if g is not None]

    def _run_batch(self, rows: list[_Row], version: int, cancel: threading.Event) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        width = max(len(r.prompt) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, width - len(r.prompt) :] = torch.tensor(r.prompt, dtype=torch.long)
            mask[b, width - len(r.prompt) :] = 1
        recorder = _LogprobRecorder()
        warper = _RowWarper(rows)
        stopper = _RowStopper(rows, width, self.tokenizer, cancel)
        gen_cfg = GenerationConfig(
            do_sample=True,
            max_new_tokens=max(r.max_tokens for r in rows),
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            bos_token_id=self.model.generation_config.bos_token_id,
        )
        seed = rows[0].seed if len(rows) == 1 else None
        devices = [torch.device(self.device)] if str(self.device).startswith("cuda") else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            try:
                out = self.model.generate(
                    input_ids=ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    generation_config=gen_cfg,
                    logits_processor=LogitsProcessorList([recorder, warper]),
                    stopping_criteria=StoppingCriteriaList([stopper]),
                )
            except RuntimeError as e:
                raise PolicyError(f"HF generate failed: {e}") from e
        seqs: Any = out if isinstance(out, torch.Tensor) else out.sequences
        seqs = seqs.cpu()
        logprobs = recorder.finish(seqs[:, -1]) if recorder.steps else torch.zeros((len(rows), 0))
        gens: list[Generation] = []
        for b, r in enumerate(rows):
            new = seqs[b, width:].tolist()
            eos_cut = next((t + 1 for t, tok in enumerate(new) if tok in self.eos_ids), None)
            s_len = stopper.stopped_at[b]
            if eos_cut is not None and (s_len is None or eos_cut <= s_len):
                cut, reason = eos_cut, "stop"
            elif s_len is not None:
                cut, reason = s_len, stopper.reason[b] or "length"
            else:
                cut, reason = min(len(new), r.max_tokens), "length"
            toks = new[:cut]
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            text, _ = cut_at_stop(text, r.sampling.stop)
            lps = [float(x) for x in logprobs[b, :cut].tolist()] if r.sampling.logprobs else []
            gens.append(Generation(text=text, token_ids=toks, logprobs=lps, finish_reason=reason,
                                   weight_version=version, prompt_token_ids=list(r.prompt)))
        return gens


class _LogprobRecorder:
    """First logits processor: keeps log_softmax of the raw logits; gathers the sampled token next step."""

    def __init__(self) -> None:
        self.prev: Any = None
        self.cols: list[Any] = []
        self.steps = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.prev is not None:
            self.cols.append(self.prev.gather(1, input_ids[:, -1:].to(self.prev.device)).squeeze(1).cpu())
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        self.steps += 1
        return scores

    def finish(self, last_tokens: Any) -> Any:
        import torch

        self.cols.append(self.prev.gather(1, last_tokens.view(-1, 1).to(self.prev.device)).squeeze(1).cpu())
        self.prev = None
        return torch.stack(self.cols, dim=1)


class _RowWarper:
    """Per-row temperature, top-k and top-p (temperature 0 = greedy)."""

    def __init__(self, rows: list[_Row]) -> None:
        self.temps = [r.sampling.temperature for r in rows]
        self.top_k = [r.sampling.top_k for r in rows]
        self.top_p = [r.sampling.top_p for r in rows]
        self.trivial = all(t == 1.0 for t in self.temps) and all(k <= 0 for k in self.top_k) and all(p >= 1.0 for p in self.top_p)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.trivial:
            return scores
        scores = scores.float().clone()
        neg = torch.finfo(scores.dtype).min
        temps = torch.tensor(self.temps, dtype=scores.dtype, device=scores.device)
        greedy = temps <= 0
        if bool(greedy.any()):
            best = scores.argmax(dim=-1, keepdim=True)
            onehot = torch.full_like(scores, neg).scatter_(1, best, 0.0)
            scores = torch.where(greedy.unsqueeze(1), onehot, scores)
        scale = torch.where(greedy | (temps == 1.0), torch.ones_like(temps), temps)
        scores = scores / scale.unsqueeze(1)
        for b in range(scores.shape[0]):
            if bool(greedy[b]):
                continue
            row = scores[b]
            k = self.top_k[b]
            if 0 < k < row.numel():
                kth = torch.topk(row, k).values[-1]
                row.masked_fill_(row < kth, neg)
            p = self.top_p[b]
            if p < 1.0:
                sorted_vals, order = torch.sort(row, descending=True)
                probs = torch.softmax(sorted_vals, dim=-1)
                drop = probs.cumsum(-1) - probs > p  # keep the smallest set reaching p
                row[order[drop]] = neg
        return scores


class _RowStopper:
    """Per-row max_tokens and stop strings; all rows stop when the deadline's event is set."""

    def __init__(self, rows: list[_Row], prompt_width: int, tokenizer: Any, cancel: threading.Event) -> None:
        self.max_tokens = [r.max_tokens for r in rows]
        self.stops = [[s for s in (r.sampling.stop or []) if s] for r in rows]
        self.tail = max([len(s) for ss in self.stops for s in ss] or [0]) + 8
        self.width = prompt_width
        self.tokenizer = tokenizer
        self.cancel = cancel
        self.stopped_at: list[int | None] = [None] * len(rows)
        self.reason: list[str | None] = [None] * len(rows)

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        n = input_ids.shape[1] - self.width
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if self.cancel.is_set():
            return done | True
        for b in range(input_ids.shape[0]):
            if self.stopped_at[b] is not None:
                done[b] = True
                continue
            if self.stops[b]:
                tail = self.tokenizer.decode(input_ids[b, max(self.width, input_ids.shape[1] - self.tail) :].tolist(),
                                             skip_special_tokens=True)
                if any(s in tail for s in self.stops[b]):
                    self.stopped_at[b], self.reason[b] = n, "stop"
                    done[b] = True
                    continue
            if n >= self.max_tokens[b]:
                self.stopped_at[b], self.reason[b] = n, "length"
                done[b] = True
        return done
