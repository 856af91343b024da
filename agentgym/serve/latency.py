"""A TCP proxy that adds network latency, to measure env services as if across a WAN.

Each byte is forwarded ``rtt_s / 2`` after it arrives, in both directions, in order (no bandwidth
limit, no loss)::

    with LatencyProxy("127.0.0.1", 8100, rtt_s=0.1) as proxy:
        env = RemoteEnv(proxy.url)      # every round trip now takes >= 100 ms
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

__all__ = ["LatencyProxy"]


class LatencyProxy:
    """Forward ``127.0.0.1:<port>`` to ``host:port`` with ``rtt_s`` of added round-trip time.

    Args:
        host: Target host.
        port: Target port.
        rtt_s: Added round-trip time (half each way).
        listen_host: Interface to listen on.
    """

    def __init__(self, host: str, port: int, rtt_s: float, listen_host: str = "127.0.0.1") -> None:
        self.target = (host, int(port))
        self.delay = max(0.0, float(rtt_s)) / 2
        self.listen_host = listen_host
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://{self.listen_host}:{self.port}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(65536)
                await queue.put((time.monotonic() + self.delay, data))
                if not data:
                    break
            await sender
        except (ConnectionError, asyncio.CancelledError):
            sender.cancel()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        a = asyncio.ensure_future(self._pipe(client_r, server_w))
        b = asyncio.ensure_future(self._pipe(server_r, client_w))
        try:
            await asyncio.gather(a, b, return_exceptions=True)
        except asyncio.CancelledError:  # shutting down (a cancelled handler upsets asyncio.streams on 3.11)
            a.cancel()
            b.cancel()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def main() -> None:
            self._server = await asyncio.start_server(self._handle, self.listen_host, 0)
            self.port = int(self._server.sockets[0].getsockname()[1])
            self._ready.set()
            async with self._server:
                await self._server.serve_forever()

        with contextlib.suppress(asyncio.CancelledError, RuntimeError):
            loop.run_until_complete(main())
        rest = asyncio.all_tasks(loop)
        for t in rest:
            t.cancel()
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        loop.close()

    def start(self) -> LatencyProxy:
        self._thread = threading.Thread(target=self._run, daemon=True, name="agentgym-latency-proxy")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("latency proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            loop, server = self._loop, self._server

            def _stop() -> None:
                server.close()
                for t in asyncio.all_tasks(loop):
                    t.cancel()

            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_stop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
