"""Connections: what every peer role shares -- admission, the login step, the error frame, role dispatch.

Theory of operation
-------------------
``Doorway.handle(stream)`` is the handler the accept loop runs for each connection (and tests hand memory
streams to directly). It counts the connection as *pending*, refuses it while shutting down or beyond
``max_connections``, passes it through the door's gate (``idled.door.gate``: the source address's share of
logins in progress, then the PROXY header from an allowed balancer and the TLS handshake when configured --
all within the login deadline; a refusal is counted by its reason and answered with an error frame where one
can be sent), reads the login -- its frame capped at ``MAX_LOGIN_FRAME`` whatever ``max_frame`` allows later,
so an unauthenticated peer holds little -- within ``login_timeout`` (verifying its
token when auth is on: ``auth_secret``; or, for a gateway, observer or standby, a client certificate naming
it), gives its source's share back, then counts it under its role and runs that role's handler -- a callable ``role(stream, decoder, login)``
from the ``roles`` table the server fills in (``users.run_user``, ``Gateways.run``, ``Observers.run``,
``Replicas.serve``). A
``ProtocolError`` raised anywhere below is counted (``idled_frames_rejected_total``) and answered with one
error frame before the connection closes; any other exception is a bug, logged, and never takes the server
down.

Closing a connection from another task (idle expiry, duplicate login, shutdown) is a cancellation: each
``Connection`` owns a ``CancelScope``; the canceller records why (``close``), the connection's own task sends
the error frame itself and closes. Only the connection's own task ever writes to a user's socket.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final, Protocol

import trio

from idled.core.presence import Uid
from idled.door.door import reload_gate
from idled.door.gate import Gate, Refused
from idled.door.websocket import UPGRADE, OriginRule, WsRefused, head_inbox, upgrade
from idled.ops.config import Config
from idled.ops.logs import PeerLog
from idled.ops.nullmetrics import NullMetrics
from idled.protocol import (
    RECEIVE_BYTES, Error, ErrorCode, FrameDecoder, Login, ProtocolError, encode, receive_message, tokens,
)
from idled.protocol.websocket import WsDecoder
from idled.server.runtime.clock import WallClock

if TYPE_CHECKING:  # (exporters only: a process without metrics never imports prometheus_client)
    from idled.ops.metrics import Metrics

__all__ = [
    "HANDED_OVER", "ROLE_LABELS", "SEND_ERROR_TIMEOUT", "Admission", "Connection", "Doorway", "Role", "auth_secret",
    "close_with", "refuse", "refuse_out_of_descriptors",
]

log = logging.getLogger("idled.server.roles.doorway")
peer_log = PeerLog(logging.getLogger("idled.server.peers"))  # debug lines, rate-limited per kind

CERTIFIED_TOKEN_TTL = 60.0  # seconds: the token a certificate login carries on (to the core, from an edge)
SEND_ERROR_TIMEOUT = 1.0  # a peer that doesn't read can't hold a closing connection longer than this
# The login frame's limit, whatever max_frame allows after it: role, name (<= 256 B), token (<= 1024 chars),
# device (<= 64 B) fit in well under 2 KiB, so an unauthenticated peer holds at most this much of a frame.
MAX_LOGIN_FRAME: Final = 4096
# The gate's refusals (idled.door.gate), as the protocol's error codes.
_REFUSAL_CODES: Final = {"per_address": ErrorCode.BUSY, "busy": ErrorCode.BUSY, "proxy": ErrorCode.BAD_FRAME,
                         "timeout": ErrorCode.LOGIN_TIMEOUT, "tls_required": ErrorCode.TLS_REQUIRED}
# login role -> label (idled_connections{role}, idled_logins_total{role}, /status's connections)
ROLE_LABELS: Mapping[str, str] = {"uid": "user", "gateway": "gateway", "observer": "observer", "standby": "standby"}

# A role returns HANDED_OVER when it gave the open connection to someone who will close it and give its count
# back (the user plane, idled.server.roles.plane); the doorway then leaves both alone.
HANDED_OVER: Final = "handed over"
Role = Callable[[trio.abc.Stream, FrameDecoder, Login], Awaitable[str | None]]


class Admission(Protocol):
    """What the doorway asks of the sessions behind it (the core's, an edge's: ``idled.server.roles.users.UserSink``
    extends it): whether shutdown has begun, before and after the login."""

    @property
    def stopping(self) -> bool:
        """Shutdown (or an edge's drain) has begun: a new connection is refused before its login."""

    def refuse_if_stopping(self) -> None:
        """Raise ``ProtocolError(SERVER_SHUTDOWN)`` once shutdown has begun (a login that arrived meanwhile)."""


class Connection:
    """A logged-in connection; for a user, also the owner object the presence table stores."""

    __slots__ = ("scope", "end")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.end: tuple[str, str] | None = None  # (error code, reason) when closed by the server

    def close(self, code: str, reason: str) -> None:
        """Make the connection's own task send ``code`` and close (the first reason given wins)."""
        if self.end is None:
            self.end = (code, reason)
        self._stop()

    def _stop(self) -> None:
        """Make whoever serves the connection close it: its own task, cancelled."""
        self.scope.cancel()

    def release(self, uid: Uid, code: str, reason: str) -> None:
        """The server ended this user's session (idle, kicked, shutdown): the connection goes with it."""
        self.close(code, reason)


async def close_with(stream: trio.abc.Stream, code: str, reason: str, leader: str | None = None) -> None:
    """Send an error frame (bounded in time, even while cancelled) before the caller closes."""
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + SEND_ERROR_TIMEOUT
        try:
            await stream.send_all(encode(Error(str(code), reason, leader)))
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            pass


def auth_secret(config: Config) -> bytes | None:
    """The secret logins are verified with (None: auth off). Auth off is refused on any listener that is not
    local unless the configuration says ``insecure``; that rule is checked on the bound addresses, in
    ``idled.door.accept``."""
    return tokens.load_secret(config.secret_file) if config.secret_file else None


async def refuse(stream: trio.abc.Stream, code: str = ErrorCode.BUSY, reason: str = "too many connections") -> None:
    """Send one error frame and close: a connection refused before it was served."""
    try:
        await close_with(stream, code, reason)
    finally:
        await stream.aclose()


async def refuse_out_of_descriptors(stream: trio.abc.Stream) -> None:
    """The accept loop's refusal when descriptors ran out (``idled.door.accept``: the spare descriptor)."""
    await refuse(stream, ErrorCode.BUSY, "out of file descriptors")


class Doorway:
    """Admission, login and role dispatch for every accepted connection (see the module docstring).

    ``config`` is read per connection (``max_frame``, ``login_timeout``), so a reload replaces it here;
    ``limit`` is the connection limit in force (``max_connections`` capped to the descriptor budget: the
    server sets it). ``connections`` counts open connections by role label, plus ``pending``. ``gate`` is the
    door's for this listener (``idled.door.door.client_gate``; the core's internal socket behind ``--workers``
    gets one without the PROXY/TLS front, whatever the configuration says: the edges terminate those). A
    reload (SIGHUP) calls ``reload(config)``: the new configuration, the gate's per-address share, and the TLS
    certificate files read again for new handshakes.
    """

    def __init__(
        self,
        config: Config,
        *,
        sessions: Admission,
        roles: Mapping[str, Role],
        secret: bytes | None,
        metrics: Metrics | NullMetrics,
        connections: dict[str, int],
        gate: Gate,
        trusts: Callable[[trio.abc.Stream, Login], bool] | None = None,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.gate = gate  # the door's (idled.door.door.client_gate): per-address share, PROXY, TLS
        self.config = config
        self.trusts = trusts  # a login it accepts needs no token (idled.server.workers.internal: edge workers' links)
        self.sessions = sessions
        self.roles = roles
        self.secret = secret
        self.metrics = metrics
        self.connections = connections
        self.limit = config.max_connections
        self.origins = OriginRule.of(config, secret=secret is not None)  # WebSocket (idled.door.websocket)
        # Token expiry is judged on the process's wall clock that never goes backwards (idled.server.runtime.clock): a
        # token expired before a step back of the system clock stays expired after it.
        self.wall = WallClock() if wall is None else wall

    def reload(self, config: Config) -> None:
        """SIGHUP: serve new connections with ``config``, and re-read the TLS certificate files (which may have
        been replaced even when no setting changed; on failure the previous certificate stays, logged)."""
        self.config = config
        self.origins = OriginRule.of(config, secret=self.secret is not None)
        reload_gate(self.gate, config, deadline=config.login_timeout)
        if self.gate.front is not None:
            self.gate.front.reload()

    async def handle(self, stream: trio.abc.Stream, counted: bool = False) -> None:
        """Serve one connection until it ends; never raises (but for cancellation). ``counted``: the accept
        loop already counted it as ``pending`` (an edge's, so that its next look at the limit sees it)."""
        role = "pending"
        if not counted:
            self.connections[role] += 1
        handed_over = False
        raw = stream  # closed in the end, whatever was wrapped around it
        try:
            if self.sessions.stopping:
                await close_with(stream, ErrorCode.SERVER_SHUTDOWN, "shutting down")
                return
            # The door's gate: the source's share of logins in progress, then PROXY and TLS, within the login
            # deadline (idled.door.gate).
            # At the connection limit, the oldest connection not logged in yet makes room for this one -- once its
            # source's share allows it -- and only when every other one has logged in is it refused busy.
            async with self.gate.enter(stream, self.config.login_timeout, self._full) as entry:
                stream, address = entry.stream, entry.address
                if entry.refused is not None:
                    await self._refused(entry.refused, address)
                    return
                decoder = FrameDecoder(min(self.config.max_frame, MAX_LOGIN_FRAME))
                try:
                    opened = await self._open(stream, decoder, entry.deadline, address)
                    if opened is None:
                        return
                    stream, decoder = opened
                    login = await self._login(stream, decoder, entry.deadline, address)
                    if login is None:
                        return
                    if isinstance(decoder, WsDecoder):
                        decoder.report_pings = login.role == "uid"  # a user's control ping is activity
                    entry.authenticated()
                    self.sessions.refuse_if_stopping()
                    self.connections[role] -= 1
                    role = ROLE_LABELS[login.role]
                    self.connections[role] += 1
                    peer_log.debug("login", "login %s %r from %s", role, login.name, address)
                    decoder.max_frame = self.config.max_frame
                    handed_over = await self.roles[login.role](stream, decoder, login) == HANDED_OVER
                except ProtocolError as exc:
                    self.reject(exc.code)
                    peer_log.debug("reject", "reject %s from %s: %s", exc.code, address, exc.reason)
                    await close_with(stream, exc.code, exc.reason, exc.leader)  # leader: a not_leader's hint
            if entry.scope.cancelled_caught:  # evicted at the limit, for a newer connection (idled.door.gate)
                self.reject("evicted")
                await close_with(stream, ErrorCode.BUSY, "too many connections: this one had not logged in "
                                 f"within {self.gate.limits.evict_after:g} s and made room for a newer one")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away: its session (if any) was ended where it was read
        except Exception:
            log.exception("connection handler failed (bug); connection closed, server unaffected")
        finally:
            if not handed_over:  # (a connection handed over is the new holder's to count and close)
                self.connections[role] -= 1
                if stream is not raw:
                    # TLS: a close_notify first, bounded like an error frame; the socket is closed regardless.
                    with trio.move_on_after(SEND_ERROR_TIMEOUT) as scope:
                        scope.shield = True
                        await stream.aclose()
                await raw.aclose()

    def _full(self) -> bool:
        return sum(self.connections.values()) > self.limit

    async def _refused(self, refused: Refused, address: str) -> None:
        """The gate turned the connection away: count it, and say why where a frame can be sent."""
        code = _REFUSAL_CODES.get(refused.reason, ErrorCode.BUSY)
        self.reject(refused.reason if refused.reason in ("tls_handshake", "per_address") else code)
        peer_log.debug("reject", "reject %s from %s: %s", refused.reason, address, refused.message)
        if refused.stream is not None:
            message = refused.message
            if refused.reason == "timeout":
                message = f"no login within {self.config.login_timeout:g} s"
            await close_with(refused.stream, code, message)

    async def _open(self, stream: trio.abc.Stream, decoder: FrameDecoder, deadline: float,
                    address: str) -> tuple[trio.abc.Stream, FrameDecoder] | None:
        """The first bytes: a login frame's (TCP: into ``decoder``) or a WebSocket upgrade request's (then the
        handshake, ``idled.door.websocket``: the WebSocket stream and its decoder). None: the connection ended,
        timed out (answered here) or was refused."""
        data: bytes | bytearray = b""
        with trio.move_on_at(deadline):
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                return None
            while len(data) < len(UPGRADE) and UPGRADE.startswith(data):  # (a G alone says enough of a valid
                more = await stream.receive_some(RECEIVE_BYTES)  # login, not of garbage: it keeps its error frame)
                if not more:
                    break
                data = bytes(data) + more
            if not data.startswith(UPGRADE):
                decoder.receive_data(data)
                return stream, decoder
            inbox, data = head_inbox(data), UPGRADE  # (held once, in the inbox, while the head arrives)
            try:
                ws = await upgrade(stream, inbox, self.origins, decoder.max_frame)
            except WsRefused as exc:
                self.reject("websocket_" + str(exc.status))
                peer_log.debug("reject", "reject websocket %d from %s: %s", exc.status, address, exc.message)
                return None
            return None if ws is None else (ws, ws.decoder)
        timeout = self.config.login_timeout
        self.reject(ErrorCode.LOGIN_TIMEOUT)
        peer_log.debug("reject", "reject %s from %s: no login within %g s", ErrorCode.LOGIN_TIMEOUT, address, timeout)
        if not data:  # (mid-handshake there is no channel to send a frame on: just closed)
            await close_with(stream, ErrorCode.LOGIN_TIMEOUT, f"no login within {timeout:g} s")
        return None

    def reject(self, code: str) -> None:
        self.metrics.frames_rejected.labels(reason=str(code)).inc()

    async def _login(
        self, stream: trio.abc.Stream, decoder: FrameDecoder, deadline: float, address: str
    ) -> Login | None:
        """The connection's login, or None if it ended (or timed out, answered here) before logging in."""
        with trio.move_on_at(deadline):
            message = await receive_message(stream, decoder)
            if message is None:
                return None
            if not isinstance(message, Login):
                raise ProtocolError(ErrorCode.NOT_LOGGED_IN, f"log in first (got {type(message).__name__.lower()})")
            logins = self.metrics.logins
            front = self.gate.front
            certified = not message.token and front is not None and front.certified(stream, message)
            if self.secret is not None and certified:
                # A client certificate named it. The login goes on with a short-lived token of its own, so
                # an edge relaying it to the core (``--workers``) hands the core a login the core accepts.
                message = dataclasses.replace(message, token=tokens.mint(
                    self.secret, message.role, message.name, self.wall() + CERTIFIED_TOKEN_TTL))
            elif self.secret is not None and not (self.trusts is not None and self.trusts(stream, message)):
                try:
                    tokens.verify(self.secret, message.token or "", message.role, message.name, self.wall())
                except tokens.AuthError as exc:
                    logins.labels(role=ROLE_LABELS[message.role], result="auth_failed").inc()
                    raise ProtocolError(ErrorCode.AUTH_FAILED, str(exc)) from None
            logins.labels(role=ROLE_LABELS[message.role], result="ok").inc()
            return message
        timeout = self.config.login_timeout
        self.reject(ErrorCode.LOGIN_TIMEOUT)
        peer_log.debug("reject", "reject %s from %s: no login within %g s", ErrorCode.LOGIN_TIMEOUT, address, timeout)
        await close_with(stream, ErrorCode.LOGIN_TIMEOUT, f"no login within {timeout:g} s")
        return None
