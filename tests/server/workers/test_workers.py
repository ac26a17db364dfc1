"""`idled serve --workers 2` end to end: the root, the real core, the real `idled edge` children, one public port.

Real subprocesses, real loopback sockets, real time (tick 0.1 s, timeout 2 s). The daemon's own stderr (the
root's) holds its children's lines behind a `core:` or `worker-<i>:` prefix, which is how these tests see each
process. A killed core: tests/server/workers/test_workers_core.py.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import PING, PONG, Event, Query, Status, Subscribe

from tests import peers

pytestmark = pytest.mark.slow

TICK = 0.1
TIMEOUT = 2.0


class Daemon(peers.Daemon):
    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.data_dir = tmp_path / "data"
        command = peers.serve_command(self.data_dir, "--metrics-port", "0", "--tick", str(TICK), "--timeout",
                                      str(TIMEOUT), "--fsync", "never", "--workers", "2", *extra)
        super().__init__(command, tmp_path / f"idled-{time.monotonic_ns()}.stderr")

    def core_pid(self, default: int | None = None) -> int:
        """The pid of the root's child that is the core (``default`` while there is none: being restarted)."""
        pid = peers.core_pid(self.proc.pid)
        if pid is None:
            assert default is not None, "no core"
            return default
        return pid

    def workers(self) -> dict[str, int]:
        """worker name -> pid of its live edge process."""
        out = {}
        for child in psutil.Process(self.proc.pid).children():
            cmd = child.cmdline()
            if "edge" in cmd and "--name" in cmd:
                out[cmd[cmd.index("--name") + 1]] = child.pid
        return out


async def subscribe_live(observer: peers.Client) -> None:
    """Subscribe, and know it took effect before any login is made: the relayed subscribe and a login on the
    other edge race to the core; the status answering a later query proves the subscribe was processed."""
    await observer.send(Subscribe(None))
    await observer.send(Query(("-",)))
    assert isinstance(await observer.recv(), Status)


async def users(port: int, count: int, prefix: str = "u") -> list[peers.Client]:
    return [await peers.Client.login(port, "uid", f"{prefix}{i}", keepalive=60) for i in range(count)]


async def wait_for(predicate, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def test_two_workers_serve_users_gateways_and_observers_on_one_port(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    try:
        port = await daemon.started()
        assert set(daemon.workers()) == {"worker-0", "worker-1"}
        observer = await peers.Client.login(port, "observer", "obs")  # relayed to the core by an edge
        await subscribe_live(observer)
        clients = await users(port, 40)
        for client in clients:
            await client.send(PING)
            assert await client.recv() is PONG
        gateway = await peers.Client.login(port, "gateway", "gw")  # relayed too
        events = [await observer.recv() for _ in range(40)]
        assert all(isinstance(e, Event) and e.kind == "online" for e in events)
        # Both edges take connections. The kernel hands each new one to whichever edge accepts first, and on a
        # loaded machine one edge may take a whole batch (CI saw 42 and 0): more logins until both hold some.
        def established() -> dict[int, int]:
            return {pid: len([c for c in psutil.Process(pid).net_connections("tcp") if c.status == "ESTABLISHED"])
                    for pid in daemon.workers().values()}

        extra: list[peers.Client] = []
        with trio.fail_after(30):
            counts = established()
            while not all(n > 0 for n in counts.values()):
                extra += await users(port, 10, prefix=f"x{len(extra)}-")
                counts = established()
        assert all(n > 0 for n in counts.values()), counts
        for client in extra:
            await client.stream.aclose()
        await gateway.stream.aclose()
        for client in clients:
            await client.stream.aclose()
        await observer.stream.aclose()
    finally:
        daemon.kill()


async def test_a_killed_worker_ends_its_sessions_and_comes_back(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    try:
        port = await daemon.started()
        observer = await peers.Client.login(port, "observer", "obs")
        await subscribe_live(observer)
        before = daemon.workers()
        # The worker the observer's relay does not go through, so the observer stays connected.
        relay_pid = next(pid for pid in before.values()
                         if any(c.raddr and c.raddr.port == observer.stream.socket.getsockname()[1]
                                for c in psutil.Process(pid).net_connections("tcp")))
        victim, victim_pid = next((n, p) for n, p in before.items() if p != relay_pid)
        # The edges share one listening socket: which one accepts is the kernel's choice, and on a loaded
        # machine one edge may take a whole batch. Log users in until the victim holds some.
        clients: list[peers.Client] = []
        held: list[peers.Client] = []
        while not held and len(clients) < 300:
            batch = await users(port, 30, prefix=f"u{len(clients)}-")
            clients += batch
            for _ in batch:
                assert (await observer.recv()).kind == "online"
            held = [c for c in clients if any(k.raddr and k.raddr.port == c.stream.socket.getsockname()[1]
                                              for k in psutil.Process(victim_pid).net_connections("tcp"))]
        assert held, "the victim held no users out of 300"
        started = time.monotonic()
        os.kill(victim_pid, signal.SIGKILL)
        offline = [await observer.recv(timeout=10) for _ in held]
        assert {e.kind for e in offline} == {"offline"} and {e.reason for e in offline} == {"gateway_lost"}
        assert time.monotonic() - started < 2.0  # at once, not after a timeout
        for client in held:
            assert await client.recv(timeout=5) is None  # their connections died with the edge
        for client in clients:
            if client not in held:  # the other worker's users are untouched
                await client.send(PING)
                assert await client.recv() is PONG
        await wait_for(lambda: daemon.workers().get(victim) not in (None, victim_pid))
        assert re.search(rf"{victim} \(pid {victim_pid}\) killed by SIGKILL", daemon.stderr())
        more = await users(port, 20, prefix="v")  # serving again
        for client in more:
            await client.send(PING)
            assert await client.recv() is PONG
    finally:
        daemon.kill()


async def test_sigterm_stops_every_process_and_logs_every_session_shutdown(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    port = await daemon.started()
    clients = await users(port, 20)
    # An edge welcomes a user before its batched attach reaches the core (within 10 ms): wait for all 20.
    await wait_for(lambda: len([r for r in iter_records(daemon.data_dir) if r["kind"] == "online"]) == 20)
    pids = list(daemon.workers().values()) + [daemon.core_pid(), daemon.proc.pid]
    try:
        assert await daemon.stop(signal.SIGTERM, timeout=30) == 0
    finally:
        daemon.kill()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    offline = [r for r in iter_records(daemon.data_dir) if r["kind"] == "offline"]
    assert len(offline) == 20 and {r["reason"] for r in offline} == {"shutdown"}
    for client in clients:
        message = await client.recv(timeout=5)
        assert message is None or getattr(message, "code", None) == "server_shutdown"
    assert not (daemon.data_dir / "core.sock").exists()


async def test_sighup_reaches_every_process(tmp_path: Path) -> None:
    config = tmp_path / "idled.toml"
    config.write_text('log_level = "info"\n')
    daemon = Daemon(tmp_path, "--config", str(config))
    try:
        await daemon.started()
        config.write_text('log_level = "debug"\n')
        daemon.proc.send_signal(signal.SIGHUP)
        await wait_for(lambda: all(f"{name}: " in line and "log_level=debug" in line
                                   for name in ("worker-0", "worker-1")
                                   for line in [next((ln for ln in daemon.stderr().splitlines()
                                                      if ln.startswith(f"{name}: ") and "SIGHUP" in ln), "")]))
        assert re.search(r"SIGHUP: reloaded log_level=debug", daemon.stderr())  # the core's own line
    finally:
        daemon.kill()
