"""The user plane (idled.server.roles.plane): logged-in plain TCP users served by its thread, in-process, real sockets.

Every behaviour a user sees from its own task must be the same from the plane: pong, bye, the error frame
of a protocol error or of a close by the server, the end of its session, its connection count.
"""

from __future__ import annotations

import struct
import time
from typing import Any, cast
from pathlib import Path

import msgpack
import pytest
import trio
import trio.testing

from idled.protocol import BYE, PING, PING_FRAME, PONG, PONG_FRAME, QUIET_FRAME, Attach, Error, ErrorCode, Event, Msg, Welcome
from idled.server.roles.plane import MAX_OUT
from tests.peers import Client, Harness, running


async def user(h: Harness, uid: str, keepalive: float = 30.0) -> Client:
    client = await Client.login(h.port, "uid", uid, keepalive=keepalive)
    with trio.fail_after(5):
        while h.server.running.plane is None or not any(r.key == uid for r in h.server.running.plane.records()):
            await trio.sleep(0.01)  # handed over right after the welcome
    return client


async def test_pings_messages_and_bye_through_the_plane(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True) as h:
        observer = await h.observer()
        alice = await user(h, "alice")
        assert h.server.connections["user"] == 1
        for _ in range(3):
            await alice.send(PING)
            assert await alice.recv() is PONG
        await alice.send(Msg({"hello": 1}))
        await alice.send(BYE)
        assert await alice.recv() is None  # closed after bye, no frame
        events = [await observer.expect(Event) for _ in range(2)]
        assert [(e.kind, e.reason) for e in events] == [("online", "login"), ("offline", "logout")]
        with trio.fail_after(5):
            while h.server.connections["user"]:
                await trio.sleep(0.01)  # the plane gave the count back


async def test_a_connection_the_plane_ended_is_freed_without_the_collector(tmp_path: Path) -> None:
    # The core's plane touches the session's record, whose owner is the connection: a cycle while it lives. The
    # collector is frozen between thaws (idled.ops.gcpolicy), so an ended connection left in a cycle would be
    # kept until the next one: the plane must cut it.
    import gc

    from idled.server.roles.users import UserConnection

    async with running(tmp_path, listen=True) as h:
        gc.collect()
        gc.disable()
        try:
            for name in ("ann", "bob"):
                client = await user(h, name)
                await client.send(BYE)
                assert await client.recv() is None
            with trio.fail_after(5):
                while h.server.connections["user"]:
                    await trio.sleep(0.01)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = [o for o in gc.garbage if isinstance(o, UserConnection)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert left == []


class _LoopTurns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.turns = 0

    def after_io_wait(self, timeout: float) -> None:
        self.turns += 1


async def blocking_pings(client: Client, n: int) -> int:
    """``n`` pings, each waiting for its pong, from a plain socket in a worker thread (no loop turn of this
    client's own); how many were answered. The socket is a duplicate of the client's descriptor, with a timeout
    (not ``setblocking(True)``: a duplicate shares the file status flags), so a starved plane fails, not hangs."""
    import os
    import socket

    with socket.socket(fileno=os.dup(client.stream.socket.fileno())) as sock:
        sock.settimeout(5.0)

        def pings() -> int:
            answered = 0
            for _ in range(n):
                sock.sendall(PING_FRAME)
                answered += sock.recv(64) == PONG_FRAME  # (a pong is one segment: 4 + 11 bytes)
            return answered

        return await trio.to_thread.run_sync(pings)


async def test_keepalives_are_answered_without_turns_of_the_event_loop(tmp_path: Path) -> None:
    # The plane serves keepalives from its own thread (idled.runtime.looplock): a ping costs no trio loop turn.
    # The client pings from a plain blocking socket in a worker thread, so the loop's only turns are its own
    # timers' (its monitor beats four times a tick) and the worker's return: far fewer than the pings.
    async with running(tmp_path, listen=True, tick=2.0) as h:
        kim = await user(h, "kim")
        counter = _LoopTurns()
        trio.lowlevel.add_instrument(counter)
        try:
            assert await blocking_pings(kim, 200) == 200
        finally:
            trio.lowlevel.remove_instrument(counter)
        assert counter.turns < 50, f"{counter.turns} loop turns for 200 keepalives"


async def test_keepalives_are_answered_while_the_event_loop_is_busy(tmp_path: Path) -> None:
    # A loop that always has a task to run waits for I/O with a zero timeout and takes the loop lock straight
    # back: the thread must still get its keepalives answered (it hands its batch to the loop).
    async with running(tmp_path, listen=True, tick=2.0) as h:
        lee = await user(h, "lee")

        async def busy(done: trio.Event) -> None:
            while not done.is_set():
                await trio.lowlevel.checkpoint()  # always runnable: every I/O wait has a zero timeout

        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy, done)
            answered = await blocking_pings(lee, 50)
            done.set()
        assert answered == 50


async def test_quiet_keepalives_keep_a_user_online_and_are_not_answered(tmp_path: Path) -> None:
    # {"op":"msg"} is the quiet keepalive: activity, no answer. Only the ping at the end gets a frame back.
    async with running(tmp_path, listen=True, tick=0.1) as h:
        observer = await h.observer()
        ivan = await user(h, "ivan", keepalive=1.0)  # timeout 1.5 s
        assert (await observer.expect(Event)).kind == "online"
        for _ in range(10):  # 3 s: twice the timeout
            await ivan.send_raw(QUIET_FRAME)
            await trio.sleep(0.3)
        await ivan.send(PING)
        # The first frame back is the pong: no answer to any quiet keepalive, and no idle_timeout either.
        assert await ivan.recv() is PONG
        with trio.move_on_after(0.3):
            event = await observer.recv()
            raise AssertionError(f"an event while ivan kept sending quiet keepalives: {event}")


async def test_a_keepalive_split_across_reads_goes_through_a_decoder_then_back_to_none(tmp_path: Path) -> None:
    # A plain connection has a decoder only while bytes are pending: a frame in two reads needs one, and
    # once it is whole the connection is back on the lone-keepalive path.
    async with running(tmp_path, listen=True) as h:
        judy = await user(h, "judy")
        plane = h.server.running.plane
        assert plane is not None
        record = next(r for r in plane.records() if r.key == "judy")
        assert record.decoder is None
        await judy.send_raw(PING_FRAME[:5])
        with trio.fail_after(5):
            while record.decoder is None:
                await trio.sleep(0.01)
        assert record.decoder.buffered == 5
        await judy.send_raw(PING_FRAME[5:] + PING_FRAME)  # the rest, then a whole one in the same read
        assert await judy.recv() is PONG and await judy.recv() is PONG
        assert record.decoder is None


async def test_a_protocol_error_closes_that_connection_with_its_frame(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True) as h:
        bob, carol = await user(h, "bob"), await user(h, "carol")
        await bob.send(Attach(("x",)))  # not for users
        error = await bob.expect(Error)
        assert error.code == ErrorCode.NOT_ALLOWED
        assert await bob.recv() is None
        assert h.metric("idled_frames_rejected_total", reason="not_allowed") == 1
        await carol.send(PING)
        assert await carol.recv() is PONG  # nobody else is affected
        await carol.send_raw(struct.pack(">I", 10) + b"\x81")  # a partial frame, then the end of the stream
        await carol.stream.send_eof()
        assert (await carol.expect(Error)).code == ErrorCode.BAD_FRAME


async def test_closed_by_the_server_kicked_and_idle(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, tick=0.1) as h:
        first = await user(h, "dave")
        second = await Client.login(h.port, "uid", "dave", keepalive=30.0)  # newest wins
        assert (await first.expect(Error)).code == ErrorCode.KICKED
        assert await first.recv() is None
        await second.send(PING)
        assert await second.recv() is PONG
        quiet = await user(h, "erin", keepalive=1.0)  # timeout 1.5 s, then silence
        with trio.fail_after(5):
            assert (await quiet.expect(Error)).code == ErrorCode.IDLE_TIMEOUT


async def test_a_user_that_pings_without_reading_stops_being_read_and_goes_idle(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, tick=0.1) as h:
        greedy = await user(h, "frank", keepalive=1.0)
        ping = struct.pack(">I", len(body := msgpack.packb({"op": "ping"}))) + body
        sock = greedy.stream.socket
        sent = 0
        with trio.move_on_after(10):
            while sent < 4 * MAX_OUT:  # pongs pile up: the client never reads them
                rest = memoryview(ping * 64)
                try:
                    while rest:  # whole frames only: a partial send's remainder must follow, or the stream is garbage
                        rest = rest[await sock.send(rest):]
                except ConnectionResetError:
                    break  # already closed idle: its socket stopped being read before this loop was done
                sent += 64 * len(ping)
        assert h.server.running.presence is not None
        with trio.fail_after(10):
            while h.server.running.presence.is_online("frank"):
                await trio.sleep(0.05)  # no longer read, so no longer active: idle
        assert h.metric("idled_presence_events_total", kind="offline", reason="idle") == 1


async def test_shutdown_closes_plane_connections_with_server_shutdown(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True) as h:
        gina = await user(h, "gina")
        h.server.stop()
        assert (await gina.expect(Error)).code == ErrorCode.SERVER_SHUTDOWN
        with trio.fail_after(10):
            await h.done.wait()
        assert h.server.connections["user"] == 0


async def test_welcome_then_frames_already_buffered_are_served(tmp_path: Path) -> None:
    """Frames that arrived with the login (pipelined) are in the decoder when the plane adopts it."""
    async with running(tmp_path, listen=True) as h:
        client = await Client.connect(h.port)
        await client.send_raw(b"".join(
            struct.pack(">I", len(b)) + b for b in (msgpack.packb({"op": "login", "uid": "hal"}),
                                                    msgpack.packb({"op": "ping"}))))
        assert isinstance(await client.recv(), Welcome)
        assert await client.recv() is PONG


async def test_closed_plane_connections_leave_no_cycles(tmp_path: Path) -> None:
    # An adopted connection is its own record (UserConnection): nothing points back at it from the plane but its
    # table slot, cleared on close, so reference counting frees it, the socket and the decoder at once --
    # cyclic garbage would wait for a GC thaw (idled.ops.gcpolicy freezes what survives a full collection).
    import gc
    from collections import Counter

    async with running(tmp_path, listen=True) as h:
        gc.collect()
        gc.disable()
        try:
            clients = {way: [await user(h, f"{way}{i}", keepalive=1.0) for i in range(20)]
                       for way in ("bye", "gone", "idle", "kicked", "bad")}
            newer = [await user(h, f"kicked{i}") for i in range(20)]
            for client in clients["bye"]:
                await client.send(BYE)
            for client in clients["gone"]:
                await client.stream.aclose()
            for client in clients["bad"]:
                await client.send(Attach(("x",)))
            for client in clients["kicked"]:
                assert (await client.expect(Error)).code == ErrorCode.KICKED
            for client in clients["idle"]:
                assert (await client.expect(Error)).code == ErrorCode.IDLE_TIMEOUT
            for client in newer:
                await client.send(BYE)
            with trio.fail_after(10):
                while h.server.connections["user"]:
                    await trio.sleep(0.01)
            for client in [c for cs in clients.values() for c in cs] + newer:
                await client.stream.aclose()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            kinds = Counter(type(o).__qualname__ for o in gc.garbage)
            assert not gc.garbage, f"{len(gc.garbage)} objects in cycles after 120 sessions: {kinds.most_common(8)}"
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()


async def test_a_login_finishing_after_the_plane_stopped_keeps_its_own_task() -> None:
    # Shutdown (e.g. a fatal disk error) cancels the plane's task while a login may still be waiting for its
    # welcome: its hand-over must leave the connection to its task, not register in the closed epoll.
    from idled.protocol import FrameDecoder
    from idled.server.roles.plane import UserPlane
    from idled.server.roles.users import UserConnection

    plane = UserPlane(cast(Any, None), release=lambda: None, reject=lambda code: None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(plane.run)
        await trio.testing.wait_all_tasks_blocked()  # the plane is waiting on its epoll
        nursery.cancel_scope.cancel()
    assert plane.stopped
    left, right = trio.socket.socketpair()
    with left, right:
        stream = trio.SocketStream(left)
        assert plane.adopt(stream, "late", "late", UserConnection(), FrameDecoder()) is False
        assert stream.socket.fileno() == left.fileno()  # untouched: still the task's


async def test_keepalives_the_plane_let_gather_count_before_the_tick_judges(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # The plane sleeps between polls while traffic flows (its Coalescing); here for far longer than alice's
    # timeout, so her pings sit unread in her socket when her deadline comes. The tick task must read them
    # first (Sessions.drain): she pings every 0.3 s and must stay online.
    import idled.server.roles.plane as plane_module

    monkeypatch.setattr(plane_module, "COALESCE", 4.0)
    async with running(tmp_path, listen=True, tick=0.1, timeout=1.5) as h:
        observer = await h.observer()
        alice = await user(h, "alice", keepalive=1.0)  # timeout 1.5 s
        assert (await observer.expect(Event)).kind == "online"
        await pings_through_a_long_coalescing(alice, observer)


async def pings_through_a_long_coalescing(user: Client, observer: Client) -> None:
    """``user`` (timeout 1.5 s) pings once -- served: the plane's next poll is 4 s away (COALESCE patched) --
    then every 0.3 s for 3 s, twice its timeout; the observer must see no event meanwhile."""
    await user.send(PING)
    assert await user.recv() is PONG
    for _ in range(10):
        await trio.sleep(0.3)
        await user.send(PING)
    with trio.move_on_after(0.5):
        event = await observer.expect(Event)
        raise AssertionError(f"a user pinging every 0.3 s got {event!r}")


class _Sink:
    """Stands in for a UserSink: counts touches and ends."""

    def __init__(self) -> None:
        self.touched: list[Any] = []
        self.ended: list[Any] = []

    def touch(self, key: Any, now: float) -> None:
        self.touched.append(key)

    def now(self) -> float:
        return time.monotonic()  # (called from the plane's thread too: trio's clock is the loop thread's only)

    def end(self, key: Any, conn: Any, reason: str) -> None:
        self.ended.append((key, reason))


async def test_a_descriptor_reused_by_a_new_connection_is_not_closed_by_the_old_ones_close() -> None:
    """Descriptors are the plane's table index: a connection closed, its descriptor taken by the next one, and
    the first closed again (a late kick, an idle expiry) must leave the second alone."""
    import socket

    from idled.protocol import FrameDecoder, PONG_FRAME
    from idled.server.roles.plane import UserPlane
    from idled.server.roles.users import UserConnection

    sink, released = _Sink(), []
    plane = UserPlane(cast(Any, sink), release=lambda: released.append(1), reject=lambda code: None)

    def adopted(key: str) -> tuple[UserConnection, socket.socket]:
        ours, peer = socket.socketpair()
        conn = UserConnection()
        assert plane.adopt(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), key, key, conn, FrameDecoder())
        return conn, peer

    first, first_peer = adopted("first")
    fd = first.sock.fileno()
    first.close(ErrorCode.KICKED, "logged in elsewhere")
    plane.drain()
    assert sink.ended == [("first", "closed")] and len(plane) == 0 and released == [1]
    assert first_peer.recv(4096)  # its error frame
    second, second_peer = adopted("second")
    assert second.sock.fileno() == fd  # the descriptor was reused
    first.close(ErrorCode.IDLE_TIMEOUT, "late")
    first.release("first", ErrorCode.IDLE_TIMEOUT, "late again")
    plane.drain()
    assert len(plane) == 1 and sink.ended == [("first", "closed")] and second.end is None
    second_peer.sendall(PING_FRAME)
    with trio.fail_after(5):
        while not sink.touched:
            await trio.sleep(0.01)
            plane.drain()
    assert sink.touched == ["second"] and second_peer.recv(64) == PONG_FRAME
    for peer in (first_peer, second_peer):
        peer.close()


async def test_a_close_requested_while_the_peer_hangs_up_ends_it_once_and_leaves_nothing_ready() -> None:
    """A kick (``request_close``) and the peer's own hang-up, served in the same drain: the connection is ended
    once, with the kick's error frame attempted, and the epoll holds nothing ready after (a descriptor left
    in it would be reported for ever: a hang-up is reported whatever events are asked for)."""
    import socket

    from idled.protocol import FrameDecoder
    from idled.server.roles.plane import UserPlane
    from idled.server.roles.users import UserConnection

    sink, released = _Sink(), []
    plane = UserPlane(cast(Any, sink), release=lambda: released.append(1), reject=lambda code: None)
    ours, peer = socket.socketpair()
    conn = UserConnection()
    assert plane.adopt(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), "alice", "alice", conn, FrameDecoder())
    peer.close()
    conn.close(ErrorCode.KICKED, "logged in elsewhere")
    plane.drain()
    assert sink.ended == [("alice", "closed")] and len(plane) == 0 and released == [1]
    assert plane.epoll.poll(0) == []


async def test_a_failure_in_the_planes_thread_ends_its_task_with_the_error() -> None:
    """The thread serves every keepalive: if it fails (a bug), the plane's task must raise, not serve on
    without it (every session would go idle unseen)."""
    import socket

    from idled.protocol import FrameDecoder
    from idled.server.roles.plane import UserPlane
    from idled.server.roles.users import UserConnection

    class Broken(_Sink):
        def now(self) -> float:
            raise ZeroDivisionError("a bug")

    plane = UserPlane(cast(Any, Broken()), release=lambda: None, reject=lambda code: None)
    ours, peer = socket.socketpair()
    with peer:
        assert plane.adopt(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), "alice", "alice", UserConnection(),
                           FrameDecoder())
        failed = pytest.RaisesExc(RuntimeError, match="thread failed",
                                  check=lambda exc: isinstance(exc.__cause__, ZeroDivisionError))
        with pytest.RaisesGroup(failed), trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(plane.run)
                await trio.testing.wait_all_tasks_blocked()
                peer.sendall(PING_FRAME)
    assert plane.stopped


async def test_a_frame_that_arrives_while_the_batch_reads_its_clock_is_not_stamped_before_it_arrived() -> None:
    """A keepalive's stamp must not be earlier than the keepalive (an early deadline is an early offline). The
    clock is read once per batch: a frame that arrives after that reading and is then read in the same batch
    would carry a stamp from before it was sent. Here the clock reading itself lets the peer's second ping in."""
    import socket

    from idled.protocol import FrameDecoder
    from idled.server.roles.plane import UserPlane
    from idled.server.roles.users import UserConnection

    sent: list[float] = []
    stamps: list[float] = []

    class Racing(_Sink):
        def touch(self, key: Any, now: float) -> None:
            stamps.append(now)

        def now(self) -> float:
            t = time.monotonic()
            if len(sent) == 1:  # the second ping lands just after this reading
                sent.append(time.monotonic())
                peer.sendall(PING_FRAME)
            return t

    plane = UserPlane(cast(Any, Racing()), release=lambda: None, reject=lambda code: None)
    ours, peer = socket.socketpair()
    with peer:
        assert plane.adopt(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), "alice", "alice", UserConnection(),
                           FrameDecoder())
        sent.append(time.monotonic())
        peer.sendall(PING_FRAME)
        while len(stamps) < 2:
            plane.drain()
        assert len(sent) == 2 and all(stamp >= at for stamp, at in zip(stamps, sent)), (stamps, sent)
        plane.drain()
