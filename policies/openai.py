"""``OpenAIPolicy``: an httpx async client for any OpenAI-compatible server (no openai SDK).

* Messages go to ``POST /chat/completions`` with ``tools``; exact ``prompt_token_ids`` go to
  ``POST /completions`` (vLLM and SGLang accept a list of ids as the prompt).
* Token ids and logprobs come back where the server offers them: with ``vllm_extras=True`` (the
  default) the request asks for ``return_token_ids`` and ``logprobs``, which ``vllm serve`` honours.
  Set ``vllm_extras=False`` for hosted APIs that reject unknown fields.
* Failures: a 4xx is the request's fault and raises :class:`~agentgym.errors.PolicyClientError`
  at once (a context-length 400 raises :class:`~agentgym.errors.ContextLengthExceeded`). A 5xx, a
  429, a refused connection, a timeout or a malformed body is retried ``max_retries`` times with
  exponential backoff, then raises :class:`~agentgym.errors.PolicyServerError` (or
  :class:`~agentgym.errors.PolicyTimeout` when every try timed out).
* Every HTTP call has a timeout, and ``max_concurrency`` caps the requests in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Sequence
from typing import Any

import httpx

from agentgym.errors import (
    ConfigurationError,
    ContextLengthExceeded,
    PolicyClientError,
    PolicyServerError,
    PolicyTimeout,
)
from agentgym.policy import Capabilities, Generation, GenRequest, PolicyLifecycle, describe_policy
from agentgym.types import ToolCall

__all__ = ["OpenAIPolicy"]

_CONTEXT_HINTS = ("maximum context length", "context length", "context_length", "too long", "max_model_len")


class _Retryable(Exception):
    def __init__(self, msg: str, timeout: bool = False, retry_after: float | None = None) -> None:
        super().__init__(msg)
        self.timeout = timeout
        self.retry_after = retry_after


class OpenAIPolicy(PolicyLifecycle):
    """A policy that calls an OpenAI-compatible HTTP server.

    Args:
        base_url: Server root including the version, e.g. ``http://127.0.0.1:8000/v1``.
        model: Model name the server knows; ``None`` asks ``GET /models`` once and takes the first.
        api_key: Bearer token (default: ``$AGENTGYM_API_KEY`` or ``$OPENAI_API_KEY``, if set).
        policy_id: Tag written on every turn this policy generates.
        timeout_s: Read timeout of one HTTP call.
        connect_timeout_s: Connect timeout of one HTTP call.
        max_retries: Retries after the first try (for 5xx, 429, connection errors, timeouts, bad JSON).
        backoff_s: First backoff; doubles each retry (with jitter) up to ``max_backoff_s``.
        max_concurrency: Requests in flight at once.
        vllm_extras: Ask for ``return_token_ids``/``top_k`` (vLLM, SGLang); off for hosted APIs.
        extra_body: Extra JSON fields merged into every request body.
        weight_version: The version reported on each Generation unless the server reports its own: a
            response header ``X-Weight-Version`` or a top-level ``weight_version`` field (what
            a proxy in front of the server may set).
        tokenizer: The served model's tokenizer (an HF tokenizer, or a name/folder for
            :func:`~agentgym.policies.models.load_tokenizer`). With it, :meth:`new_session` keeps
            token-exact sessions whose ids go to ``/completions``.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key: str | None = None,
        policy_id: str = "openai",
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_concurrency: int = 32,
        vllm_extras: bool = True,
        extra_body: dict[str, Any] | None = None,
        weight_version: int = 0,
        tokenizer: Any = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_retries < 0 or max_concurrency < 1 or timeout_s <= 0:
            raise ConfigurationError("need max_retries >= 0, max_concurrency >= 1 and timeout_s > 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.policy_id = policy_id
        self.api_key = api_key if api_key is not None else (os.environ.get("AGENTGYM_API_KEY") or os.environ.get("OPENAI_API_KEY"))
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_concurrency = max_concurrency
        self.vllm_extras = vllm_extras
        self.extra_body = dict(extra_body or {})
        self.weight_version = weight_version
        self.tokenizer = tokenizer
        # token-exact sessions only with the served model's tokenizer (declared, per instance)
        self.capabilities = Capabilities(sessions=tokenizer is not None)
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        self._model_lock: asyncio.Lock | None = None

    # ---------------------------------------------------------------- contract
    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        """One HTTP call per request (``n`` samples each), concurrently up to ``max_concurrency``."""
        if not requests:
            return []
        self._ensure_client()
        model = await self._model_name()
        results = await asyncio.gather(*(self._one(req, model) for req in requests))
        return [g for gens in results for g in gens]

    def describe(self) -> dict[str, Any]:
        return describe_policy(self, backend="openai-compatible http", base_url=self.base_url, model=self.model,
                               weight_version=self.weight_version)

    def new_session(self) -> Any:
        """``new_session()``: a token-exact chat session; its ids go to ``/completions``."""
        from .session import TokenizerChatSession

        if self.tokenizer is None:
            raise ConfigurationError("OpenAIPolicy.new_session() needs tokenizer=... (the served model's tokenizer)")
        if isinstance(self.tokenizer, str):
            from .models import load_tokenizer

            self.tokenizer = load_tokenizer(self.tokenizer)
        return TokenizerChatSession(self.tokenizer)

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # --------------------------------------------------------------- internals
    def _ensure_client(self) -> None:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, headers=headers, limits=limits)
            self._client_loop = loop
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._model_lock = asyncio.Lock()

    async def _model_name(self) -> str:
        if self.model:
            return self.model
        assert self._model_lock is not None
        async with self._model_lock:
            if not self.model:
                data = await self._call("GET", "/models", None)
                try:
                    self.model = str(data["data"][0]["id"])
                except (KeyError, IndexError, TypeError) as e:
                    raise PolicyServerError(f"{self.base_url}/models returned no model list: {str(data)[:200]}") from e
        return self.model

    async def _one(self, req: GenRequest, model: str) -> list[Generation]:
        sp = req.sampling
        body: dict[str, Any] = {"model": model, "n": req.n, "max_tokens": sp.max_tokens,
                                "temperature": sp.temperature, "top_p": sp.top_p}
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.seed is not None:
            body["seed"] = sp.seed
        if self.vllm_extras:
            body["return_token_ids"] = True
            if sp.top_k > 0:
                body["top_k"] = sp.top_k
        if req.prompt_token_ids is not None:
            path = "/completions"
            body["prompt"] = [int(t) for t in req.prompt_token_ids]
            if sp.logprobs:
                body["logprobs"] = 0
        elif req.messages:
            path = "/chat/completions"
            body["messages"] = list(req.messages)
            if req.tools:
                body["tools"] = list(req.tools)
            if sp.logprobs:
                body["logprobs"] = True
        else:
            raise ConfigurationError("a GenRequest needs messages or prompt_token_ids")
        body.update(self.extra_body)
        if sp.max_tokens == 0:
            return [Generation(text="", finish_reason="length", weight_version=self.weight_version,
                               prompt_token_ids=req.prompt_token_ids) for _ in range(req.n)]
        data = await self._call("POST", path, body)
        served = data.pop("_weight_version", None)
        try:
            choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
            gens = [self._parse_choice(c, chat=path == "/chat/completions", stop=sp.stop) for c in choices]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PolicyServerError(f"{self.base_url}{path} returned a response without valid choices: {e!r}; body: {str(data)[:300]}") from e
        if len(gens) != req.n:
            raise PolicyServerError(f"{self.base_url}{path} returned {len(gens)} choices for n={req.n}")
        prompt_ids = data.get("prompt_token_ids") or req.prompt_token_ids
        for g in gens:
            g.prompt_token_ids = list(prompt_ids) if prompt_ids else None
            if served is not None:
                g.weight_version = served
        return gens

    def _parse_choice(self, c: dict[str, Any], *, chat: bool, stop: list[str] | None) -> Generation:
        tool_calls: list[ToolCall] | None = None
        if chat:
            msg = c["message"]
            text = msg.get("content") or ""
            raw_calls = msg.get("tool_calls") or []
            if raw_calls:
                tool_calls = [_tool_call(tc, i) for i, tc in enumerate(raw_calls)]
            lp_items = ((c.get("logprobs") or {}).get("content")) or []
            logprobs = [float(x["logprob"]) for x in lp_items]
            lp_tokens = [str(x.get("token", "")) for x in lp_items]
        else:
            text = c.get("text") or ""
            lp = c.get("logprobs") or {}
            logprobs = [float(x) for x in (lp.get("token_logprobs") or []) if x is not None]
            lp_tokens = [str(t) for t in (lp.get("tokens") or [])]
        token_ids = [int(t) for t in (c.get("token_ids") or [])]
        if not token_ids and lp_tokens and all(t.startswith("token_id:") for t in lp_tokens):
            token_ids = [int(t.split(":", 1)[1]) for t in lp_tokens]  # --return-tokens-as-token-ids
        if token_ids and logprobs and len(logprobs) != len(token_ids):
            logprobs = []  # cannot align them; better none than wrong
        reason = c.get("finish_reason") or "stop"
        if reason == "tool_calls":
            reason = "stop"
        if reason not in ("stop", "length"):
            reason = "stop" if reason in ("eos", "stop_sequence", "end_turn") else "length" if reason == "max_tokens" else reason
        return Generation(text=text, token_ids=token_ids, logprobs=logprobs, finish_reason=reason,
                          weight_version=self.weight_version, tool_calls=tool_calls)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        assert self._client is not None and self._sem is not None
        last: _Retryable | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                if last is not None and last.retry_after is not None:
                    delay = min(self.max_backoff_s, max(delay, last.retry_after))
                await asyncio.sleep(delay)
            try:
                async with self._sem:
                    return await self._try(method, path, body)
            except _Retryable as e:
                last = e
        assert last is not None
        tries = self.max_retries + 1
        if last.timeout:
            raise PolicyTimeout(f"{method} {self.base_url}{path} timed out on all {tries} tries: {last}")
        raise PolicyServerError(f"{method} {self.base_url}{path} failed after {tries} tries: {last}")

    async def _try(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        assert self._client is not None
        try:
            resp = await self._client.request(method, path, json=body)
        except httpx.TimeoutException as e:
            raise _Retryable(f"timeout ({type(e).__name__})", timeout=True) from e
        except httpx.TransportError as e:
            raise _Retryable(f"cannot reach the server ({type(e).__name__}: {e})") from e
        if resp.status_code == 429 or resp.status_code >= 500:
            ra = resp.headers.get("retry-after")
            retry_after = float(ra) if ra and ra.replace(".", "", 1).isdigit() else None
            raise _Retryable(f"HTTP {resp.status_code}: {resp.text[:300]}", retry_after=retry_after)
        if resp.status_code >= 400:
            detail = _error_detail(resp)
            if resp.status_code in (400, 413) and any(h in detail.lower() for h in _CONTEXT_HINTS):
                raise ContextLengthExceeded(f"{self.base_url}{path}: the prompt does not fit the model's context: {detail}")
            hint = " Check the api key." if resp.status_code in (401, 403) else ""
            if resp.status_code == 404:
                hint = f" Check base_url ({self.base_url}) and the model name ({self.model})."
            raise PolicyClientError(f"{method} {self.base_url}{path} -> HTTP {resp.status_code}: {detail}.{hint}")
        try:
            data = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _Retryable(f"malformed JSON in the response ({e}): {resp.text[:200]!r}") from e
        if not isinstance(data, dict):
            raise _Retryable(f"expected a JSON object, got {type(data).__name__}: {resp.text[:200]!r}")
        served = resp.headers.get("x-weight-version", data.get("weight_version"))
        if served is not None:
            try:
                data["_weight_version"] = int(served)
                self.weight_version = max(self.weight_version, int(served))
            except (TypeError, ValueError):
                pass
        return data


def _error_detail(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return resp.text[:300]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        return str(err)[:500]
    return str(data)[:300]


def _tool_call(tc: dict[str, Any], index: int) -> ToolCall:
    """OpenAI's ``{id, type, function: {name, arguments: str}}`` -> ToolCall (arguments as a dict).

    Arguments that are not a JSON object are passed through in OpenAI form, so the env's parser
    turns them into an observation for the agent instead of this policy raising.
    """
    fn = tc.get("function") or {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):  # bad JSON, or an integer past Python's digit limit
            return tc  # type: ignore[return-value]
        args = parsed
    if not isinstance(args, dict):
        return tc  # type: ignore[return-value]
    name = fn.get("name")
    if not isinstance(name, str):
        raise ValueError(f"tool call #{index} has no function name: {tc}")
    return {"id": str(tc.get("id") or f"call_{index}"), "name": name, "arguments": args}
