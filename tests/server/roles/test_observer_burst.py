"""Observers against event bursts, on a real `idled serve` and real sockets.

An observer that keeps reading is never cut, whatever the burst: 100k uids attached in one gateway frame,
then 100k offlines due in one tick. One that stops reading is cut with `busy` (after the daemon's
`OBSERVER_STALL` seconds without taking a byte), the `busy` frame arrives whole, and a resubscription from
its last seq + 1 delivers the rest without loss, gap or duplicate.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio

from idled.protocol import PING, PONG, Attach, Error, Event, Login, Subscribe, Touch, Welcome
from idled.server.roles.observers import OBSERVER_STALL

from tests import peers
from tests.peers import Client

pytestmark = pytest.mark.slow  # real `idled serve` subprocesses, real time


class Daemon(peers.Daemon):
    def __init__(self, tmp_path: Path, *extra: str) -> None:
        command = peers.serve_command(tmp_path / "data", "--fsync", "never", "--metrics-port", "0", *extra)
        super().__init__(command, tmp_path / "stderr.log")


async def small_window_client(port: int, rcvbuf: int = 16384) -> Client:
    """A client whose receive buffer is small and fixed (no autotuning): when it stops reading, the server
    soon has nowhere to put its events."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect(("127.0.0.1", port))
    return Client(trio.SocketStream(sock), recv_timeout=60.0)


async def test_a_reading_observer_survives_100k_attaches_in_one_frame_and_100k_offlines_in_one_tick(
    tmp_path: Path,
) -> None:
    uids = 100_000
    daemon = Daemon(tmp_path)
    try:
        port = await daemon.started()
        observer = await Client.login(port, "observer", "fast", recv_timeout=60.0)
        await observer.send(Subscribe())
        gateway = await Client.login(port, "gateway", "gw", recv_timeout=60.0)
        # keepalive 8: a 12 s timeout, longer than the attach takes on a loaded machine
        await gateway.send(Attach(tuple(range(uids)), keepalive=8))
        online = [await observer.expect(Event) for _ in range(uids)]
        assert [e.seq for e in online] == list(range(1, uids + 1))
        assert {e.kind for e in online} == {"online"}
        # One touch frame for all: every deadline falls within one tick, so they expire together.
        await gateway.send(Touch(tuple(range(uids))))
        await gateway.send(PING)
        assert await gateway.recv() is PONG  # the touch was applied
        offline = [await observer.expect(Event) for _ in range(uids)]
        assert [e.seq for e in offline] == list(range(uids + 1, 2 * uids + 1))
        assert {(e.kind, e.reason) for e in offline} == {("offline", "idle")}
        assert max(e.deadline for e in offline) - min(e.deadline for e in offline) < 1.0  # one tick (1 s)
        assert "took nothing" not in daemon.stderr()
    finally:
        daemon.kill()


async def test_a_stalled_observer_gets_busy_then_resumes_from_its_last_seq(tmp_path: Path) -> None:
    uids = 80_000  # ~9 MB of events: more than the kernel buffers one connection
    daemon = Daemon(tmp_path)
    try:
        port = await daemon.started()
        stalled = await small_window_client(port)
        await stalled.send(Login("observer", "stalled"))
        await stalled.expect(Welcome)
        await stalled.send(Subscribe())
        fast = await Client.login(port, "observer", "fast", recv_timeout=60.0)
        await fast.send(Subscribe())
        gateway = await Client.login(port, "gateway", "gw", recv_timeout=60.0)
        reference: list[Event] = []

        async def read_fast() -> None:
            reference.extend([await fast.expect(Event) for _ in range(uids)])

        got: list[Event] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_fast)
            await gateway.send(Attach(tuple(range(uids))))
            # Read nothing until the daemon has cut it, then at once (the busy frame waits ~1 s for us).
            with trio.fail_after(OBSERVER_STALL + 60):
                while "observer stalled took nothing" not in daemon.stderr():
                    await trio.sleep(0.01)
            while isinstance(message := await stalled.recv(), Event):
                got.append(message)
        assert isinstance(message, Error) and message.code == "busy", message
        assert await stalled.recv() is None
        assert [e.seq for e in reference] == list(range(1, uids + 1))  # the fast one: everything, not cut
        assert 0 < len(got) < uids
        assert got == reference[: len(got)]
        resumed = await Client.login(port, "observer", "stalled", recv_timeout=60.0)
        await resumed.send(Subscribe(got[-1].seq + 1))
        rest = [await resumed.expect(Event) for _ in range(uids - len(got))]
        assert got + rest == reference  # no loss, no gap, no duplicate
        assert "observer fast took nothing" not in daemon.stderr()
    finally:
        daemon.kill()
