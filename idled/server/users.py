"""The user role: one connection, one uid; any frame is activity.

Theory of operation
-------------------
After the login the task is one loop -- read a message, ``presence.touch``, answer a ping -- and that loop is
the per-packet path of the whole daemon (~3.3k packets/s at 100k users), so it holds the table's ``touch``
and the clock's ``now`` in locals: no attribute chain, no extra call per packet. No per-connection timer
exists: idleness is the detector's job, and its tick task ends an idle session by cancelling the
connection's scope (``Connection.release``), after which this task sends the error frame and closes.

Memory: one frame is read at a time (``max_frame``) and its only reply, ``pong``, is written inline by this
task, so nothing is ever queued for a user. A user that pings without reading blocks its own task once its
socket buffers are full: it stops being read, so its pings stop counting as activity and the detector ends
the session (``idle_timeout``; the error frame's write is bounded by ``SEND_ERROR_TIMEOUT``).
"""

from __future__ import annotations

import time

import trio

from idled.protocol import BYE, PING, PONG_FRAME, ErrorCode, FrameDecoder, Login, Msg, ProtocolError, Welcome, encode, receive_message
from idled.server.conn import Connection, close_with
from idled.server.sessions import Sessions

__all__ = ["run_user"]


async def run_user(sessions: Sessions, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
    """Serve a logged-in user (bind ``sessions`` with functools.partial to make it a role)."""
    presence, publish, now = sessions.presence, sessions.publish, sessions.clock.now
    touch = presence.touch
    uid = login.name
    conn = Connection()
    await sessions.room()
    sessions.refuse_if_stopping()  # again after the wait
    previous, event = presence.login(uid, conn, now(), time.time(), login.keepalive)
    sessions.take_over(uid, previous, conn)
    publish(event)
    sessions.wake_ticker()
    reason = "closed"
    try:
        with conn.scope:
            await stream.send_all(encode(Welcome("uid", uid, presence.timeout_of(uid))))
            while (message := await receive_message(stream, decoder)) is not None:
                if conn.end is None:  # a kicked connection's last frames are not the new owner's activity
                    touch(uid, now())  # any frame is activity
                if message is PING:
                    await stream.send_all(PONG_FRAME)
                elif message is BYE:
                    reason = "logout"
                    break
                elif type(message) is not Msg:
                    raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for users")
    except ProtocolError:
        # The session ends here; the doorway counts the error and sends its frame.
        publish(presence.logout(uid, conn, now(), time.time(), "closed"))
        raise
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    if conn.end is not None:
        await close_with(stream, *conn.end)
    else:
        publish(presence.logout(uid, conn, now(), time.time(), reason))
