"""The edge's roles: users terminated here (relayed to the core as one gateway), everyone else piped through.

Theory of operation
-------------------
*Users.* After the doorway's login (``idled.server.roles.doorway.Doorway``: admission, login timeout, auth, error
frames -- the server's own code), a user runs the server's own user loop (``idled.server.roles.users.run_user``)
with this object as its ``UserSink``: the login is ``link.attach``, every frame ``link.touch(uid, now)`` (a
dict store), a ping is answered with a pong from here, and ``bye`` or the end of the stream ends it
(``link.detach``). Its ``welcome`` carries the timeout the core would give (``CoreParams.timeout_for``). There
is no per-connection timer or buffer beyond the decoder: idleness is the core's job, and the core says when
(``ended``). ``users`` maps each session key to its one connection here.

*Devices.* A login with ``"device": D`` is the session ``(uid, D)`` (``Login.key``); without one, the plain
uid, as before devices. Everything here is per session key: the attach, touch and detach the link relays
carry the key (``[uid, D]`` on the wire), newest-wins is per key (a second login of the same uid and device
kicks the first; another device of the uid is another session and both stay), and ``ended`` notices name
keys, matched back to the connection that holds each. Whether the *user* is online is the core's business
(any of its keys alive): the edge never merges keys.

*Admission.* A login is refused with ``busy`` while ``MAX_ATTACHING`` attaches wait for the core's
acknowledgement: the core is behind, and a login it cannot record soon would only wait for its welcome.

*Who ends a user, and with what.* A second login of the same session key on this edge: newest wins here (the old
connection gets ``kicked``; the attach is sent again, which at the core is the same owner: no event). An
``ended`` notice: ``idle`` -> ``idle_timeout``, ``kicked`` (a newer login on another edge or a direct one)
-> ``kicked``, ``unavailable`` (the core refused the attach: it runs degraded, its disk full, and takes no new
session) -> ``unavailable``, which the user retries like ``busy``; the uid is forgotten by the link so it is
not re-attached. ``ended shutdown`` means the core is
going away: the users stay connected and are re-attached when it is back. Only this edge's own shutdown closes
them with ``server_shutdown`` (and detaches them).

*A notice that crossed a login.* An ``idle`` notice for a connection that logged in less than half its
timeout ago cannot be about it (its attach reached the core after the old session's expiry): the uid is
attached again instead of closing a fresh connection. ``kicked`` is always obeyed: the core's order of
logins decides, as it does for direct connections.

*Relay.* A gateway, observer or standby (a standby core's replication link: ``--standby-of`` this daemon's
public port under ``--workers``) that connects to the edge's port is piped to the core: a new connection to
the core the link is attached to (or trying, of ``--core A,B``) gets the login frame and whatever followed it, then bytes flow both ways (``RELAY_BYTES`` per read,
one read in flight per direction) until either side closes. Tokens are checked by the core. With
``link_tls`` the relayed connection is TLS like the link, without the link's client certificate (it carries
someone else's login: it must not borrow the edge's identity).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from idled.door.outbound import LinkFailed, close_link
from idled.door.websocket import WebSocketStream
from idled.protocol import ErrorCode, FrameDecoder, Login, ProtocolError, SessionKey, encode
from idled.server.edge.link import MAX_ATTACHING, CoreLink, open_core_stream
from idled.server.edge.touches import TOUCH_CLOCK
from idled.server.roles.doorway import close_with
from idled.server.roles.users import Plane, UserConnection

__all__ = ["EdgeUser", "EdgeUsers", "RELAY_BYTES"]

log = logging.getLogger("idled.server.edge.users")

RELAY_BYTES = 65536  # one read of a relayed connection: the only buffer a relay holds per direction
ATTACH_WAIT = 2.0  # seconds a login waits for the core to process its attach before the welcome is sent anyway
# An ``ended`` notice's reason -> the error its user is closed with (any other reason: idle_timeout), and the text.
_ENDED_CODES = {"kicked": ErrorCode.KICKED, "unavailable": ErrorCode.UNAVAILABLE}
# A ``kicked`` notice carries no text: a newer login elsewhere, the devices limit or the operator's kick (API).
_ENDED_TEXT = {ErrorCode.KICKED: "ended at the core: logged in elsewhere, or by the server's operator",
               ErrorCode.IDLE_TIMEOUT: "no activity within the timeout",
               ErrorCode.UNAVAILABLE: "the server cannot take new sessions now (its disk is full); retry later"}


class EdgeUser(UserConnection):
    """A user connection at the edge: the login time and timeout (for crossed notices) beside what every user
    connection holds."""

    __slots__ = ("since", "timeout", "attached")

    def __init__(self, since: float, timeout: float) -> None:
        super().__init__()
        self.since = since
        self.timeout = timeout
        self.attached: trio.Event | None = None  # set once the core has processed the login's attach


class EdgeUsers:
    """The edge's ``UserSink`` for the shared user loop (``idled.server.roles.users.run_user``), the relay for
    the other roles (``relay``), and ``ended`` notices."""

    # The clock the link ages touches by (it tells the core how long ago each was read); a C function costs
    # no Python frame per packet.
    now = staticmethod(TOUCH_CLOCK)

    def __init__(self, link: CoreLink, core_address: str) -> None:
        self.link = link
        self.touch = link.touch
        self.core_address = core_address  # what --core said (one address or several)
        self.users: dict[SessionKey, EdgeUser] = {}  # session key (uid, or (uid, device)) -> its connection
        self.relays = 0
        self.stopping = False
        self.plane: Plane | None = None  # set by the edge (idled.server.roles.plane)

    def refuse_if_stopping(self) -> None:
        """What the doorway asks of its ``sessions``: no login is accepted once the edge is draining."""
        if self.stopping:
            raise ProtocolError(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")

    # -- the user role: run_user(self, ...) (idled.server.roles.users) --------------------------------------------

    def handle(self, key: SessionKey, conn: EdgeUser) -> SessionKey:
        return key  # (the link files touches by key)

    async def begin(self, login: Login) -> EdgeUser:
        link, users = self.link, self.users
        key = login.key
        params = link.params
        assert params is not None  # the edge accepts only after the core's first welcome
        if link.attaches_in_flight >= MAX_ATTACHING:
            raise ProtocolError(ErrorCode.BUSY, "the core is behind on logins; try again")
        conn = EdgeUser(trio.current_time(), params.timeout_for(login.keepalive))
        previous = users.get(key)
        users[key] = conn
        conn.attached = link.attach(key, login.keepalive)  # also for a local duplicate: new keepalive, fresh deadline
        if previous is not None:
            previous.close(ErrorCode.KICKED, "logged in elsewhere")
        return conn

    async def ready(self, key: SessionKey, conn: EdgeUser) -> float:
        if conn.attached is not None:
            # The welcome follows the core's online record, as for a direct login (bounded: a core that does
            # not answer is the link's liveness check's business, not this user's).
            with trio.move_on_after(ATTACH_WAIT):
                await conn.attached.wait()
            conn.attached = None  # the connection lives on: hold nothing it no longer needs
        return conn.timeout

    def end(self, key: SessionKey, conn: EdgeUser, reason: str) -> None:
        if self.users.get(key) is conn:
            del self.users[key]
            if conn.end is not None and conn.end[0] == ErrorCode.SERVER_SHUTDOWN:
                reason = "shutdown"  # the edge is draining: the record a direct user gets at shutdown
            self.link.detach(key, reason)

    def on_ended(self, uids: tuple[SessionKey, ...], reason: str) -> None:
        """The core ended these sessions of ours, by key (see the module docstring)."""
        if reason == "shutdown":
            return  # the core is going away: keep the users, re-attach them when it is back
        code = _ENDED_CODES.get(reason, ErrorCode.IDLE_TIMEOUT)
        now = trio.current_time()
        users, link = self.users, self.link
        for uid in uids:
            conn = users.get(uid)
            if conn is None:
                link.forget(uid)
                continue
            if code is ErrorCode.IDLE_TIMEOUT and now - conn.since < conn.timeout / 2:
                link.attach(uid, link.batch.live.get(uid))  # crossed our fresh login: the core must know it
                continue
            del users[uid]
            link.forget(uid)
            conn.close(code, _ENDED_TEXT[code])

    def close_all(self, code: str, reason: str) -> int:
        """The edge is stopping: every user gets ``code``; each task detaches its key as it ends."""
        for conn in list(self.users.values()):
            conn.close(code, reason)
        return len(self.users)

    async def relay(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        """Pipe a gateway, observer or standby to the core (see the module docstring)."""
        try:  # the core the link found (one of --core's)
            core = await open_core_stream(self.link.core, self.link.links, relay=True)
        except (OSError, trio.TooSlowError, LinkFailed) as exc:
            raise ProtocolError(ErrorCode.BUSY, f"core unavailable: {exc}") from None
        self.relays += 1
        try:
            ws = stream if isinstance(stream, WebSocketStream) else None
            await core.send_all(encode(login) + (decoder.unconsumed() if ws is None else ws.decoder.take_frames()))
            async with trio.open_nursery() as nursery:
                done = nursery.cancel_scope.cancel
                if ws is None:
                    nursery.start_soon(_pipe, stream, core, done)
                else:
                    nursery.start_soon(_unwrap, ws, core, done)
                nursery.start_soon(_pipe, core, stream, done)
        finally:
            self.relays -= 1
            await close_link(core)  # TLS: close_notify, bounded


async def _unwrap(source: WebSocketStream, sink: trio.abc.Stream, done: Callable[[], None]) -> None:
    """A WebSocket client's messages to the core as idled frames (the other way, ``source.send_all`` wraps
    them): the core validates them as any peer's; only the WebSocket framing is checked here."""
    try:
        while data := await source.receive_some(RELAY_BYTES):
            source.decoder.receive_data(data)
            frames = source.decoder.take_frames()
            if frames:
                await sink.send_all(frames)
    except ProtocolError as exc:
        await close_with(source, exc.code, exc.reason)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done()


async def _pipe(source: trio.abc.Stream, sink: trio.abc.Stream, done: Callable[[], None]) -> None:
    try:
        while data := await source.receive_some(RELAY_BYTES):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done()  # either side closing ends the relay: the other end is closed by its owner
