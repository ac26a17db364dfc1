"""The supervisor of `idled serve --workers N` with a stand-in edge (tests/server/workers_standin.py).

The core runs in the test's trio loop (real time, real sockets, real child processes); its edges are the
stand-in, so these tests pin the core's side alone: the internal socket and its trust rule, restarts with a
gateway_lost for the dead worker's sessions, SIGHUP forwarding, the per-worker metrics, the stop order
(every session `shutdown` in the log before the edges go). The real `idled edge` is tested end to end in
tests/server/test_workers.py.
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
from prometheus_client import CollectorRegistry

from idled.log.eventlog import iter_records
from idled.ops.config import Config
from idled.ops.metrics import Metrics
from idled.protocol import Login, Welcome, tokens
from idled.server import internal
from idled.server.app import Server

from tests.peers import Client

pytestmark = pytest.mark.slow

STANDIN = Path(__file__).with_name("workers_standin.py")


def standin_command(config: Config, name: str, core: str, fds: Sequence[int], occupancy: str,
                    config_file: str | None) -> list[str]:
    argv = [sys.executable, str(STANDIN), "--core", core, "--name", name]
    for fd in fds:
        argv += ["--listen-fd", str(fd)]
    return argv


@asynccontextmanager
async def core(tmp_path: Path, **settings: Any) -> AsyncIterator[Server]:
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    cfg = Config(port=0, metrics_port=0, tick=0.1, timeout=5, fsync="never", data_dir=str(tmp_path / "data"),
                 secret_file=str(secret), workers=2, **settings).validate()
    server = Server(cfg, metrics=Metrics(CollectorRegistry(), tick=cfg.tick, process_collectors=False), env={})
    assert server.workers is not None
    server.workers.command = standin_command
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(server.serve)
        try:
            yield server
        finally:
            server.stop()
            with trio.fail_after(30):
                await server.stopped.wait()


async def user(port: int, uid: str) -> trio.SocketStream:
    """A connection through the stand-in: it attaches `uid` and says ok."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(uid.encode() + b"\n")
    with trio.fail_after(10):
        assert await stream.receive_some(10) == b"ok\n"
    return stream


def records(server: Server) -> list[dict[str, Any]]:
    return list(iter_records(server.log.directory))


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


def sample(server: Server, name: str, **labels: str) -> float | None:
    assert server.metrics.registry is not None
    return server.metrics.registry.get_sample_value(name, labels)


async def test_edges_log_in_without_token_and_serve_the_public_port(tmp_path: Path) -> None:
    async with core(tmp_path) as server:
        assert server.workers is not None
        path = internal.core_socket_path({}, server.log.directory)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert server.connections["gateway"] == 2  # both links, trusted without a token
        streams = [await user(server.ports[0], f"u{i}") for i in range(6)]
        await wait_for(lambda: server.presence is not None and len(server.presence) == 6)
        held = {name: sessions for name, _pid, _restarts, sessions, _conns in server.workers.view()}
        assert sum(held.values()) == 6
        assert sample(server, "idled_worker_up", worker="worker-0") == 1.0
        assert (sample(server, "idled_worker_resident_memory_bytes", worker="worker-1") or 0) > 1 << 20
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
        secret = tokens.load_secret(server.config.secret_file or "")
        await relayed.send(Login("observer", "obs", tokens.mint(secret, "observer", "obs", time.time() + 60)))
        await relayed.expect(Welcome)
        await relayed.stream.aclose()
        for stream in streams:
            await stream.aclose()
    assert not path.exists()  # removed at exit


async def test_a_killed_worker_is_restarted_and_its_sessions_end_gateway_lost(tmp_path: Path) -> None:
    async with core(tmp_path) as server:
        assert server.workers is not None
        streams = [await user(server.ports[0], f"u{i}") for i in range(8)]
        await wait_for(lambda: server.presence is not None and len(server.presence) == 8)
        view = {name: (pid, sessions) for name, pid, _restarts, sessions, _conns in server.workers.view()}
        victim = max(view, key=lambda name: view[name][1])  # the worker that holds the most
        old_pid, lost = view[victim]
        assert old_pid is not None and lost > 0
        os.kill(old_pid, signal.SIGKILL)
        await wait_for(lambda: server.presence is not None and len(server.presence) == 8 - lost)
        gone = [r for r in records(server) if r.get("reason") == "gateway_lost"]
        await wait_for(lambda: len([r for r in records(server) if r.get("reason") == "gateway_lost"]) == lost)
        worker = next(w for w in server.workers.workers if w.name == victim)
        await wait_for(lambda: worker.pid not in (None, old_pid) and worker.listening.is_set())
        await wait_for(lambda: server.connections["gateway"] == 2)  # the new process's link, trusted again
        assert worker.restarts == 1
        assert sample(server, "idled_worker_restarts_total", worker=victim) == 1.0
        # Serving again: new connections reach whichever worker accepts them.
        more = [await user(server.ports[0], f"v{i}") for i in range(4)]
        await wait_for(lambda: server.presence is not None and len(server.presence) == 12 - lost)
        del gone
        for stream in streams + more:
            await stream.aclose()


async def test_sighup_reaches_every_worker(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    async with core(tmp_path) as server:
        assert server.workers is not None
        server.workers.hangup()
        seen = ""

        def both() -> bool:
            nonlocal seen
            seen += capfd.readouterr().err
            return all(f"worker-{i}: SIGHUP: reloaded" in seen for i in range(2))

        await wait_for(both)


async def test_stop_logs_every_session_shutdown_then_stops_the_workers(tmp_path: Path) -> None:
    async with core(tmp_path) as server:
        assert server.workers is not None
        streams = [await user(server.ports[0], f"u{i}") for i in range(6)]
        await wait_for(lambda: server.presence is not None and len(server.presence) == 6)
        processes = [w.process for w in server.workers.workers]
    assert all(p is not None and p.returncode == 0 for p in processes)
    offline = [r for r in records(server) if r["kind"] == "offline"]
    assert len(offline) == 6 and {r["reason"] for r in offline} == {"shutdown"}
    for stream in streams:
        await stream.aclose()
