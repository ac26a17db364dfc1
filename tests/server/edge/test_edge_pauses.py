"""Pauses of our own processes never take a talking user offline: edges and the core SIGSTOPped, end to end.

Real `idled serve` / `idled edge` subprocesses, real loopback sockets, real time. Users keep a 2 s keepalive
(timeout 3 s) and ping every second throughout; an edge or the core is stopped for 8 s and for 20 s -- longer
than the keepalive's slack and than the edge link's 15 s liveness check. No user may be closed, and the log
must hold no `idle` and no `gateway_lost` offline (idled.core.watermarks, idled.server.roles.gateways). The same
over TCP between a separately run edge and its core, where the edge gives up on the silent core after 15 s
and its reconnect must resume every session.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import PING, Error, Login, Welcome
from tests import peers

pytestmark = pytest.mark.slow

USERS = 150
KEEPALIVE = 2.0  # timeout 3 s: a pause of 8 s is well past the slack


class Users:
    """USERS connections pinging every second; any error frame or close is recorded."""

    def __init__(self) -> None:
        self.errors: Counter[str] = Counter()
        self.clients: list[peers.Client] = []

    async def start(self, port: int, nursery: trio.Nursery) -> None:
        for i in range(USERS):
            client = await peers.Client.connect(port)
            await client.send(Login("uid", f"u{i}", None, KEEPALIVE))
            assert isinstance(await client.recv(), Welcome)
            self.clients.append(client)
            nursery.start_soon(self._ping, client)
            nursery.start_soon(self._read, client)

    async def _ping(self, client: peers.Client) -> None:
        while True:
            await trio.sleep(1.0)
            try:
                await client.send(PING)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.errors["send failed"] += 1
                return

    async def _read(self, client: peers.Client) -> None:
        while True:
            message = await client.recv(timeout=3600)
            if message is None:
                self.errors["closed"] += 1
                return
            if isinstance(message, Error):
                self.errors[message.code] += 1


def offlines(data_dir: Path) -> Counter[str]:
    return Counter(r["reason"] for r in iter_records(data_dir) if r["kind"] == "offline")


def edge_pids(root_pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(root_pid).children() if "edge" in c.cmdline()]


async def pause(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        await trio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


# A stopped core (~40 s) is the long variant: the stall guard it relies on is tested with a pause in
# tests/server/test_server.py (test_stall_guard_a_paused_process_does_not_expire_everyone).
@pytest.mark.parametrize("who", ["edge", pytest.param("core", marks=pytest.mark.long)])
async def test_a_stopped_edge_or_core_takes_nobody_offline(tmp_path: Path, who: str) -> None:
    data_dir = tmp_path / "data"
    command = peers.serve_command(data_dir, "--workers", "2", "--tick", "0.5", "--fsync", "never",
                                  "--metrics-port", "0")
    async with peers.Daemon(command, tmp_path / "serve.err") as daemon:
        users = Users()
        async with trio.open_nursery() as nursery:
            await users.start(daemon.port, nursery)
            target = edge_pids(daemon.proc.pid)[0] if who == "edge" else peers.core_pid(daemon.proc.pid)
            assert target is not None
            for seconds in (8.0, 20.0):
                await trio.sleep(2.0)
                await pause(target, seconds)
            await trio.sleep(6.0)  # two timeouts after the last pause: every deadline has come round
            assert users.errors == Counter(), users.errors
            nursery.cancel_scope.cancel()
        await daemon.stop()
    assert offlines(data_dir) == Counter({"shutdown": USERS}), daemon.stderr()[-3000:]


@pytest.mark.long  # (~30 s: a 20 s pause past the link's 15 s liveness check)
async def test_an_edge_over_tcp_that_gives_up_on_a_stopped_core_resumes_its_sessions(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    core_command = peers.serve_command(data_dir, "--tick", "0.5", "--fsync", "never", "--metrics-port", "0")
    async with peers.Daemon(core_command, tmp_path / "core.err") as core:
        edge_command = [sys.executable, "-m", "idled.cli.main", "edge", "--core", f"127.0.0.1:{core.port}",
                        "--port", "0", "--name", "edge-a"]
        async with peers.Daemon(edge_command, tmp_path / "edge.err") as edge:
            users = Users()
            async with trio.open_nursery() as nursery:
                await users.start(edge.port, nursery)
                await trio.sleep(2.0)
                await pause(core.proc.pid, 20.0)  # the edge drops the silent link after 15 s and reconnects
                await trio.sleep(8.0)
                assert users.errors == Counter(), users.errors
                nursery.cancel_scope.cancel()
            assert "resumed by a new connection" in core.stderr(), core.stderr()[-3000:]
            assert "lost" in edge.stderr()  # it did give up on the core
        await core.stop()
    assert offlines(data_dir) == Counter({"shutdown": USERS}), core.stderr()[-3000:]
