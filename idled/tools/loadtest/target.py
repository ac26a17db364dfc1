"""The server under test: spawn it (or find it), sample its CPU and RSS, scrape its stall metric.

Theory of operation
-------------------
`spawn_server` runs ``python -m idled.cli.main serve --host 127.0.0.1 --port 0 ...`` with stdout and stderr on one
pipe, and reads lines until ``IDLED_LISTENING host=H port=P`` (a plainer ``listening on H:P`` is accepted
too). A task keeps draining the pipe for the whole run -- a server blocked on a full pipe would be a
stall of our making -- into an optional log file and a bounded deque of the last lines, where the final
log line (with its largest event-loop stall) is found after the server stops. `stop_server` sends SIGTERM
and waits, then SIGKILL.

`ProcessSampler` reads CPU time and RSS with psutil from a pid and all its descendants (`--spawn` through
a wrapper measures the real server, its child), and the core's CPU time apart: under ``--workers`` the core is
the root's child started with ``--core-of-workers`` (counted with the root's own, a few ms), the other
descendants are the edges. CPU % is the CPU time used between two samples over the
wall time between them (100 % = one core). The drain task also picks out each process's ``gc full walk``
log lines (`idled.ops.gcpolicy`; an edge's come through the core behind ``worker-<i>:``) into ``gc_walks``.
`find_listening_pid` maps a `--target` port to a pid when the pid is not given (with `--workers`, the core:
the root of the processes sharing the listening socket). `scrape_metrics` GETs ``/metrics`` from 127.0.0.1
and returns the ``idled_*`` samples.
"""

from __future__ import annotations

import collections
import ipaddress
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import psutil
import trio

from idled.ops.gcpolicy import FULL_WALK_LOG
from idled.protocol.address import format_address
from idled.tools.loadtest.scenario import Scenario, flag_value, without_flag

__all__ = [
    "LISTENING_RE", "ServerProcess", "spawn_server", "stop_server", "ProcessSampler", "Sample",
    "find_listening_pid", "scrape_metrics", "parse_metrics", "parse_stall", "free_port", "scratch_directory", "describe",
    "get_server",
]

LISTENING_RE = re.compile(r"IDLED_LISTENING\s+host=(\S+)\s+port=(\d+)")
_PLAIN_LISTENING_RE = re.compile(r"listening on (\d+\.\d+\.\d+\.\d+):(\d+)")
_METRICS_RE = re.compile(r"IDLED_METRICS\s+host=(\S+)\s+port=(\d+)|metrics\D{0,40}?(?:127\.0\.0\.1|localhost):(\d+)")
STALL_METRIC = "idled_event_loop_stall_max_seconds"
_GC_WALK_RE = re.compile(  # (worker name: none for the core's own lines), pause ms, CPU ms
    r"^(?:(worker-\d+): )?.*" + re.escape(FULL_WALK_LOG) + r" ([0-9.]+) ms(?: \(([0-9.]+) ms CPU\))?")
_STALL_RE = re.compile(r"stall[a-z_]*\s*[=:]?\s*([0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?)\s*(ms|s)?\b", re.I)


@dataclass(slots=True)
class ServerProcess:
    """A server we spawned (`process` set) or found (`process` None)."""

    host: str
    port: int
    pid: int | None
    argv: list[str] = field(default_factory=list)
    process: trio.Process | None = None
    metrics_port: int | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=400))
    returncode: int | None = None
    gc_walks: list[tuple[str, float, float | None]] = field(default_factory=list)  # (process, seconds, CPU s)

    def take_line(self, line: str) -> None:
        """Keep one output line (the tail), and the full GC walk it reports, if it does."""
        self.tail.append(line)
        if FULL_WALK_LOG in line and (m := _GC_WALK_RE.search(line)) and len(self.gc_walks) < 100_000:
            cpu = float(m.group(3)) / 1e3 if m.group(3) else None
            self.gc_walks.append((m.group(1) or "core", float(m.group(2)) / 1e3, cpu))


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for the spawned server's metrics endpoint)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def spawn_server(nursery: trio.Nursery, argv: Sequence[str], *, log: IO[str] | None = None,
                       startup_timeout: float = 60.0) -> ServerProcess:
    """Start the server; return once it reports its port. Raises RuntimeError (with its output) otherwise."""
    process = await trio.lowlevel.open_process(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    server = ServerProcess("127.0.0.1", 0, process.pid, list(argv), process)
    listening = trio.Event()

    async def drain() -> None:
        assert process.stdout is not None
        pending = b""
        while True:
            chunk = await process.stdout.receive_some(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                server.take_line(line)
                if log is not None:
                    log.write(line + "\n")
                if not listening.is_set():
                    m = LISTENING_RE.search(line) or _PLAIN_LISTENING_RE.search(line)
                    if m:
                        server.host, server.port = m.group(1), int(m.group(2))
                        if server.port:
                            listening.set()
                if server.metrics_port is None:
                    mm = _METRICS_RE.search(line)
                    if mm:
                        server.metrics_port = int(mm.group(2) or mm.group(3))
            if len(pending) > 65536:  # a line without end: keep its tail only
                pending = pending[-4096:]
        if pending:
            server.tail.append(pending.decode("utf-8", "replace"))
        if log is not None:
            log.flush()
        listening.set()  # EOF: the server is gone; the waiter below finds out

    nursery.start_soon(drain)
    with trio.move_on_after(startup_timeout):
        await listening.wait()
    if not server.port or process.returncode is not None:
        await stop_server(server, grace=2.0)
        # one line: the server's last words (usually why it refused to start); --server-log keeps them all
        last = next((line.strip() for line in reversed(server.tail) if line.strip()), "no output")
        raise RuntimeError(f"the server did not report its port (exit status {process.returncode}): {last}")
    return server


async def stop_server(server: ServerProcess, grace: float = 30.0) -> int | None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL. Returns the exit status."""
    process = server.process
    if process is None:
        return None
    if process.returncode is None:
        try:
            process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        with trio.move_on_after(grace):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    await trio.sleep(0.05)  # let the drain task read the last lines
    server.returncode = process.returncode
    return process.returncode


@dataclass(frozen=True, slots=True)
class Sample:
    wall: float
    cpu_seconds: float  # user + system, cumulative, over the process tree
    rss: int  # bytes, summed over the process tree
    cpu_percent: float  # since the previous sample (100 = one core)
    core_cpu_seconds: float = 0.0  # the core's (under --workers: its process's, with the root's own)


class ProcessSampler:
    """CPU time and RSS of a process and its descendants, read with psutil."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._proc = psutil.Process(pid)
        self._last: tuple[float, float] | None = None
        self._dead_cpu = 0.0  # CPU time of children that have exited (so the total never goes back)
        self._child_cpu: dict[int, float] = {}
        self._cores: dict[int, bool] = {}  # child pid -> it is a core (--core-of-workers), looked up once
        self._dead_core = 0.0

    def sample(self) -> Sample | None:
        """None once the process is gone."""
        wall = time.time()
        try:
            with self._proc.oneshot():
                t = self._proc.cpu_times()
                cpu = core = t.user + t.system
                rss = self._proc.memory_info().rss
            kids = self._proc.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        alive: dict[int, float] = {}
        for child in kids:
            try:
                ct = child.cpu_times()
                alive[child.pid] = ct.user + ct.system
                rss += child.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        for pid, used in self._child_cpu.items():
            if pid not in alive:
                self._dead_cpu += used
                self._dead_core += used if self._cores.pop(pid, False) else 0.0
        self._child_cpu = alive
        core += self._dead_core + sum(used for pid, used in alive.items() if self._is_core(kids, pid))
        cpu += sum(alive.values()) + self._dead_cpu
        percent = 0.0
        if self._last is not None and wall > self._last[0]:
            percent = max(0.0, (cpu - self._last[1]) / (wall - self._last[0]) * 100.0)
        self._last = (wall, cpu)
        return Sample(wall, cpu, rss, percent, core)

    def _is_core(self, kids: list[psutil.Process], pid: int) -> bool:
        if pid not in self._cores:
            self._cores[pid] = "--core-of-workers" in _cmdline(kids, pid)
        return self._cores[pid]


def _cmdline(kids: list[psutil.Process], pid: int) -> list[str]:
    try:
        return next(child for child in kids if child.pid == pid).cmdline()
    except (StopIteration, psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def find_listening_pid(port: int, host: str = "127.0.0.1") -> int | None:
    """The pid listening on host:port (TCP), if this user may see it."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    pids = {int(c.pid) for c in conns
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
            and c.laddr.ip in (host, "0.0.0.0", "::", "::ffff:" + host)}
    # `idled serve --workers N`: the core and its edges all hold the listening socket; the root of that
    # tree is the server (its sampler then sums the edges, its descendants).
    for pid in sorted(pids):
        try:
            if psutil.Process(pid).ppid() not in pids:
                return pid
        except psutil.Error:
            continue
    return min(pids) if pids else None


def parse_metrics(text: str, prefix: str = "idled_", limit: int = 2000) -> dict[str, float]:
    """`name{labels}` -> value for the samples whose name starts with `prefix` (text exposition format)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
        if len(out) >= limit:
            break
    return out


def scrape_metrics(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> dict[str, float]:
    """GET http://host:port/metrics (blocking: run it in a thread). Raises OSError on failure."""
    with urllib.request.urlopen(f"http://{format_address((host, port))}/metrics", timeout=timeout) as response:  # noqa: S310
        return parse_metrics(response.read(8 << 20).decode("utf-8", "replace"))


def parse_stall(lines: Sequence[str]) -> float | None:
    """The largest event-loop stall (seconds) named in the server's last log lines, if any."""
    for line in reversed(lines):
        if "stall" not in line.lower():
            continue
        if STALL_METRIC in line:
            m = re.search(re.escape(STALL_METRIC) + r"\s*[=: ]\s*([0-9.e-]+)", line)
            if m:
                return float(m.group(1))
        m = _STALL_RE.search(line)
        if m:
            value = float(m.group(1))
            return value / 1000.0 if (m.group(2) or "").lower() == "ms" else value
    return None


async def get_server(nursery: trio.Nursery, sc: Scenario, log: IO[str] | None) -> ServerProcess:
    """The server of the scenario: the running ``--target``, or a freshly spawned one (its flags adjusted:
    our tick, detector, a free metrics port, the secret we mint tokens with, a throw-away data dir)."""
    if sc.target is not None:
        host, port = sc.target
        pid = sc.server_pid or find_listening_pid(port, host)
        return ServerProcess(host, port, pid, [], None, sc.metrics_port)
    argv = [sys.executable, "-m", "idled.cli.main", "serve", "--host", "127.0.0.1", "--port", "0"]
    user = list(sc.server_args)
    if flag_value(user, "--tick") is None:
        argv += ["--tick", f"{sc.tick:g}"]
    if sc.detector:
        user = without_flag(user, "--detector")
        argv += ["--detector", sc.detector]
    metrics_port = None
    if flag_value(user, "--metrics-port") is None:
        metrics_port = free_port()
        argv += ["--metrics-port", str(metrics_port)]
    elif flag_value(user, "--metrics-port") != "0":
        metrics_port = int(flag_value(user, "--metrics-port") or 0) or None
    if sc.secret_file and flag_value(user, "--secret-file") is None:
        argv += ["--secret-file", sc.secret_file]  # the tokens we mint are for this secret
    if flag_value(user, "--data-dir") is None:
        # the event log of a throw-away server: a fresh directory, removed when the run ends
        argv += ["--data-dir", scratch_directory(nursery, "idled-loadtest-")]
    argv += user
    server = await spawn_server(nursery, argv, log=log)
    if server.metrics_port is None:
        server.metrics_port = metrics_port
    if not ipaddress.ip_address(server.host).is_loopback:
        await stop_server(server, grace=5)
        raise RuntimeError(f"the spawned server listens on {server.host}, not loopback: refusing to drive it")
    return server


def scratch_directory(nursery: trio.Nursery, prefix: str) -> str:
    """A fresh temporary directory for one run, removed when ``nursery`` ends (a spawned server's event log,
    a broker's configuration and log)."""
    path = tempfile.mkdtemp(prefix=prefix)
    nursery.start_soon(_remove_at_exit, path)
    return path


async def _remove_at_exit(path: str) -> None:
    try:
        await trio.sleep_forever()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def describe(server: ServerProcess) -> dict[str, Any]:
    return {"host": server.host, "port": server.port, "pid": server.pid, "argv": server.argv,
            "metrics_port": server.metrics_port, "returncode": server.returncode}
