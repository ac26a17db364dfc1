"""A gateway: report attach / touch / detach of many uids in few frames, and re-attach after reconnects.

Theory of operation
-------------------
`attach`, `touch` and `detach` only record the operation in a `GatewayBatcher` (see `idled.client.core`) and
return at once -- unless `max_pending` uids are already buffered, in which case the call sends the batch
itself first (back-pressure: memory stays bounded however fast the application reports). A background task
sends whatever is pending `flush_interval` seconds after the oldest pending operation, as frames no larger
than the limit the server announced in `welcome.max_frame`, all in one write. So 10,000 touches of the same
few thousand uids within one interval cost one or two frames, and the detector sees each touch at most
`flush_interval` late (keep it well below the users' timeouts).

After a reconnect the server has forgotten this gateway's uids (they went offline with `gateway_lost`), so
the first thing sent on the new connection is an `attach` of every uid still live, with its keepalive.

Session-ended notices: given `on_ended(uid, reason)`, the gateway logs in with `"ended": true` and the
server tells it which of its sessions it ended: reason `idle` (timed out), `kicked` (a newer login
elsewhere) or `shutdown` (the server is stopping). An `idle` or `kicked` uid is no longer live (it is not
re-attached after a reconnect); a `shutdown` one stays live, so it is re-attached when the server is back.
Without `on_ended` the login is unchanged and the server never sends the message.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterable
from typing import Any

from idled.client.core import DEFAULT_FLUSH_INTERVAL, DEFAULT_MAX_PENDING, Backoff, GatewayBatcher
from idled.client.link import Conn, Link, Runtime
from idled.protocol import DEFAULT_MAX_FRAME, Ended, Login, Uid, Welcome

__all__ = ["Gateway"]


class Gateway(Link):
    """A gateway connection; create it through `idled.client.trio.open_gateway` or the asyncio twin."""

    def __init__(self, runtime: Runtime, host: str, port: int, name: str, *, token: str | None = None,
                 flush_interval: float = DEFAULT_FLUSH_INTERVAL, max_pending: int = DEFAULT_MAX_PENDING,
                 on_ended: Callable[[Uid, str], Any] | None = None, reconnect: bool = True,
                 backoff: Backoff | None = None, connect_timeout: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        super().__init__(runtime, host, port, Login("gateway", name, token, None, on_ended is not None), reconnect=reconnect,
                         backoff=backoff, connect_timeout=connect_timeout,
                         ssl_context=ssl_context, server_hostname=server_hostname)
        if not flush_interval > 0:
            raise ValueError("flush_interval must be positive")
        self.flush_interval = flush_interval
        self.batch = GatewayBatcher(max_pending)
        self.on_ended = on_ended
        self.max_frame = DEFAULT_MAX_FRAME
        self._wake = runtime.event()

    @property
    def live(self) -> int:
        """Uids attached through this gateway and not detached."""
        return len(self.batch.live)

    async def attach(self, uids: Iterable[Uid], keepalive: float | None = None) -> None:
        """These uids connected through this gateway (`keepalive` sets their timeout, as for users)."""
        self.batch.attach(uids, keepalive, self.runtime.now())
        await self._queued()

    async def touch(self, uids: Iterable[Uid]) -> None:
        """Activity from these uids."""
        self.batch.touch(uids, self.runtime.now())
        await self._queued()

    async def detach(self, uids: Iterable[Uid]) -> None:
        """These uids disconnected (they go offline with reason `detach`)."""
        self.batch.detach(uids, self.runtime.now())
        await self._queued()

    async def _queued(self) -> None:
        batch = self.batch
        # Flushing inline when the batch is full or overdue bounds memory and latency even when the caller
        # reports in a tight loop that never lets the background flusher run.
        if batch.full or (batch.first_pending is not None
                          and self.runtime.now() >= batch.first_pending + self.flush_interval):
            await self.flush()
        elif not self._wake.is_set():
            self._wake.set()

    async def flush(self) -> None:
        """Send everything pending now (waits while reconnecting)."""
        async with self._send_lock:
            conn = await self.wait_connected()
            frames = self.batch.take(self.max_frame)
            if frames:
                await conn.send_all(b"".join(frames))
                self.frames_sent += len(frames)

    async def aclose(self, linger: float = 1.0) -> None:
        """Flush, then log out: the server detaches every live uid (reason `gateway_lost`)."""
        if self.connected and self.batch.pending:
            await self.flush()
        await super().aclose(linger)

    async def _on_welcome(self, conn: Conn, welcome: Welcome) -> None:
        self.max_frame = welcome.max_frame or DEFAULT_MAX_FRAME
        self.batch.reattach(self.runtime.now())
        frames = self.batch.take(self.max_frame)
        if frames:
            await conn.send_all(b"".join(frames))
            self.frames_sent += len(frames)

    async def _on_message(self, message: Any) -> None:
        if type(message) is Ended and self.on_ended is not None:
            live = self.batch.live
            for uid in message.uids:
                if message.reason != "shutdown":
                    live.pop(uid, None)
                result = self.on_ended(uid, message.reason)
                if result is not None and hasattr(result, "__await__"):
                    await result

    async def _background(self, conn: Conn) -> None:
        runtime, batch = self.runtime, self.batch
        while True:
            if batch.first_pending is None:
                self._wake = runtime.event()
                await self._wake.wait()
                continue
            delay = batch.first_pending + self.flush_interval - runtime.now()
            if delay > 0:
                await runtime.sleep(delay)
            await self.flush()
