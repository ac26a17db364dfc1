"""The user role: one connection, one session key; any frame is activity -- for the core and the edge alike.

Theory of operation
-------------------
After the login the task is one loop -- read a message, touch, answer a ping -- and that loop is the per-packet
path of the whole daemon (~3.3k packets/s at 100k users). What a session does beyond its connection is a
``UserSink``, the one thing that differs between a user served by the core and one served by an edge (it
is also what the doorway admits connections against: ``stopping``, ``refuse_if_stopping``):

* ``begin(login)``, before the welcome. Core: while the server is degraded (a full disk:
  ``idled.server.engine.degraded``) refuse it with ``unavailable`` if it would bring its user online, else take it
  without waiting (it adds no event: ``idled.server.engine.sessions``); wait for the log's room, ``presence.login``,
  tell a previous owner ``kicked``, publish the online event. Edge: ``link.attach``, tell a previous
  connection here ``kicked``.
* ``ready(key, conn)``, inside the connection's scope: the welcome's timeout. Core: the table's. Edge: the
  core's rule; first it waits (at most 2 s) for the core to acknowledge the attach.
* ``touch(handle, now())``, per frame, where ``handle(key, conn)`` was asked once, right after ``begin``. Core:
  ``presence.touch_session`` at the stall-guarded clock, the handle being the session's own record (no lookup
  of its key per packet: on a cold cache, that lookup was ~1 us of each keepalive). Edge: ``link.touch``, a
  dict store, the handle being the key.
* ``end(key, conn, reason)``. Core: the offline event (``logout``, ``closed``; none while another device of the
  user is online, or yet while a ``closed`` user's offline waits out the grace). Edge: ``link.detach``. Either
  only if the connection still owns the session.

``key`` is the login's session key (``Login.key``): the uid, or ``(uid, device)`` for a login that names a
device -- what the connection holds from its login on.

The loop holds ``touch``, ``now`` and its ``handle`` in locals -- for the core, the table's own
``touch_session`` and the clock's ``now``: no attribute chain, no wrapper call per packet. ``ready`` runs inside the connection's scope, so a
connection closed while it waits (kicked, shut down) stops waiting.

No per-connection timer exists: idleness is the detector's job (at an edge, the core's), which ends an idle
session by cancelling the connection's scope (``Connection.release``); this task then sends the error frame
and closes.

*Handing over.* Right after the welcome a plain TCP connection is handed over to the user plane
(``idled.server.roles.plane``: one thread and one task for every logged-in user, none of its own) when the
``UserSink`` has one: the task returns ``HANDED_OVER`` and ends, and the doorway leaves the connection open and counted
(the plane gives the count back when it closes it). TLS connections and in-memory test streams stay here.
Both loops apply the same frame rule (``user_step``). ``end`` is called however the connection ends but by cancellation -- bye (``logout``), end of
stream, a broken stream or a protocol error (``closed``), or the server closing it -- and does nothing unless
the connection still owns its session: one the server ended (idle, kicked, shutdown) was already replaced.

Memory: one frame is read at a time (``max_frame``) and its only reply, ``pong``, is written inline by this
task, so nothing is ever queued for a user. A user that pings without reading blocks its own task once its
socket buffers are full: it stops being read, so its pings stop counting as activity and the detector ends
the session (``idle_timeout``; the error frame's write is bounded by ``SEND_ERROR_TIMEOUT``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from idled.protocol import (
    BYE, PING, PONG_FRAME, ErrorCode, FrameDecoder, Login, Msg, ProtocolError, SessionKey, Welcome, encode,
    receive_message,
)
from idled.protocol.websocket import ACTIVITY, WsDecoder
from idled.server.roles.doorway import HANDED_OVER, Admission, Connection, close_with

if TYPE_CHECKING:  # (the core's sink only: an edge never loads the engine)
    from idled.core.presence import SessionEntry
    from idled.server.engine.sessions import Sessions

__all__ = [
    "CoreUsers", "HANDED_OVER", "LOGOUT", "NOTHING", "PONG", "UserConnection", "UserSink", "run_user", "user_step",
]

NOTHING, PONG, LOGOUT = 0, 1, 2  # what a user's frame asks for (user_step)


def user_step(message: Any) -> int:
    """The user role's frame rule, after the frame has counted as activity: ``PONG`` for a ping, ``LOGOUT``
    for bye, ``NOTHING`` for msg; anything else is a protocol error."""
    if message is PING:
        return PONG
    if message is BYE:
        return LOGOUT
    if type(message) is not Msg and message is not ACTIVITY:  # (ACTIVITY: a WebSocket control ping)
        raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for users")
    return NOTHING

class Plane(Protocol):
    """Whoever takes logged-in connections over (``idled.server.roles.plane.UserPlane``)."""

    def adopt(self, stream: trio.abc.Stream, key: SessionKey, handle: Any, conn: UserConnection,
              decoder: FrameDecoder) -> bool:
        ...

    def request_close(self, conn: UserConnection) -> None: ...


class UserConnection(Connection):
    """A user's connection: served by its task (``scope``) until the user plane adopts it (``plane`` set), and
    from then on also the plane's record of it -- the socket, the session key, the decoder while a frame is
    partly read, the pongs the kernel has not taken -- in one object rather than two (48 bytes a connection
    less). Only ``idled.server.roles.plane`` reads or writes those slots."""

    __slots__ = ("plane", "key", "handle", "sock", "decoder", "limit", "out", "reading", "ws")

    key: Any  # the session key (a uid, or (uid, device))
    handle: Any  # what a frame touches (``UserSink.handle``); None once ended (the core's refers back to this)
    sock: socket.socket
    decoder: FrameDecoder | None  # a plain connection's: only while a frame is partly read
    limit: int  # the frame limit its login was given
    out: bytes  # pong bytes the kernel has not taken yet
    reading: bool  # False while ``out`` is over the plane's limit
    ws: WsDecoder | None  # a WebSocket's decoder (its control replies, its close)

    def __init__(self) -> None:
        super().__init__()
        self.plane: Plane | None = None  # the plane serving it, once adopted

    def _stop(self) -> None:
        if self.plane is None:
            super()._stop()
        else:  # adopted: its task is gone; the plane closes it at its next step
            self.plane.request_close(self)


C = TypeVar("C", bound=UserConnection)


class UserSink(Admission, Protocol[C]):
    """What happens to a user's session as its connection goes (see the module docstring); the doorway in
    front of it asks it whether shutdown has begun (``Admission``)."""

    plane: Plane | None  # takes logged-in plain TCP connections over (None: every one keeps its task)

    @property
    def touch(self) -> Callable[[Any, float], None]:
        """Activity at ``now()`` of the session ``handle`` stands for: the per-packet path."""

    @property
    def now(self) -> Callable[[], float]:
        """The clock ``touch`` is given."""

    async def begin(self, login: Login) -> C:
        """The session of ``login.key`` starts, owned by the connection returned. May raise ProtocolError."""

    # ``key`` is typed Any in this protocol, not SessionKey, while a sink that serves plain uids only (an edge
    # that does not relay devices yet) is still a sink; the core's takes any SessionKey.
    def handle(self, key: Any, conn: C) -> Any:
        """What ``touch`` takes for the activity of ``conn``, which owns ``key``'s session (asked once, right
        after ``begin``; the user plane is given it when it adopts the connection)."""

    async def ready(self, key: Any, conn: C) -> float:
        """Just before the welcome, inside the connection's scope: the timeout the welcome announces."""

    def end(self, key: Any, conn: C, reason: str) -> None:
        """The connection ended (``logout`` or ``closed``); nothing happens unless it still owns the session."""


class CoreUsers:
    """The core's ``UserSink``: the presence table, changed through ``Sessions``."""

    __slots__ = ("sessions", "touch", "now", "wall", "plane")

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.touch = sessions.presence.touch_session
        self.now = sessions.clock.now
        self.wall = sessions.clock.wall  # event times: the wall clock that never goes backwards
        self.plane: Plane | None = None

    @property
    def stopping(self) -> bool:
        return self.sessions.stopping

    def refuse_if_stopping(self) -> None:
        self.sessions.refuse_if_stopping()

    async def begin(self, login: Login) -> UserConnection:
        sessions, key = self.sessions, login.key
        await sessions.admit(key)
        conn = UserConnection()
        replaced, event = sessions.presence.login(key, conn, self.now(), self.wall(), login.keepalive)
        sessions.take_over(key, replaced, conn)
        sessions.publish(event)
        sessions.wake_ticker()
        return conn

    def handle(self, key: SessionKey, conn: UserConnection) -> SessionEntry | None:
        return self.sessions.presence.session_of(key, conn)

    async def ready(self, key: SessionKey, conn: UserConnection) -> float:
        return self.sessions.presence.timeout_of(key)

    def end(self, key: SessionKey, conn: UserConnection, reason: str) -> None:
        self.sessions.logout(key, conn, self.now(), self.wall(), reason)


async def run_user(users: UserSink[Any], stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> str | None:
    """Serve a logged-in user (bind ``users`` with functools.partial to make it a role). Returns
    ``HANDED_OVER`` when the user plane took the connection (the caller must leave it open)."""
    uid, key = login.name, login.key
    conn = await users.begin(login)
    handle = users.handle(key, conn)
    touch, now, plane = users.touch, users.now, users.plane
    reason = "closed"
    try:
        with conn.scope:
            timeout = await users.ready(key, conn)
            await stream.send_all(encode(Welcome("uid", uid, timeout)))
            if plane is not None and plane.adopt(stream, key, handle, conn, decoder):
                return HANDED_OVER
            while (message := await receive_message(stream, decoder)) is not None:
                if conn.end is None:  # a kicked connection's last frames are not the new owner's activity
                    touch(handle, now())  # any frame is activity
                step = user_step(message)
                if step == PONG:
                    await stream.send_all(PONG_FRAME)
                elif step == LOGOUT:
                    reason = "logout"
                    break
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except Exception:
        # A protocol error (the doorway counts it and sends its frame) -- or a bug: either way the session ends.
        users.end(key, conn, "closed")
        raise
    users.end(key, conn, reason)
    if conn.end is not None:
        await close_with(stream, *conn.end)
    return None
