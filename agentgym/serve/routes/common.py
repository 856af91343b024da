"""Helpers shared by the routers: JSON responses, request bodies, handlers that outlive the client."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response

from agentgym.serve.protocol import MalformedJSON, dumps, loads
from agentgym.serve.service import ServeError, error_of

__all__ = ["fail", "guarded", "json_body", "ok", "shielded"]

T = TypeVar("T")


def ok(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response (``body`` already encoded if it is bytes)."""
    return Response(body if isinstance(body, bytes) else dumps(body), status_code=status, headers=headers,
                    media_type="application/json")


def fail(e: BaseException) -> Response:
    """The structured error response for ``e`` (never a traceback)."""
    err = error_of(e)
    return Response(dumps(err.body()), status_code=err.status, media_type="application/json")


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (``{}`` for an empty body); bad JSON is a ``BadRequest``."""
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = loads(raw)
    except MalformedJSON as e:
        raise ServeError("BadRequest", f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ServeError("BadRequest", "the body must be a JSON object")
    return body


async def shielded(make: Callable[[], Awaitable[T]]) -> T:
    """Run ``make()`` to completion even if the client goes away (session bookkeeping stays right)."""

    async def run() -> T:
        return await make()

    return await asyncio.shield(asyncio.ensure_future(run()))


async def guarded(fn: Callable[[], Awaitable[Any]]) -> Response:
    """:func:`shielded`, answered with :func:`ok` or, for an exception, :func:`fail`."""
    try:
        return ok(await shielded(fn))
    except asyncio.CancelledError:
        raise
    except Exception as e:
        return fail(e)
