"""End to end: `idled serve` as a real subprocess, real loopback sockets, real time (tick 0.1 s, timeout 1 s).

Lateness (an offline event's `ts - deadline`) is asserted within [0, one tick + 0.2 s]: never early, and the
0.2 s is slack for a noisy shared machine, not a property of the daemon.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.protocol import BYE, PING, PONG, Error, Event, Query, Status, Subscribe

from tests import peers

TICK = 0.1
TIMEOUT = 1.0
SLACK = 0.2
EDGE_BATCH = 0.01  # idled edge flushes its touches at least this often


class Daemon(peers.Daemon):
    workers: tuple[str, ...] = ()  # set per test by the `workers` fixture

    """`python -m idled.cli.main serve` on a port-0 listener; stderr goes to a file we poll for IDLED_LISTENING."""

    def __init__(self, tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = tmp_path / "data"
        command = peers.serve_command(
            self.data_dir, "--metrics-port", "0", "--tick", str(TICK), "--timeout", str(TIMEOUT), "--login-timeout", "2",
            *self.workers, *extra,
        )
        super().__init__(command, tmp_path / f"idled-{time.monotonic_ns()}.stderr", env=env)


@pytest.fixture(autouse=True, params=["0", "2"], ids=lambda n: f"workers{n}")
def workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test against a single-process daemon and against `--workers 2` (the core behind two edges)."""
    monkeypatch.setattr(Daemon, "workers", ("--workers", request.param))
    return str(request.param)


def read_events(data_dir: Path) -> list[dict[str, Any]]:
    """The log as `idled events --data-dir` prints it (one JSON object per line)."""
    out = subprocess.run(
        [sys.executable, "-m", "idled.cli.main", "events", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


class Client(peers.Client):
    @classmethod
    async def watching(cls, port: int) -> Client:
        """An observer subscribed from now on, and known to be: the server answers an observer's frames in
        order, so the status that answers a query sent after the subscribe proves it was processed. (Through
        an edge the subscribe is relayed, and a login on another edge may otherwise reach the core first.)"""
        observer = await cls.login(port, "observer", "watch")
        await observer.send(Subscribe(None))
        await observer.send(Query(("-",)))
        assert isinstance(await observer.recv(), Status)
        return observer

    async def next_event(self, timeout: float = 10.0) -> Event:
        message = await self.recv(timeout)
        assert isinstance(message, Event), message
        return message


def lateness_ok(event: Event) -> bool:
    return 0.0 <= event.ts - event.deadline <= TICK + SLACK


@pytest.mark.slow  # a real `idled serve` subprocess, real time
async def test_login_ping_expiry_seen_by_a_subscriber(tmp_path: Path, workers: str) -> None:
    async with Daemon(tmp_path) as daemon:
        observer = await Client.watching(daemon.port)
        user = await Client.login(daemon.port, "uid", "alice", keepalive=1.0)  # timeout 1.5 (the smallest keepalive)
        online = await observer.next_event()
        assert (online.kind, online.uid, online.reason, online.extra["timeout"]) == ("online", "alice", "login", 1.5)
        for _ in range(4):
            await trio.sleep(0.25)
            ping_sent = time.time()  # the server's last activity is after this...
            await user.send(PING)
            assert await user.recv() is PONG
            pong_received = time.time()  # ...and before this
        error = await user.recv()
        assert time.time() - ping_sent >= 1.5  # never before the deadline
        assert isinstance(error, Error) and error.code == "idle_timeout"
        assert await user.recv() is None
        offline = await observer.next_event()
        assert (offline.kind, offline.uid, offline.reason) == ("offline", "alice", "idle")
        assert offline.seq == online.seq + 1
        assert abs(offline.deadline - offline.last_seen - 1.5) < 1e-6
        assert lateness_ok(offline), offline.ts - offline.deadline
        # Through an edge the core stamps the keepalive when the edge's batched touch arrives: up to its
        # batch interval (10 ms) plus the transfer later than the pong (the edge's documented bound).
        batch = 0.0 if workers == "0" else EDGE_BATCH + SLACK
        assert ping_sent - 0.005 <= offline.last_seen <= pong_received + 0.005 + batch
        assert await daemon.stop() == 0
    records = read_events(daemon.data_dir)
    assert [(r["kind"], r["reason"]) for r in records] == [("online", "login"), ("offline", "idle")]


@pytest.mark.slow  # a real `idled serve` subprocess, real time
async def test_many_expiries_are_never_early_and_at_most_a_tick_late(tmp_path: Path) -> None:
    async with Daemon(tmp_path) as daemon:
        observer = await Client.watching(daemon.port)
        users = []
        for i in range(30):
            users.append(await Client.login(daemon.port, "uid", i))
            await trio.sleep(0.013)
        offline = []
        while len(offline) < 30:
            event = await observer.next_event()
            if event.kind == "offline":
                offline.append(event)
        assert sorted(e.uid for e in offline) == list(range(30))
        late = [(e.uid, round(e.ts - e.deadline, 4)) for e in offline if not lateness_ok(e)]
        assert not late, late


@pytest.mark.slow  # a real `idled serve` subprocess, real time
async def test_bye_is_logout_and_close_is_closed(tmp_path: Path) -> None:
    async with Daemon(tmp_path) as daemon:
        observer = await Client.watching(daemon.port)
        polite = await Client.login(daemon.port, "uid", "polite")
        abrupt = await Client.login(daemon.port, "uid", "abrupt")
        await polite.send(BYE)
        assert await polite.recv() is None
        # Through edges the two users may sit on different edges, whose batches reach the core in no
        # promised order: close the second one only once the first one's offline is out.
        events = [await observer.next_event() for _ in range(3)]
        await abrupt.stream.aclose()
        events.append(await observer.next_event())
        assert [(e.kind, e.uid, e.reason) for e in events] == [
            ("online", "polite", "login"), ("online", "abrupt", "login"),
            ("offline", "polite", "logout"), ("offline", "abrupt", "closed"),
        ]
        await observer.send(Query(("polite", "abrupt")))
        assert await observer.recv() == Status({"polite": False, "abrupt": False})


@pytest.mark.slow  # a real `idled serve` subprocess, real time
async def test_sigterm_exits_0_with_shutdown_events(tmp_path: Path) -> None:
    async with Daemon(tmp_path) as daemon:
        observer = await Client.watching(daemon.port)
        users = [await Client.login(daemon.port, "uid", f"u{i}") for i in range(10)]
        for _ in users:
            assert (await observer.next_event()).kind == "online"
        daemon.proc.send_signal(signal.SIGTERM)
        for user in users:
            error = await user.recv()
            assert isinstance(error, Error) and error.code == "server_shutdown"
            assert await user.recv() is None
        shutdown = [await observer.next_event() for _ in users]
        assert {(e.kind, e.reason) for e in shutdown} == {("offline", "shutdown")}
        assert {e.uid for e in shutdown} == {f"u{i}" for i in range(10)}
        error = await observer.recv()
        assert isinstance(error, Error) and error.code == "server_shutdown"
        assert await trio.to_thread.run_sync(daemon.proc.wait, 20) == 0
    records = read_events(daemon.data_dir)
    assert [r["seq"] for r in records] == list(range(1, 21))
    assert sorted(r["uid"] for r in records if r["reason"] == "shutdown") == sorted(f"u{i}" for i in range(10))
    # a restart finds nobody left online: no restart records
    async with Daemon(tmp_path) as again:
        assert await again.stop() == 0
    assert not [r for r in read_events(daemon.data_dir) if r["reason"] == "restart"]
    assert "Traceback" not in daemon.stderr() + again.stderr()


@pytest.mark.slow  # a real `idled serve` subprocess, real time
async def test_sigint_is_a_clean_shutdown_too(tmp_path: Path) -> None:
    async with Daemon(tmp_path) as daemon:
        user = await Client.login(daemon.port, "uid", 5)
        assert await daemon.stop(signal.SIGINT) == 0
        error = await user.recv()
        assert isinstance(error, Error) and error.code == "server_shutdown"
    assert [(r["uid"], r["reason"]) for r in read_events(daemon.data_dir)] == [(5, "login"), (5, "shutdown")]


def test_events_command_on_a_fresh_data_dir_prints_nothing(tmp_path: Path) -> None:
    os.makedirs(tmp_path / "empty")
    assert read_events(tmp_path / "empty") == []
