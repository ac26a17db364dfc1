"""Running idled as a service (issue 5): /metrics of a live daemon, sd_notify, socket activation, SIGTERM
with 1,000 connected sessions. Everything is a real `idled serve` subprocess on loopback; systemd itself is
not needed: its two interfaces are a unix datagram socket (NOTIFY_SOCKET) and inherited fds (LISTEN_FDS).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from idled.log.eventlog import iter_records
from idled.protocol import BYE, PING, PONG, Error

from tests import peers

pytestmark = pytest.mark.slow  # every test runs a real `idled serve` subprocess

TICK = 0.1
RECV_TIMEOUT = 30.0


def serve_command(data_dir: Path, *extra: str) -> list[str]:
    return peers.serve_command(data_dir, "--tick", str(TICK), "--timeout", "1", "--login-timeout", "2", *extra)


class Daemon(peers.Daemon):
    def __init__(self, tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
                 command: list[str] | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        self.data_dir = tmp_path / "data"
        self.metrics_port = peers.free_port()
        if command is None:
            command = serve_command(self.data_dir, "--metrics-port", str(self.metrics_port), *extra)
        super().__init__(command, tmp_path / f"idled-{time.monotonic_ns()}.stderr", env=env, pass_fds=pass_fds,
                         timeout=30.0)

    async def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        def get() -> str:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                assert response.status == 200
                return response.read().decode()

        text = await trio.to_thread.run_sync(get)
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def login(port: int, uid: Any, keepalive: float | None = None) -> peers.Client:
    """A user session."""
    return await peers.Client.login(port, "uid", uid, keepalive, recv_timeout=RECV_TIMEOUT)


# -- /metrics ------------------------------------------------------------------------------------------------


async def test_metrics_move_as_sessions_log_in_and_expire(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path)
    try:
        port = await daemon.started()
        before = await daemon.scrape()
        assert value(before, "idled_sessions_online") == 0
        assert value(before, "idled_tick_seconds") == TICK
        assert value(before, "idled_offline_lateness_seconds_count") == 0
        stay = [await login(port, f"stay-{i}", keepalive=10.0) for i in range(3)]  # timeout 15 s
        samples = await daemon.scrape()
        assert value(samples, "idled_sessions_online") == 3
        assert value(samples, "idled_connections", role="user") == 3
        assert value(samples, "idled_detector_keys") == 3
        brief = await login(port, "brief", keepalive=1.0)  # timeout 1.5, never pings
        error = await brief.recv()
        assert isinstance(error, Error) and error.code == "idle_timeout"
        samples = await daemon.scrape()
        assert value(samples, "idled_sessions_online") == 3
        assert value(samples, "idled_logins_total", role="user", result="ok") == 4
        assert value(samples, "idled_presence_events_total", kind="online", reason="login") == 4
        await stay[0].send(PING)
        assert await stay[0].recv() is PONG
        await stay[0].send(BYE)
        assert await stay[0].recv() is None
        with trio.fail_after(10):  # the closing connection is counted once its task ends
            while value(samples := await daemon.scrape(), "idled_connections", role="user") != 2:
                await trio.sleep(0.05)
        assert value(samples, "idled_sessions_online") == 2
        assert value(samples, "idled_presence_events_total", kind="offline", reason="idle") == 1
        assert value(samples, "idled_presence_events_total", kind="offline", reason="logout") == 1
        assert value(samples, "idled_offline_lateness_seconds_count") == 1
        lateness = value(samples, "idled_offline_lateness_seconds_sum")
        assert 0 <= lateness <= TICK + 0.2
        # the lateness histogram's buckets are fractions of the tick; the one offline is at most a tick late
        # (plus the slack a loaded machine may add)
        assert value(samples, "idled_offline_lateness_seconds_bucket", le=f"{TICK * 3:.9g}") == 1
        assert value(samples, "idled_eventlog_records_total") >= 5
        assert value(samples, "idled_detector_ticks_total") >= 1
        bad = await trio.open_tcp_stream("127.0.0.1", port)
        await bad.send_all(b"\xff\xff\xff\xff")
        with trio.fail_after(10):
            while value(samples := await daemon.scrape(), "idled_frames_rejected_total", reason="too_large") != 1:
                await trio.sleep(0.05)
        daemon.proc.send_signal(signal.SIGTERM)
        assert await daemon.wait() == 0
    finally:
        daemon.kill()


# -- sd_notify ----------------------------------------------------------------------------------------------


async def test_sd_notify_ready_watchdog_stopping(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    if len(os.fsencode(path)) >= 108:
        pytest.skip(f"tmp_path too long for a unix socket: {path}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.setblocking(False)
        env = {**os.environ, "NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "200000"}  # ping every 0.1 s
        env.pop("WATCHDOG_PID", None)
        daemon = Daemon(tmp_path, env=env)
        messages: list[str] = []

        async def receive_until(predicate: Any) -> None:
            with trio.fail_after(30):
                while not predicate():
                    await trio.lowlevel.wait_readable(sock)
                    while True:
                        try:
                            messages.append(sock.recv(4096).decode())
                        except BlockingIOError:
                            break

        try:
            port = await daemon.started()
            await receive_until(lambda: messages.count("WATCHDOG=1") >= 3)
            user = await login(port, "u")
            daemon.proc.send_signal(signal.SIGTERM)
            await receive_until(lambda: "STOPPING=1" in messages)
            assert await daemon.wait() == 0
            error = await user.recv()
            assert isinstance(error, Error) and error.code == "server_shutdown"
        finally:
            daemon.kill()
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except BlockingIOError:
                break
    assert messages[0] == "READY=1"
    kinds = [m for m in messages if not m.startswith("STATUS=")]
    stopping = kinds.index("STOPPING=1")
    assert kinds.count("READY=1") == 1 and kinds.count("STOPPING=1") == 1
    assert "WATCHDOG=1" in kinds[1:stopping]
    assert set(kinds[1:]) <= {"WATCHDOG=1", "STOPPING=1"}
    status = [m for m in messages if m.startswith("STATUS=")]
    assert status and "online" in status[0]


# -- socket activation ----------------------------------------------------------------------------------------

# The daemon must see LISTEN_PID = its own pid, unknown before it is started. This wrapper sets it to its own
# pid, moves the passed socket to fd 3 (SD_LISTEN_FDS_START) and execs the daemon: exec keeps the pid.
ACTIVATE = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


async def test_socket_activation_serves_on_the_passed_socket(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    command = [sys.executable, "-c", ACTIVATE, str(fd), *serve_command(tmp_path / "data", "--metrics-port", "0")[1:]]
    env = {key: value for key, value in os.environ.items() if not key.startswith("LISTEN_")}
    daemon = Daemon(tmp_path, command=command, env=env, pass_fds=(fd,))
    listener.close()  # the daemon holds it now
    try:
        assert await daemon.started() == port  # it listens on the socket it was given, not a port of its own
        user = await login(port, "activated")
        await user.send(PING)
        assert await user.recv() is PONG
        assert "socket activation: adopting 1 listening socket(s)" in daemon.stderr()
        daemon.proc.send_signal(signal.SIGTERM)
        assert await daemon.wait() == 0
    finally:
        daemon.kill()
    assert [(r["uid"], r["reason"]) for r in iter_records(tmp_path / "data")] == [
        ("activated", "login"), ("activated", "shutdown")
    ]


# -- SIGTERM with 1,000 sessions --------------------------------------------------------------------------------


async def test_sigterm_with_1000_sessions_exits_0_and_logs_1000_shutdowns(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    n = 1000
    daemon = Daemon(tmp_path, "--timeout", "60")
    try:
        port = await daemon.started()
        clients: list[peers.Client] = []
        limiter = trio.CapacityLimiter(50)

        async def connect(i: int) -> None:
            async with limiter:
                clients.append(await login(port, i))

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(connect, i)
        samples = await daemon.scrape()
        assert value(samples, "idled_sessions_online") == n
        assert value(samples, "idled_connections", role="user") == n
        started = time.perf_counter()
        daemon.proc.send_signal(signal.SIGTERM)
        assert await daemon.wait(60) == 0
        print(f"\nshutdown with {n} connected sessions took {time.perf_counter() - started:.2f} s")
        codes = []
        for client in clients:
            message = await client.recv()
            codes.append(message.code if isinstance(message, Error) else message)
            await client.stream.aclose()
        assert codes == ["server_shutdown"] * n
    finally:
        daemon.kill()
    records = list(iter_records(tmp_path / "data"))
    shutdown = [r for r in records if r["kind"] == "offline"]
    assert len(shutdown) == n and {r["reason"] for r in shutdown} == {"shutdown"}
    assert sorted(r["uid"] for r in shutdown) == list(range(n))
    assert [r["seq"] for r in records] == list(range(1, 2 * n + 1))
    assert "Traceback" not in daemon.stderr()
