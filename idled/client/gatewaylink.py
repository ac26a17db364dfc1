"""The gateway side of the protocol, written once: the client library's `Gateway` and the edge's `CoreLink`.

Theory of operation
-------------------
A gateway link is a `Link` (`idled.client.link`: connect, log in, reconnect after a full-jitter backoff
counted from the last successful login) that logs in as a gateway, with a `GatewayBatcher`
(`idled.client.core`) holding the pending attach / touch / detach operations and the live uids. What every
gateway must do the same way is here, so a fix lands in both users at once:

* *Login.* ``ended`` and ``marks`` opt in to session-ended notices and to watermark requests.
* *Re-attach on welcome.* The server forgot the uids of a lost connection (``gateway_lost``) -- or, for a
  gateway with marks, kept them for its grace period, and an attach by the same name resumes them with no
  event. So on every welcome, before any operation can be filed for the new connection, whatever was pending
  is replaced by an attach of every live uid (grouped by keepalive, split under the welcome's ``max_frame``),
  and those frames are the first ones written on the connection (`_send_first`: at once by default; the
  edge hands them to its single writer). `up` turns true in that same step, with no checkpoint in between,
  and false when the connection ends: whatever is filed while `up` lands after the re-attach.
* *Session keys.* What a gateway attaches, touches, detaches and is told ``ended`` about is a session key
  (`idled.protocol.SessionKey`): a plain uid, or ``(uid, device)`` for one device of a user. They are
  batched, kept live and re-attached alike (``idled.client.core``); ``ended`` reports them as attached.
* *Notices.* ``ended`` frames go to `_on_ended`: by default an ``idle`` or ``kicked`` uid is forgotten (it
  is not re-attached after a reconnect; a ``shutdown`` one stays live, to be re-attached when the server is
  back), then ``on_ended(uids, reason)`` is called (and awaited if it returns an awaitable). ``mark``
  requests go to `_on_mark` and pongs to `_on_pong`: each role answers them its own way (the application's
  gateway from its reader, after a flush; the edge from its writer, after its loop turns).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

from idled.client.core import DEFAULT_MAX_PENDING, Backoff, GatewayBatcher
from idled.client.leader import Hosts
from idled.client.link import Conn, Link, Runtime
from idled.protocol import DEFAULT_MAX_FRAME, Ended, Login, Mark, Pong, SessionKey, Welcome

__all__ = ["EndedCallback", "GatewayLink"]

EndedCallback = Callable[[tuple[SessionKey, ...], str], Any]


class GatewayLink(Link):
    """A gateway's connection: batching, re-attach on welcome, notices. Subclassed by `Gateway` (the
    application's API) and `idled.server.edge.link.CoreLink` (an edge's users, relayed as one gateway)."""

    def __init__(self, runtime: Runtime, host: Hosts, port: int | None, name: str, *, token: str | None = None,
                 ended: bool = False, marks: bool = False, on_ended: EndedCallback | None = None,
                 max_pending: int = DEFAULT_MAX_PENDING, reconnect: bool = True, backoff: Backoff | None = None,
                 connect_timeout: float = 10.0, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None) -> None:
        super().__init__(runtime, host, port, Login("gateway", name, token, None, ended, marks), reconnect=reconnect,
                         backoff=backoff, connect_timeout=connect_timeout,
                         ssl_context=ssl_context, server_hostname=server_hostname)
        self.batch = GatewayBatcher(max_pending)
        self.on_ended = on_ended
        self.max_frame = DEFAULT_MAX_FRAME
        self.up = False  # the live uids are re-attached on the current connection (see the module docstring)

    @property
    def live(self) -> int:
        """Sessions (keys) attached through this gateway and not detached (nor ended by the server)."""
        return len(self.batch.live)

    async def _on_welcome(self, conn: Conn, welcome: Welcome) -> None:
        self.max_frame = welcome.max_frame or DEFAULT_MAX_FRAME
        self.up = True
        self.batch.reattach(self.runtime.now())
        await self._send_first(conn, self.batch.take(self.max_frame))

    async def _send_first(self, conn: Conn, frames: list[bytes]) -> None:
        """Write the re-attach, before anything else is sent on `conn`."""
        await self._write(conn, frames)

    async def _write(self, conn: Conn, frames: list[bytes]) -> None:
        """`frames` in one write (none: nothing); the caller is the connection's only writer for now."""
        if frames:
            await conn.send_all(b"".join(frames))
            self.frames_sent += len(frames)

    async def _on_message(self, message: Any) -> None:
        kind = type(message)
        if kind is Ended:
            await self._on_ended(message.uids, message.reason)
        elif kind is Mark:
            await self._on_mark(message.t)
        elif kind is Pong:
            self._on_pong()

    async def _on_ended(self, uids: tuple[SessionKey, ...], reason: str) -> None:
        """The server ended these sessions (see the module docstring)."""
        if reason != "shutdown":
            self.batch.forget(uids)
        await self._notify(uids, reason)

    async def _notify(self, uids: tuple[SessionKey, ...], reason: str) -> None:
        if self.on_ended is not None:
            result = self.on_ended(uids, reason)
            if result is not None and hasattr(result, "__await__"):
                await result

    async def _on_mark(self, t: float) -> None:
        """Answer ``marked(t)`` once everything reported before the request is sent."""
        raise NotImplementedError  # only a link that logs in with marks is asked

    def _on_pong(self) -> None:
        """A pong (an answer to this link's ping)."""

    def _on_disconnect(self) -> None:
        self.up = False
