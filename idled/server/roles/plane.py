"""The user plane: every logged-in plain-TCP user served by one thread and one task, not by a task of its own.

Theory of operation
-------------------
A trio task per connection costs ~6.2 KiB and ~90 us of CPU per keepalive here (task switches, a cancel scope
and three awaits per frame), and an edge holds ~19,000 of them. Once a user has logged in its connection
does only one thing -- frames in, touch, pong out -- so the user loop (``idled.server.roles.users.run_user``) hands
a plain ``trio.SocketStream`` over to the plane (``adopt``) right after the welcome, and its task ends. The
login itself (admission, PROXY, TLS, auth, the welcome after the core's acknowledgement) stays on trio;
TLS connections and test streams are never handed over: they keep their task. A plain WebSocket connection
(``idled.door.websocket.WebSocketStream`` over a socket) is adopted too: its socket, read through its
``WsDecoder`` -- the same frame rule; pongs go out as WebSocket messages, control replies (pongs to control
pings, the echo of the peer's close) are sent after each read, and the final error message is followed by the
close frame carrying its code.

The plane owns one ``select.epoll`` holding every adopted socket, one thread waiting on it, and one trio task.
*The thread* blocks in ``epoll_wait`` holding neither the GIL nor the loop lock
(``idled.server.runtime.looplock``: a ``threading.Lock`` the trio loop holds whenever it runs, and lets go of
only while it waits for I/O). Woken, it takes the lock -- so it runs only while no task does, and the two never
interleave -- serves *every* ready socket of that poll (``_serve``: reads, touches, pongs, flushes), and lets
go. A batch of keepalives thus costs no trio loop turn at all: on this VM a turn costs several times a
keepalive (trio's ``epoll_wait`` with a timer armed, an ``epoll_ctl`` re-arming its one-shot registration, the
task's step), and a thread's wake-up costs a fraction of one (docs/peer.md, "A thread for the plane"). The
thread never calls trio (its run state is per thread: ``current_time``, ``Event.set`` fail or corrupt from
another): the time it stamps comes from the clock object itself (``Clock.now``), an edge's link is woken
through ``run_sync_soon`` (``CoreLink._touched``), and a connection that closes is only *filed*
(``_close``: out of the epoll at once). *The task* ends what was filed (``_settle`` -> ``_finish``: ending a
session logs an event, wakes observers, gives a count back -- all trio's) when the thread asks it through
``run_sync_soon``, which happens only when something closed. A failure of the thread outside one connection
(a bug) is raised by the task: a plane that stopped serving must not go unseen. A ``bye`` or a hang-up the
thread read is thus applied one loop turn later than it was read, as it was when a task served the plane.
``threading.Lock`` has no hand-off: a loop busy with tasks (a login storm) waits for I/O with a zero timeout
and takes the lock straight back, and the thread would wait for it indefinitely. So a thread that has not got
the lock within ``COALESCE`` hands its batch to the loop (``_serve_on_loop``, through ``run_sync_soon``), which
serves it at its next turn, and waits for that: pongs stay within ~10 ms and a loop turn under any load.

The rule the tick task's horizon and an edge's watermark answers count on (``idled.server.engine.ticker``,
``idled.server.edge.link``) is that a socket readable when they judged has been read, and its keepalive
touched, before they act on the judgement: they call ``drain`` themselves (see *Coalescing*), which serves
every ready socket and ends what closed, synchronously (a task holds the loop lock: the thread is not serving
meanwhile). The same frame rule as the task loop applies (``users.user_step``): any frame is activity,
``ping`` is answered with ``pong``, ``bye`` logs out, anything else is a protocol error (one error frame,
closed).

*Coalescing.* The thread polls at most once per ``COALESCE`` (10 ms): woken sooner after its last poll, it
sleeps the rest of that time first (without the lock), and takes whatever became ready meanwhile in one poll.
With keepalives arriving one by one -- real clients, not a load generator's bursts -- a wake-up per packet
would be the most of the plane's CPU; bursts further apart than that (a load generator's) are served at
once. What it costs: a pong, and the time a keepalive is stamped with, up to 10 ms later (a later stamp moves
a deadline later, never earlier). What it must not cost is the rule above: whoever judges silence first
calls ``drain()``.

Writes: a pong is sent at once (``send`` on a non-blocking socket). What the kernel does not take waits in
the connection's ``out`` buffer, flushed when the socket is writable; past ``MAX_OUT`` bytes the plane stops
reading the connection, as a task blocked in ``send_all`` would: a user that pings without reading stops
counting as active and its session goes idle.

Closing from elsewhere (idle, kicked, shutdown) is ``Connection.close``, which cancels the connection's
``scope``; an adopted connection (``UserConnection``, its ``plane`` set) files the close with the plane instead
(``request_close``) and wakes the task, which ends the session (``users.end``), sends the error frame (best
effort: a fresh socket's buffer takes it), closes the socket and gives the connection's count back
(``release``). The eventfd the plane also watches is the thread's stop: it cuts its ``epoll_wait`` and its
coalescing nap short.

*The lone keepalive.* Nearly every read is one whole keepalive -- a ``ping`` or the quiet ``{"op":"msg"}``,
12 or 13 bytes -- and nothing else. A plain connection therefore has no decoder while nothing is pending: a
read that is exactly one of those frames is looked up by its bytes (``KEEPALIVE_FRAMES``, the decoder's own
table), touched and answered, and any
other read gets a ``FrameDecoder`` (the connection's ``limit``) for as long as bytes are pending. (The
socket object stays: ``os.read`` / ``os.write`` on the bare descriptor would save its 88 bytes, but here
they cost twice the system time of ``recv`` / ``send`` -- 17 against 9 us per keepalive, measured.)

Memory per adopted connection: the socket object, the connection object itself -- the ``UserConnection`` the
session already has as its owner (the presence table's; at an edge, ``EdgeUsers.users``'s) is the plane's record
too (its task's cancel scope is dropped), so no second object points back at it -- one slot in the
descriptor-indexed table, no decoder while idle, and the epoll registration in the kernel. (A user connection
that is never adopted -- TLS -- carries the plane's nine slots empty: 72 bytes beside its task's ~6 KiB.)
A keepalive touches the connection's ``handle`` (``UserSink.handle``): at the core, its session's own record,
whose ``owner`` is the connection -- the one cycle here, cut when the plane ends it (``_finish``), so a closed
connection is freed by reference counting at once, never left for the collector (frozen by
``idled.ops.gcpolicy``: until its next thaw).
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import trio

from idled.door.websocket import WebSocketStream
from idled.protocol import (
    KEEPALIVE_FRAMES, NEED_DATA, PING, PONG_FRAME, Error, FrameDecoder, ProtocolError, encode,
)
from idled.protocol.codec import PONG_BODY
from idled.protocol.messages import ErrorCode
from idled.protocol.websocket import WsDecoder, close_code, close_frame, message
from idled.server.runtime.looplock import loop_lock
from idled.server.roles.users import LOGOUT, PONG, UserConnection, UserSink, user_step

__all__ = ["COALESCE", "MAX_OUT", "UserPlane"]

log = logging.getLogger("idled.server.roles.plane")

COALESCE: Final = 0.010  # seconds the thread lets readiness gather after a batch (module docstring)
MAX_OUT: Final = 65536  # bytes of pongs a user may leave unread before the plane stops reading it
RECV_BYTES: Final = 16384
_IN = select.EPOLLIN | select.EPOLLRDHUP
_RETRY: Final = (BlockingIOError, InterruptedError)
_WS_PONG: Final = message(PONG_BODY)


class UserPlane:
    """See the module docstring. ``users`` is the ``UserSink`` the connections belong to; ``release`` gives
    a closed connection's count back (the doorway's); ``reject(code)`` counts a protocol error."""

    def __init__(self, users: UserSink[Any], *, release: Callable[[], None],
                 reject: Callable[[str], None]) -> None:
        self.users = users
        self.release = release
        self.reject = reject
        self.epoll = select.epoll()
        # descriptor -> connection: a list, not a dict -- 8 bytes a slot (up to the highest descriptor seen,
        # grown by doubling, never shrunk) where a dict entry and the int object of its key cost ~64 a
        # connection (descriptors are small and dense)
        self.conns: list[UserConnection | None] = []
        self._count = 0
        self.stopped = False  # run() has ended: the epoll is closed, a late login keeps its own task
        self._ending: dict[UserConnection, str] = {}  # closed, waiting for the task to end them (_settle)
        self._work = trio.Event()  # the task's wake-up: something to end, or the thread failed
        self._asked = False  # the thread has asked the loop to set _work (once until the task runs)
        self._crashed: BaseException | None = None
        self._served = threading.Event()  # the loop served a batch the thread handed it (_serve_on_loop)
        # The thread's stop: cuts its epoll wait and its coalescing nap short (a poll of this descriptor alone:
        # a timed wait costs ~20-30 us of CPU here, threading.Event's ~8 more than a poll's)
        self._wakeup = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.epoll.register(self._wakeup, select.EPOLLIN)
        self._nap = select.poll()
        self._nap.register(self._wakeup, select.POLLIN)

    def __len__(self) -> int:
        return self._count

    def records(self) -> Iterator[UserConnection]:
        """Every adopted connection."""
        return (record for record in self.conns if record is not None)

    def _record(self, fd: int) -> UserConnection | None:
        return self.conns[fd] if 0 <= fd < len(self.conns) else None

    # -- entering ------------------------------------------------------------------------------------------

    def adopt(self, stream: trio.abc.Stream, key: Any, handle: Any, conn: UserConnection,
              decoder: FrameDecoder) -> bool:
        """Take over a logged-in user's connection (True), or leave it to its task (False: not a plain socket,
        the plane has stopped, or the kernel would not watch one more descriptor). ``handle``: what its frames
        touch (``UserSink.handle``, asked by the user loop).

        The caller's task must end without touching the stream again; what the decoder still holds is served
        at the plane's next step."""
        if isinstance(stream, WebSocketStream):  # plain WebSocket: its socket, read through its WsDecoder
            decoder, stream = stream.decoder, stream.raw
        if type(stream) is not trio.SocketStream or self.stopped:
            return False
        fd = stream.socket.fileno()
        try:
            self.epoll.register(fd, _IN)  # first: if the kernel refuses (its epoll watch limit), nothing changed
        except OSError as exc:
            log.warning("user plane: cannot watch a connection (%s); it keeps its own task", exc)
            return False
        trio.lowlevel.notify_closing(stream.socket)  # out of trio's epoll: ours from now on
        sock = socket.socket(fileno=stream.socket.detach())
        sock.setblocking(False)
        conn.key = key
        conn.handle = handle
        conn.sock = sock  # (the connection is the plane's record of it; its descriptor, its place in the table)
        conn.ws = decoder if isinstance(decoder, WsDecoder) else None
        # A plain connection's decoder exists only while bytes are pending (module docstring)
        conn.decoder = decoder if conn.ws is not None or decoder.buffered else None
        conn.limit = decoder.max_frame
        conn.out = b""
        conn.reading = True
        conn.plane = self  # from now on close() asks the plane (request_close)
        del conn.scope  # its task is ending, and its cancel scope with it
        if fd >= len(self.conns):
            self.conns.extend([None] * (max(fd + 1, 2 * len(self.conns)) - len(self.conns)))
        self.conns[fd] = conn
        self._count += 1
        if conn.end is not None:  # closed between the welcome and now
            self.request_close(conn)
        elif decoder.buffered or conn.ws is not None and (conn.ws.replies or conn.ws.closed is not None):
            self._frames(conn, decoder, self.users.now())  # (the record keeps this decoder, as set above)
            self._settle()
        return True

    def request_close(self, record: UserConnection) -> None:
        """Close ``record``'s connection soon, on the plane's task (its ``conn.end`` says how)."""
        if self._close(record, "closed"):
            self._work.set()

    # -- the task and its thread -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve every adopted connection until cancelled; then close whatever is left.

        The keepalives are served by a thread (module docstring); this task ends the connections it closes."""
        lock, token = loop_lock(), trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._serve_thread, args=(lock, token), name="idled-plane", daemon=True)
        thread.start()
        try:
            while True:
                await self._work.wait()
                self._work, self._asked = trio.Event(), False
                if self._crashed is not None:
                    raise RuntimeError("the user plane's thread failed") from self._crashed
                self._settle()
        finally:
            self.stopped = True  # (a login finishing during shutdown must not register in a closed epoll)
            self._served.set()  # (the loop will serve no batch for it any more)
            os.eventfd_write(self._wakeup, 1)  # out of its epoll wait
            lock.release()  # the thread may be waiting for the loop lock: it takes it, sees stopped, and ends
            try:
                thread.join()
            finally:
                lock.acquire()
            for record in self.records():
                record.handle = None
                record.sock.close()
                self.release()
            self.conns.clear()
            self._count = 0
            self.epoll.close()
            os.close(self._wakeup)

    def _serve_thread(self, lock: threading.Lock, token: trio.lowlevel.TrioToken) -> None:
        """The thread: wait on the epoll holding neither the GIL nor the loop lock, serve what is ready under the
        lock, and ask the task to end what closed. At most one poll per ``COALESCE`` (*Coalescing*)."""
        epoll = self.epoll
        polled = -math.inf  # time.monotonic() of the last poll
        try:
            while not self.stopped:
                events: list[tuple[int, int]] | None = epoll.poll(-1, self._count + 1)
                if (early := polled + COALESCE - time.monotonic()) > 0:
                    self._nap.poll(early * 1000)  # woken sooner than COALESCE after the last poll: let readiness gather
                    events = None  # (polled again under the lock)
                if not lock.acquire(timeout=COALESCE):
                    # The loop has not waited for I/O for that long: busy (a login storm), it would win the lock
                    # back after each of its waits (no hand-off). It serves this batch itself, one turn from now.
                    self._served.clear()
                    if self.stopped:  # (after the clear: a stop that set _served before it is seen here)
                        return
                    token.run_sync_soon(self._serve_on_loop)
                    self._served.wait()
                    polled = time.monotonic()
                    continue
                try:
                    if self.stopped:
                        return
                    polled = time.monotonic()
                    self._serve(epoll.poll(0, self._count + 1) if events is None else events)
                    if self._ending and not self._asked:  # wake the task: connections wait to be ended
                        self._asked = True
                        token.run_sync_soon(self._wake_task)
                finally:
                    lock.release()
        except BaseException as exc:  # a bug: the task raises it (a plane that stopped serving must not go unseen)
            with lock:
                self._crashed = exc
                token.run_sync_soon(self._wake_task)

    def _wake_task(self) -> None:
        self._work.set()  # (run by the loop: self._work is whichever Event the task awaits now)

    def _serve_on_loop(self) -> None:
        """Run by the loop for a thread that could not get the lock: the batch, then the thread goes on."""
        try:
            self.drain()
        finally:
            self._served.set()

    def drain(self) -> None:
        """Serve every socket ready now, in one poll, and end what closed, before returning (module docstring).
        Called by a task: the loop lock is held, so the plane's thread is not serving meanwhile."""
        if not self.stopped:
            self._serve(self.epoll.poll(0, self._count + 1))
            self._settle()

    def _serve(self, events: list[tuple[int, int]]) -> None:
        """Serve the sockets ``events`` report (under the loop lock, from the thread or a task): reads, touches,
        pongs and flushes. What closes is only filed here (``_close``); the task ends it (``_settle``)."""
        conns = self.conns
        reads: list[tuple[UserConnection, bytes]] = []
        for fd, mask in events:
            record = conns[fd] if fd < len(conns) else None
            if record is None:  # (the stop's eventfd, or a connection ended since the thread polled)
                continue
            try:
                # (the thread's events were polled before it took the lock: one may be for a connection filed
                # as closed since, out of the epoll -- not to be re-armed -- and no longer read)
                if mask & select.EPOLLOUT and record not in self._ending:
                    self._flush(record)
                if mask & ~select.EPOLLOUT and record.reading and (data := self._recv(record)) is not None:
                    reads.append((record, data))
            except Exception:
                self._bug(record)
        # Read after every recv of the batch: no byte handled here arrived after it (a stamp before its
        # frame arrived could be an early offline).
        now = self.users.now()
        for record, data in reads:
            try:
                self._handle(record, data, now)
            except Exception:
                self._bug(record)

    def _bug(self, record: UserConnection) -> None:
        """Serving ``record`` failed (a bug): that connection is closed, the others are served on."""
        log.exception("user plane: serving %r failed (bug); connection closed", record.key)
        self._close(record, "closed")

    def _settle(self) -> None:
        """On a task: end every connection filed as closed (``_finish``), in the order they were filed."""
        ending = self._ending
        while ending:
            record = next(iter(ending))
            self._finish(record, ending.pop(record))

    @staticmethod
    def _recv(record: UserConnection) -> bytes | None:
        """What the socket holds (b"": its end, or an error: the connection closes), None if nothing."""
        try:
            data: bytes = record.sock.recv(RECV_BYTES)
        except _RETRY:
            return None
        except OSError:
            return b""
        return data

    def _handle(self, record: UserConnection, data: bytes, now: float) -> None:
        """One read of ``record``'s: its frames touched at ``now``, pongs sent, its end filed."""
        decoder = record.decoder
        if not data:
            if decoder is not None and decoder.buffered and record.end is None:
                self._failed(record, ProtocolError(
                    ErrorCode.BAD_FRAME, f"end of stream inside a frame ({decoder.buffered} bytes pending)"))
            self._close(record, "closed")
            return
        if decoder is None:
            message = KEEPALIVE_FRAMES.get(data)
            if message is not None:  # one whole keepalive and nothing else: the commonest read of all
                if record.end is None:
                    self.users.touch(record.handle, now)
                if message is PING:
                    self._send(record, PONG_FRAME)
                return
            decoder = record.decoder = FrameDecoder(record.limit)
        decoder.receive_data(data)
        self._frames(record, decoder, now)

    def _failed(self, record: UserConnection, exc: ProtocolError) -> None:
        self.reject(exc.code)
        if record.end is None:
            record.end = (exc.code, exc.reason)

    def _frames(self, record: UserConnection, decoder: FrameDecoder, now: float) -> None:
        touch = self.users.touch
        try:
            while (message := decoder.next_event()) is not NEED_DATA:
                if record.end is None:  # a closed connection's last frames are not anyone's activity
                    touch(record.handle, now)
                step = user_step(message)
                if step == PONG:
                    self._send(record, PONG_FRAME if record.ws is None else _WS_PONG)
                elif step == LOGOUT:
                    self._close(record, "logout")
                    return
        except ProtocolError as exc:
            self._failed(record, exc)
            self._close(record, "closed")
            return
        ws = record.ws
        if ws is None:
            if not decoder.buffered:
                record.decoder = None  # nothing pending: back to the lone-keepalive path
        else:  # control frames: pongs owed, the peer's close (echoed in the replies)
            if ws.replies:
                self._send(record, ws.take_replies())
            if ws.closed is not None:
                self._close(record, "closed")

    def _send(self, record: UserConnection, data: bytes) -> None:
        if record.out:
            record.out += data
        else:
            try:
                sent = record.sock.send(data)
            except _RETRY:
                sent = 0
            except OSError:
                return  # the read side will see it go
            if sent == len(data):
                return
            record.out = data[sent:]
            self.epoll.modify(record.sock, _IN | select.EPOLLOUT)
        if len(record.out) > MAX_OUT and record.reading:
            record.reading = False  # it does not read: stop reading it (its session goes idle)
            self.epoll.modify(record.sock, select.EPOLLOUT)

    def _flush(self, record: UserConnection) -> None:
        try:
            sent = record.sock.send(record.out)
        except _RETRY:
            return
        except OSError:
            record.out = b""
            return
        record.out = record.out[sent:]
        if not record.out:
            record.reading = True
            self.epoll.modify(record.sock, _IN)

    # -- leaving ---------------------------------------------------------------------------------------------

    def _close(self, record: UserConnection, reason: str) -> bool:
        """File the connection as closed (``reason``: ``logout`` or ``closed``): out of the epoll and no longer
        read at once; its end waits for the task (``_finish``: ending a session calls into trio). False: it is
        filed already, or no longer the plane's (its descriptor ended, or went to another connection)."""
        if record in self._ending or self._record(record.sock.fileno()) is not record:
            return False
        self._ending[record] = reason
        record.reading = False
        self.epoll.unregister(record.sock)
        return True

    def _finish(self, record: UserConnection, reason: str) -> None:
        """End the connection: its session (``users.end`` does nothing if it no longer owns it), the error
        frame if it was closed by the server or for a protocol error (best effort: a socket's buffer takes
        it), the socket, and its count."""
        self.conns[record.sock.fileno()] = None
        self._count -= 1
        record.handle = None  # (the core's refers back to the connection: freed without the collector)
        self.users.end(record.key, record, reason)
        end = record.end
        last = b""
        if end is not None:
            last = encode(Error(str(end[0]), end[1]))
            if record.ws is not None:
                last = message(last[4:]) + close_frame(close_code(str(end[0])), str(end[0]))
        elif record.ws is not None and record.ws.closed is None:
            last = close_frame(close_code(None))  # (bye: a normal close; the peer's own close was echoed)
        if last:
            try:
                record.sock.send(record.out + last)
            except OSError:
                pass
        record.sock.close()
        self.release()
