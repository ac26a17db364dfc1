"""Watchlist observers end to end: a real `idled serve` subprocess (`--workers 0`, and `--workers 2`, where the
observers are relayed by an edge), real sockets, real users, and `idled watch --uid`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from idled.protocol import BYE, PING, PONG, Event, Subscribe, Unwatch, Watch

from tests import peers
from tests.peers import Client

IDLED = [sys.executable, "-m", "idled.cli.main"]


async def pong_after(client: Client, *requests: object) -> list[Event]:
    """Send `requests` and a ping; the events received before the pong."""
    for request in requests:
        await client.send(request)
    await client.send(PING)
    events = []
    while (message := await client.recv()) is not PONG:
        assert isinstance(message, Event), message
        events.append(message)
    return events


async def visit(port: int, uid: str) -> None:
    """`uid` logs in and says bye: online, then offline (logout)."""
    user = await Client.login(port, "uid", uid)
    await user.send(BYE)
    assert await user.recv() is None


@pytest.mark.slow  # a real `idled serve` subprocess, real time
@pytest.mark.parametrize("workers", ["0", "2"])
async def test_a_watchlist_observer_of_a_real_daemon(tmp_path: Path, workers: str) -> None:
    command = peers.serve_command(tmp_path / "data", "--metrics-port", "0", "--tick", "0.1", "--fsync", "never",
                                  "--workers", workers, "--max-watch", "3")
    async with peers.Daemon(command, tmp_path / "idled.stderr") as daemon:
        full = await Client.login(daemon.port, "observer", "full")
        watcher = await Client.login(daemon.port, "observer", "watcher")
        assert await pong_after(full, Subscribe()) == []
        assert await pong_after(watcher, Subscribe(uids=("alice",))) == []  # in place once the pong is back
        # Through an edge a bye reaches the core in a later batch than the connection's close: each phase
        # waits for its six events on the full stream before the watchlist changes.
        everything: list[Event] = []
        got: list[Event] = []
        for change in (Watch(("carol",)), Unwatch(("alice",)), None):
            for uid in ("alice", "bob", "carol"):
                await visit(daemon.port, uid)
            everything += [await full.recv() for _ in range(6)]
            if change is not None:
                got += await pong_after(watcher, change)  # in effect once the pong is back
        assert [e.seq for e in everything] == list(range(1, 19))
        got += await pong_after(watcher)
        expected = [e for e in everything[:6] if e.uid == "alice"]
        expected += [e for e in everything[6:12] if e.uid in ("alice", "carol")]
        expected += [e for e in everything[12:] if e.uid == "carol"]
        assert got == expected
        # The same, replayed from seq 1 by `idled watch --uid` (filtered from the daemon's memory).
        out = await trio.to_thread.run_sync(lambda: subprocess.run(
            [*IDLED, "watch", "--port", str(daemon.port), "--from", "1", "--uid", "bob", "--uid", "carol",
             "--count", "12", "--json"], capture_output=True, text=True, timeout=30))
        assert out.returncode == 0, out.stderr
        assert "2 uids only" in out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        assert [(r["seq"], r["uid"]) for r in lines] == [(e.seq, e.uid) for e in everything if e.uid != "alice"]
        over = await Client.login(daemon.port, "observer", "over")
        await over.send(Subscribe(uids=("a", "b", "c", "d")))
        error = await over.expect_error("not_allowed")
        assert "max_watch=3" in error.reason
        started = time.monotonic()
        assert await daemon.stop() == 0
        assert time.monotonic() - started < 10
