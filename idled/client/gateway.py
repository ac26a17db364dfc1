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

*Devices.* Every uid argument is a *session key*: a plain uid (the user's one session, as before devices) or
a tuple ``(uid, device)`` -- one device of a user, which the server keeps as a session of its own: the user
is online while any of its keys lives, and its `offline` comes when the last one goes. Tuples go on the wire
as ``[uid, device]`` and come back in `ended` notices as the same tuples. `attach` checks tuple keys
(`idled.client.core.check_key`) and raises ValueError for a malformed one; pass tuples, not lists.

After a reconnect the server has forgotten this gateway's uids (they went offline with `gateway_lost`), so
the first thing sent on the new connection is an `attach` of every uid still live, with its keepalive. That
rule, the login, the backoff and the notices' effect on the live uids are `idled.client.gatewaylink`'s,
shared with the edge's link to its core; this module adds the application's side: the calls, the flusher,
the notice queue and the answer to marks.

Session-ended notices: given `on_ended(uids, reason)` or `notices=True`, the gateway logs in with
`"ended": true` and the server tells it which of its sessions it ended: reason `idle` (timed out), `kicked`
(a newer login elsewhere) or `shutdown` (the server is stopping); other reasons may come later and mean
"ended". One notice is one server frame: a tuple of session keys -- uids, or ``(uid, device)`` tuples as
they were attached -- (a tick's expiries travel together) and a reason.
The callback is called (and awaited, if it returns an awaitable) in the reader task, once per notice;
with `notices=True` the notices are also queued for ``async for uids, reason in gateway.ended()``, at most
`NOTICE_BUFFER` of them: when the application falls that far behind, the reader waits (and stops reading
the connection) until it catches up -- nothing is dropped. An `idle` or `kicked` uid is no longer live (it
is not re-attached after a reconnect); a `shutdown` one stays live, so it is re-attached when the server is
back. Without either option the login is unchanged and the server never sends the message.

Watermarks: with `marks=True` the gateway logs in with `"marks": true` and answers the server's `mark`
requests after sending everything the application had reported before the request arrived: the server then
holds a session due while the gateway lags -- its batch, its link, the server's socket -- instead of
taking it offline, and keeps the gateway's sessions for its grace period when the connection breaks, so the
reconnect (which attaches every live uid again) resumes them with no event (docs/protocol.md, "Watermarks").
The application's own lag before it calls `touch` is not covered: report activity as it happens.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Final

from idled.client.core import DEFAULT_FLUSH_INTERVAL, DEFAULT_MAX_PENDING, Backoff, check_key
from idled.client.errors import ClientError
from idled.client.gatewaylink import EndedCallback, GatewayLink
from idled.client.leader import Hosts
from idled.client.link import Conn, Mailbox, Runtime
from idled.protocol import Marked, SessionKey, encode

__all__ = ["Gateway", "NOTICE_BUFFER", "EndedCallback"]

NOTICE_BUFFER: Final = 1024  # ended notices (frames) queued for `ended()` before the reader waits


class _Notices:
    """The async iterator of `Gateway.ended()` (a class, not an async generator: breaking out of the loop
    leaves nothing to finalise)."""

    __slots__ = ("gateway", "mailbox")

    def __init__(self, gateway: Gateway, mailbox: Mailbox[tuple[tuple[SessionKey, ...], str]]) -> None:
        self.gateway = gateway
        self.mailbox = mailbox

    def __aiter__(self) -> _Notices:
        return self

    async def __anext__(self) -> tuple[tuple[SessionKey, ...], str]:
        notice = await self.mailbox.get()
        if notice is None:
            if isinstance(self.gateway.error, ClientError):
                raise self.gateway.error
            raise StopAsyncIteration
        return notice


class Gateway(GatewayLink):
    """A gateway connection; create it through `idled.client.trio.open_gateway` or the asyncio twin."""

    def __init__(self, runtime: Runtime, host: Hosts, port: int | None, name: str, *, token: str | None = None,
                 flush_interval: float = DEFAULT_FLUSH_INTERVAL, max_pending: int = DEFAULT_MAX_PENDING,
                 on_ended: EndedCallback | None = None, notices: bool = False, marks: bool = False,
                 reconnect: bool = True,
                 backoff: Backoff | None = None, connect_timeout: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        super().__init__(runtime, host, port, name, token=token, ended=on_ended is not None or notices, marks=marks,
                         on_ended=on_ended, max_pending=max_pending, reconnect=reconnect, backoff=backoff,
                         connect_timeout=connect_timeout, ssl_context=ssl_context, server_hostname=server_hostname)
        if not flush_interval > 0:
            raise ValueError("flush_interval must be positive")
        self.flush_interval = flush_interval
        self._notices: Mailbox[tuple[tuple[SessionKey, ...], str]] | None = (
            Mailbox(runtime, NOTICE_BUFFER) if notices else None)
        self._wake = runtime.event()

    def ended(self) -> _Notices:
        """``async for uids, reason in gateway.ended()``: the session-ended notices (needs `notices=True`).
        Stops when the gateway is closed; raises the gateway's final error if it ended with one. Leaving the
        loop early loses nothing: the next ``ended()`` goes on from the next notice. One consumer at a time."""
        if self._notices is None:
            raise ValueError("ended() needs Gateway(notices=True)")
        return _Notices(self, self._notices)

    async def attach(self, uids: Iterable[SessionKey], keepalive: float | None = None) -> None:
        """These sessions connected through this gateway (`keepalive` sets their timeout, as for users): each a
        uid, or a tuple ``(uid, device)`` for one device of a user (ValueError for anything else)."""
        keys = tuple(uids)
        for key in keys:
            if type(key) is not str and type(key) is not int:  # (plain uids are the server's to check, as ever)
                check_key(key)
        self.batch.attach(keys, keepalive, self.runtime.now())
        await self._queued()

    async def touch(self, uids: Iterable[SessionKey]) -> None:
        """Activity from these sessions (uids or (uid, device) keys, as attached)."""
        self.batch.touch(uids, self.runtime.now())
        await self._queued()

    async def detach(self, uids: Iterable[SessionKey]) -> None:
        """These sessions disconnected (a user goes offline, reason `detach`, when its last session goes)."""
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
            await self._write(conn, self.batch.take(self.max_frame))

    async def aclose(self, linger: float = 1.0) -> None:
        """Flush, then log out: the server detaches every live uid (reason `gateway_lost`)."""
        if self.connected and self.batch.pending:
            await self.flush()
        await super().aclose(linger)

    async def _on_mark(self, t: float) -> None:
        await self.flush()  # everything reported before the request, ahead of the answer
        await self.send_frame(encode(Marked(t)))

    async def _on_ended(self, uids: tuple[SessionKey, ...], reason: str) -> None:
        await super()._on_ended(uids, reason)
        if self._notices is not None:
            await self._notices.put((uids, reason))

    def _on_done(self) -> None:
        if self._notices is not None:
            self._notices.close()

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
