"""An observer's memory is bounded in bytes: a query flooder is back-pressured, a stalled reader is cut with a
`busy` frame that arrives whole (ahead of, instead of, its backlog), and resumes without a gap.

In-process server listening on loopback (real sockets: the stall rule and the frame alignment concern
what the kernel took), real clock, `OBSERVER_STALL` shortened so a stall is decided in a second.
`queued_bytes()` is the test hook: the bytes held for observers beyond the shared window.
"""

from __future__ import annotations

import functools
import logging
import socket
from pathlib import Path

import pytest
import trio

import idled.server.roles.observers
from idled.protocol import Attach, Error, Event, Login, Query, Subscribe, Welcome, encode
from idled.server.roles.observers import REPLY_BYTES, FrameWriter, Observers, _rest_of_frame

from tests import peers
from tests.peers import Client

running = functools.partial(peers.running, listen=True, metrics=False, recv_timeout=30.0, settle=False)
STALL = 1.0


def observers_of(h: peers.Harness) -> Observers:
    """The server's observer role (the doorway's roles table holds its bound `run`)."""
    role = h.server.running.doorway.roles["observer"]  # type: ignore[union-attr]
    return role.__self__  # type: ignore[attr-defined, no-any-return]


async def small_window_stream(port: int, rcvbuf: int = 8192) -> trio.SocketStream:
    """A TCP connection whose receive buffer is small and fixed (no autotuning): a stalled reader fills it fast."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


def test_rest_of_frame() -> None:
    frames = [b"aaaa", b"bbb", b"cc"]
    data = b"".join(frames)
    assert _rest_of_frame(frames, data, 0) == b""  # nothing of any frame sent
    assert _rest_of_frame(frames, data, 2) == b"aa"
    assert _rest_of_frame(frames, data, 4) == b""  # at a frame boundary
    assert _rest_of_frame(frames, data, 5) == b"bb"
    assert _rest_of_frame(frames, data, 8) == b"c"


async def test_frame_writer_stalls_and_completes_the_cut_frame() -> None:
    """A peer that reads nothing: `write` raises Stalled, `partial` is the unsent end of the frame in flight,
    and once the peer reads, `finish` sends exactly that: the peer sees whole frames only."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    client = await small_window_stream(listener.socket.getsockname()[1])
    server = await listener.accept()
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    writer = FrameWriter(server)
    frames = [encode(Error("x", "y" * 1000)) for _ in range(400)]  # ~400 KB: far more than the buffers hold
    with pytest.raises(idled.server.roles.observers.Stalled):
        await writer.write(frames, 0.3)
    assert writer.partial  # a frame was cut (the buffers do not end on a frame boundary)
    received = bytearray()

    async def read_all() -> None:
        while data := await client.receive_some(65536):
            received.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        assert await writer.finish()
        await server.aclose()
    assert len(received) % len(frames[0]) == 0  # whole frames, however many
    assert received == b"".join(frames)[: len(received)]
    await listener.aclose()


async def test_query_flooder_is_back_pressured_then_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Queries sent without reading a reply: the server queues at most REPLY_BYTES (+ one reply) for the
    observer, stops reading its requests, and cuts it once it has taken nothing for OBSERVER_STALL."""
    monkeypatch.setattr(idled.server.roles.observers, "OBSERVER_STALL", STALL)
    caplog.set_level(logging.WARNING, "idled.server.roles.observers")
    async with running(tmp_path) as h:
        role = observers_of(h)
        flood = await Client.login(h.port, "observer", "flood")
        query = encode(Query(tuple(10**9 + i for i in range(800))))  # ~4 KB: a full frame, a ~5 KB reply
        sent, most, stopped = 0, 0, False
        with trio.move_on_after(20):
            while not stopped:
                # Blocked for half the stall limit: the server no longer reads. Or it already cut us.
                with trio.move_on_after(STALL / 2) as blocked:
                    try:
                        await flood.send_raw(query)
                    except trio.BrokenResourceError:
                        stopped = True
                stopped = stopped or blocked.cancelled_caught
                sent += 1
                most = max(most, role.queued_bytes())
        assert stopped, f"the server kept reading queries ({sent} sent)"
        assert 0 < most <= REPLY_BYTES + 8192
        with trio.fail_after(10):
            while role.queued_bytes():  # cut: its replies are dropped
                await trio.sleep(0.05)
        assert any("took nothing" in r.getMessage() for r in caplog.records)
        # a well-behaved observer is served as usual meanwhile and after
        ok = await Client.login(h.port, "observer", "ok")
        await ok.send(Query((1,)))
        assert (await ok.recv()).online == {1: False}


async def test_stalled_observer_gets_busy_whole_and_resumes_without_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(idled.server.roles.observers, "OBSERVER_STALL", STALL)
    caplog.set_level(logging.WARNING, "idled.server.roles.observers")
    uids = 50_000  # ~5 MB of events: more than the kernel holds for one connection
    async with running(tmp_path) as h:
        stalled = Client(await small_window_stream(h.port), recv_timeout=30.0)
        await stalled.send(Login("observer", "stalled"))
        await stalled.expect(Welcome)
        await stalled.send(Subscribe())
        fast = await Client.login(h.port, "observer", "fast")
        await fast.send(Subscribe())
        gateway = await Client.login(h.port, "gateway", "gw")
        reference: list[Event] = []

        async def read_fast() -> None:
            reference.extend([await fast.expect(Event) for _ in range(uids)])  # never cut

        got: list[Event] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_fast)
            await gateway.send(Attach(tuple(range(uids))))
            # The stalled one reads nothing until the server has decided to cut it, then at once: the busy
            # frame waits at most ~SEND_ERROR_TIMEOUT for it.
            with trio.fail_after(30):
                while not any("took nothing" in r.getMessage() for r in caplog.records):
                    await trio.sleep(0.01)
            while isinstance(message := await stalled.recv(), Event):
                got.append(message)
        assert [e.seq for e in reference] == list(range(1, uids + 1))
        assert isinstance(message, Error) and message.code == "busy", message
        assert await stalled.recv() is None
        assert 0 < len(got) < uids  # it was cut, and its backlog did not come before the busy frame
        assert got == reference[: len(got)]
        resumed = await Client.login(h.port, "observer", "stalled")
        await resumed.send(Subscribe(got[-1].seq + 1))
        rest = await resumed.drain()
        assert got + rest == reference  # no loss, no gap, no duplicate
        # The reply is accounted as sent once the server's send returns, which may be after the client has
        # read it: held bytes drain to nothing shortly, not necessarily at this instant.
        with trio.fail_after(5):
            while observers_of(h).queued_bytes():
                await trio.sleep(0.01)
