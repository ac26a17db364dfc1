"""The root of `idled serve --workers N` with a stand-in edge (tests/server/workers/workers_standin.py).

The root runs in the test's trio loop (real time, real sockets, real child processes): the core is the real
`idled serve --core-of-workers` it starts, the edges are the stand-in, so these tests pin the root's and the
core's side alone: the internal socket and its trust rule (the roster's pids), restarts with a gateway_lost
for the dead worker's sessions, SIGHUP forwarding, the per-worker metrics, the stop order (every session
`shutdown` in the log before the edges go). The real `idled edge` is tested end to end in
tests/server/workers/test_workers.py and tests/server/workers/test_workers_core.py.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import urllib.request
from prometheus_client.parser import text_string_to_metric_families

from idled.log.eventlog import iter_records
from idled.ops.config import Config
from idled.protocol import Login, Welcome, tokens
from idled.server.workers import internal
from idled.server.workers.root import Root

from tests.peers import Client, free_port

pytestmark = pytest.mark.slow

STANDIN = Path(__file__).with_name("workers_standin.py")


def standin_command(config: Config, name: str, core: str, fds: Sequence[int], occupancy: str,
                    config_file: str | None) -> list[str]:
    argv = [sys.executable, str(STANDIN), "--core", core, "--name", name]
    for fd in fds:
        argv += ["--listen-fd", str(fd)]
    return argv


class Core:
    """What a test needs of the daemon: the root, its public port, metrics port and data directory."""

    def __init__(self, root: Root, port: int, metrics_port: int, data_dir: Path, secret: bytes) -> None:
        self.root, self.port, self.metrics_port, self.data_dir, self.secret = root, port, metrics_port, data_dir, secret

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def online(self) -> int:
        return int(self.sample("idled_sessions_online") or 0)


@asynccontextmanager
async def core(tmp_path: Path) -> AsyncIterator[Core]:
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    data_dir, metrics_port = tmp_path / "data", free_port()
    flags = ["--port", "0", "--metrics-port", str(metrics_port), "--tick", "0.1", "--timeout", "5", "--fsync", "never",
             "--data-dir", str(data_dir), "--secret-file", str(secret), "--workers", "2"]
    cfg = Config(port=0, metrics_port=metrics_port, tick=0.1, timeout=5, fsync="never", data_dir=str(data_dir),
                 secret_file=str(secret), workers=2).validate()
    root = Root(cfg, flags, secret=tokens.load_secret(str(secret)), env={})
    root.edge_command = standin_command
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            ports = await nursery.start(root.run)
        try:
            yield Core(root, ports[0], metrics_port, data_dir, tokens.load_secret(str(secret)))
        finally:
            root.stop()


async def user(port: int, uid: str) -> trio.SocketStream:
    """A connection through the stand-in: it attaches `uid` and says ok."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(uid.encode() + b"\n")
    with trio.fail_after(10):
        assert await stream.receive_some(10) == b"ok\n"
    return stream


def records(daemon: Core) -> list[dict[str, Any]]:
    return list(iter_records(daemon.data_dir))


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


async def test_edges_log_in_without_token_and_serve_the_public_port(tmp_path: Path) -> None:
    async with core(tmp_path) as daemon:
        path = internal.core_socket_path({}, daemon.data_dir)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert daemon.sample("idled_connections", role="gateway") == 2  # both links, trusted without a token
        streams = [await user(daemon.port, f"u{i}") for i in range(6)]
        await wait_for(lambda: daemon.online() == 6)
        assert sum(daemon.sample("idled_worker_sessions", worker=f"worker-{i}") or 0 for i in range(2)) == 6
        assert daemon.sample("idled_worker_up", worker="worker-0") == 1.0
        assert (daemon.sample("idled_worker_resident_memory_bytes", worker="worker-1") or 0) > 1 << 20
        assert daemon.sample("idled_core_restarts_total") == 0.0
        # The trust rule: the same token-less login from a process that is not that worker is verified.
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(str(path))
        impostor = Client(trio.SocketStream(sock))
        await impostor.send(Login("gateway", "worker-0"))
        await impostor.expect_error("auth_failed")
        # A relayed-style login with a valid token is verified and accepted as usual.
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(str(path))
        relayed = Client(trio.SocketStream(sock))
        await relayed.send(Login("observer", "obs", tokens.mint(daemon.secret, "observer", "obs", time.time() + 60)))
        await relayed.expect(Welcome)
        await relayed.stream.aclose()
        for stream in streams:
            await stream.aclose()
    assert not path.exists()  # removed at exit


async def test_a_killed_worker_is_restarted_and_its_sessions_end_gateway_lost(tmp_path: Path) -> None:
    async with core(tmp_path) as daemon:
        streams = [await user(daemon.port, f"u{i}") for i in range(8)]
        await wait_for(lambda: daemon.online() == 8)
        held = {w.name: daemon.sample("idled_worker_sessions", worker=w.name) or 0 for w in daemon.root.workers}
        victim = next(w for w in daemon.root.workers if w.name == max(held, key=lambda name: held[name]))
        old_pid, lost = victim.pid, int(held[victim.name])
        assert old_pid is not None and lost > 0
        os.kill(old_pid, signal.SIGKILL)
        await wait_for(lambda: daemon.online() == 8 - lost)
        await wait_for(lambda: len([r for r in records(daemon) if r.get("reason") == "gateway_lost"]) == lost)
        await wait_for(lambda: victim.pid not in (None, old_pid) and victim.listening.is_set())
        await wait_for(lambda: daemon.sample("idled_connections", role="gateway") == 2)  # trusted again
        assert victim.restarts == 1
        assert daemon.sample("idled_worker_restarts_total", worker=victim.name) == 1.0
        # Serving again: new connections reach whichever worker accepts them.
        more = [await user(daemon.port, f"v{i}") for i in range(4)]
        await wait_for(lambda: daemon.online() == 12 - lost)
        for stream in streams + more:
            await stream.aclose()


async def test_a_killed_core_is_restarted_and_trusts_the_same_edges(tmp_path: Path) -> None:
    async with core(tmp_path) as daemon:
        pids = [w.pid for w in daemon.root.workers]
        old = daemon.root.core.pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        await wait_for(lambda: daemon.root.core.pid not in (None, old) and daemon.root.core.listening.is_set())
        assert daemon.root.core.restarts == 1 and [w.pid for w in daemon.root.workers] == pids
        assert daemon.sample("idled_core_restarts_total") == 1.0
        # The stand-in does not reconnect: an impostor of its name is still refused by the new core.
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(str(internal.core_socket_path({}, daemon.data_dir)))
        impostor = Client(trio.SocketStream(sock))
        await impostor.send(Login("gateway", "worker-1"))
        await impostor.expect_error("auth_failed")


async def test_sighup_reaches_every_child(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    async with core(tmp_path) as daemon:
        daemon.root.hangup()
        seen = ""

        def all_of_them() -> bool:
            nonlocal seen
            seen += capfd.readouterr().err
            return all(f"worker-{i}: SIGHUP: reloaded" in seen for i in range(2)) and "core: " in seen and "SIGHUP" in seen

        await wait_for(all_of_them)


async def test_stop_logs_every_session_shutdown_then_stops_the_workers(tmp_path: Path) -> None:
    async with core(tmp_path) as daemon:
        streams = [await user(daemon.port, f"u{i}") for i in range(6)]
        await wait_for(lambda: daemon.online() == 6)
        processes = [w.process for w in daemon.root.slots]
    assert all(p is not None and p.returncode == 0 for p in processes)
    offline = [r for r in records(daemon) if r["kind"] == "offline"]
    assert len(offline) == 6 and {r["reason"] for r in offline} == {"shutdown"}
    for stream in streams:
        await stream.aclose()
