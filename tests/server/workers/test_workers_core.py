"""`idled serve --workers 2` when its core dies: the edges hold their users while the root restarts the core.

Real processes (the root, the core, two `idled edge`), real loopback TCP users pinging through the edges,
real time. What must hold: no user sees an error frame or loses its connection, a new core comes back
(a login is recorded online again, an observer resumes from its seq), and the record is the one a
separately run edge produces across a core crash (docs/edge.md): `offline restart` for every session the
dead core left online, then `online login` as the edges re-attach them -- and never an `idle` offline for a
user who kept pinging.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import PING, PONG, Event, Subscribe

from tests import peers
from tests.server.workers.test_workers import Daemon, subscribe_live, wait_for

pytestmark = pytest.mark.slow

USERS = 30


async def keep_pinging(client: peers.Client, every: float, failures: list[Any], stop: trio.Event) -> None:
    """Ping and expect a pong until ``stop``; anything else (an error frame, the end) is a failure."""
    while not stop.is_set():
        await client.send(PING)
        answer = await client.recv(timeout=5)
        if answer is not PONG:
            failures.append(answer)
            return
        await trio.sleep(every)


def records(daemon: Daemon) -> list[dict[str, Any]]:
    return list(iter_records(daemon.data_dir))


async def test_a_killed_core_is_restarted_and_the_users_stay_connected(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    try:
        port = await daemon.started()
        observer = await peers.Client.login(port, "observer", "obs")
        await subscribe_live(observer)
        clients = [await peers.Client.login(port, "uid", f"u{i}", keepalive=1) for i in range(USERS)]
        online = [await observer.recv() for _ in clients]
        assert {e.kind for e in online} == {"online"}
        last_seq = online[-1].seq
        failures: list[Any] = []
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(keep_pinging, client, 0.3, failures, stop)
            core = daemon.core_pid()
            started = time.monotonic()
            os.kill(core, signal.SIGKILL)
            assert await observer.recv(timeout=5) is None  # its relay ran to the dead core
            await wait_for(lambda: daemon.core_pid(default=core) != core)
            # Back: a login is recorded online again, and an observer resumes right after what it saw.
            late = await peers.Client.login(port, "uid", "late", keepalive=1)
            nursery.start_soon(keep_pinging, late, 0.3, failures, stop)
            resumed = await peers.Client.login(port, "observer", "obs2")
            await resumed.send(Subscribe(last_seq + 1))
            seen: list[Event] = []
            with trio.fail_after(15):
                while not any(e.uid == "late" and e.kind == "online" for e in seen):
                    message = await resumed.recv()
                    assert isinstance(message, Event), message
                    seen.append(message)
            back = time.monotonic() - started
            await trio.sleep(2 * 1.5)  # two timeouts of pinging users after the re-attach: no idle offline
            stop.set()
        assert failures == [], failures[:3]
        assert back < 10.0
        assert f"core (pid {core}) killed by SIGKILL" in daemon.stderr()
        log = [r for r in records(daemon) if r["seq"] > last_seq]
        uids = {f"u{i}" for i in range(USERS)}
        restarts = [r for r in log if r["kind"] == "offline"]
        assert {r["uid"] for r in restarts} == uids and {r["reason"] for r in restarts} == {"restart"}
        reattached = [r for r in log if r["kind"] == "online" and r["uid"] in uids]
        assert {r["uid"] for r in reattached} == uids and {r["reason"] for r in reattached} == {"login"}
        # every restart offline comes before that uid's online again, and the new core's seqs follow on
        first_online = min(r["seq"] for r in reattached)
        assert max(r["seq"] for r in restarts) < first_online
        assert [e.seq for e in seen] == [r["seq"] for r in log[: len(seen)]]
        for client in clients:  # still connected, and served
            await client.send(PING)
            assert await client.recv() is PONG
        status = await daemon.stop(signal.SIGTERM, timeout=30)
        assert status == 0
    finally:
        daemon.kill()


async def test_the_root_is_the_parent_of_the_core_and_the_edges(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    try:
        await daemon.started()
        children = psutil.Process(daemon.proc.pid).children()
        assert len(children) == 3
        assert sum("--core-of-workers" in child.cmdline() for child in children) == 1
        assert set(daemon.workers()) == {"worker-0", "worker-1"}
    finally:
        daemon.kill()


async def test_a_core_that_cannot_start_stops_the_root_with_its_status(tmp_path: Path) -> None:
    """The event log is locked by another daemon: the core exits 5 before it listened, and so does the root
    (one fatal line; its edges do not outlive it)."""
    data_dir = tmp_path / "data"
    async with peers.Daemon(peers.serve_command(data_dir, "--metrics-port", "0"), tmp_path / "one.err"):
        daemon = peers.Daemon(peers.serve_command(data_dir, "--metrics-port", "0", "--workers", "2"),
                              tmp_path / "workers.err")
        try:
            assert await daemon.wait(timeout=30) == 5
        finally:
            daemon.kill()
        lines = daemon.stderr().splitlines()
        assert [ln for ln in lines if ln.startswith("idled: fatal: core (pid ")], lines[-5:]
        assert "IDLED_LISTENING" not in daemon.stderr()
