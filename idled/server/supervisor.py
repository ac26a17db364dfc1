"""The supervisor of ``idled serve --workers N``: N ``idled edge`` children sharing the public port.

Theory of operation
-------------------
With workers, the core opens the public listening socket(s) itself (or adopts systemd's) but never accepts
on them: it passes them to every edge child (``pass_fds`` + ``--listen-fd``), and the kernel hands each new
connection to whichever edge accepts first (a busy edge accepts later, so the idle one takes more). The
core listens on its internal unix socket (``idled.server.internal``) where the edges log in as gateways
named ``worker-<i>`` and relay the gateways and observers that arrive at the public port.

``Supervisor.run`` (a task in the core's nursery) starts one keeper task per worker and reports itself
started once every edge printed ``IDLED_LISTENING`` (or after ``STARTUP_TIMEOUT``): the core then prints
its own ``IDLED_LISTENING`` line and tells systemd ``READY=1``. An edge that exits before it ever listened
during that start is a configuration error: the core stops with one fatal line rather than restarting it
forever. Later, a keeper restarts a child that exits unexpectedly, after a backoff of 0.1 s doubling to 5 s
(reset once a child has been up for a minute), and logs which worker died and how (status or signal). The
dead edge's link to the core is closed by the kernel, so the core's gateway-lost path ends every session it
carried at once (reason ``gateway_lost``); the other edges' users are untouched.

Each child's stderr is read line by line (lines capped at ``MAX_LINE`` bytes) and copied to the core's
stderr behind a ``worker-<i>:`` prefix, so one journal shows the whole daemon; its ``IDLED_LISTENING`` line
is what marks it ready. Children run in their own session (a terminal's Ctrl-C reaches only the core, which
stops them in order) and get SIGTERM if the core dies (``PR_SET_PDEATHSIG``), so no orphan edge keeps the
public port after a crash.

Signals: ``hangup()`` forwards SIGHUP to every live child; ``stop()`` (the core's SIGTERM, after it ended
every session with reason ``shutdown``) sends SIGTERM, waits up to ``STOP_TIMEOUT``, then SIGKILLs.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from idled.ops import config as config_module
from idled.ops.config import Config, ConfigError
from idled.ops.fatal import EXIT_FAILURE, Fatal
from idled.protocol import Login
from idled.server.edge.occupancy import Occupancy
from idled.server.gateways import GatewayLink
from idled.server.internal import peer_pid

__all__ = ["BACKOFF_MAX", "BACKOFF_MIN", "STARTUP_TIMEOUT", "STOP_TIMEOUT", "Supervisor", "Worker", "edge_command"]

log = logging.getLogger("idled.server.supervisor")

BACKOFF_MIN = 0.1  # seconds before the first restart of a worker that died
BACKOFF_MAX = 5.0  # the doubling stops here
STEADY = 60.0  # a worker up this long has its backoff reset
STARTUP_TIMEOUT = 30.0  # READY=1 at the latest this long after the first worker started
STOP_TIMEOUT = 10.0  # SIGTERM -> SIGKILL
MAX_LINE = 8192  # bytes of one child log line copied to the core's stderr; the rest is cut
LISTENING = b"IDLED_LISTENING"
_PR_SET_PDEATHSIG = 1


class Child:
    """One child process, started from the event loop's own thread.

    Not ``trio.lowlevel.open_process``: it forks from a worker thread, and ``PR_SET_PDEATHSIG`` fires when
    the thread that forked the child exits (trio's idle worker threads do, after ten seconds), not the
    process. The exit is awaited on a pidfd; ``exited`` lets any number of tasks wait for it."""

    def __init__(self, popen: subprocess.Popen[bytes], stderr: trio.lowlevel.FdStream) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.stderr = stderr
        self.exited = trio.Event()
        self._pidfd = os.pidfd_open(popen.pid)

    @classmethod
    def spawn(cls, argv: Sequence[str], *, pass_fds: Sequence[int], preexec: Callable[[], None]) -> Child:
        read, write = os.pipe()
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stderr=write,
                pass_fds=list(pass_fds),
                start_new_session=True,  # a terminal's SIGINT must reach only the core, which stops them in order
                preexec_fn=preexec,
                env=_child_environment(),
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        return cls(popen, trio.lowlevel.FdStream(read))

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    async def wait(self) -> int:
        """Wait for the exit (one task only: the keeper); others wait for ``exited``."""
        try:
            while self.popen.poll() is None:
                await trio.lowlevel.wait_readable(self._pidfd)
        finally:
            if self.popen.returncode is not None and not self.exited.is_set():
                os.close(self._pidfd)
                self.exited.set()
        return self.popen.returncode

    def send_signal(self, signum: int) -> None:
        """Signal it unless it has been reaped (Popen checks: a reaped pid may belong to someone else now)."""
        try:
            self.popen.send_signal(signum)
        except ProcessLookupError:
            pass


@dataclass(slots=True)
class Worker:
    """One edge slot: its name stays, its process changes on every restart."""

    index: int
    name: str
    process: Child | None = None
    started_at: float = 0.0  # time.monotonic() of the current process's start
    restarts: int = 0
    listening: trio.Event = field(default_factory=trio.Event)  # the current process printed IDLED_LISTENING
    ever_listened: bool = False

    @property
    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.returncode is None else None


def edge_command(config: Config, name: str, core: str, fds: Sequence[int], occupancy: str,
                 config_file: str | None = None) -> list[str]:
    """The command line of one edge child: the serve options that concern the edge, forwarded.

    With a configuration file the edge gets ``--config`` too, and as flags only the settings the file and
    the environment do not already give (they came from the core's command line): a SIGHUP then makes the
    edge re-read the file exactly as the core does (flags still win)."""
    argv = [sys.executable, "-m", "idled.cli.main", "edge", "--core", core, "--name", name, "--occupancy", occupancy]
    for fd in fds:
        argv += ["--listen-fd", str(fd)]
    base = _file_config(config_file)
    if config_file and base is not None:
        argv += ["--config", config_file]
    flags = {
        "max_frame": ("--max-frame", str(config.max_frame)),
        "login_timeout": ("--login-timeout", f"{config.login_timeout:g}"),
        "log_level": ("--log-level", config.log_level),
        "gc_thaw_every": ("--gc-thaw-every", f"{config.gc_thaw_every:g}"),
        "secret_file": ("--secret-file", config.secret_file or ""),
        "tls_cert": ("--tls-cert", config.tls_cert or ""),  # TLS and PROXY: idled.server.tls, at each edge
        "tls_key": ("--tls-key", config.tls_key or ""),
        "tls_client_ca": ("--tls-client-ca", config.tls_client_ca or ""),
        "max_connections": ("--max-connections", str(config.max_connections)),  # the daemon's: see occupancy
    }
    for setting, (flag, value) in flags.items():
        if getattr(config, setting) is not None and (base is None or getattr(base, setting) != getattr(config, setting)):
            argv += [flag, value]
    argv += ["--metrics-port", "0"]
    if config.insecure and (base is None or not base.insecure):
        argv += ["--insecure"]
    if config.proxy_protocol and (base is None or not base.proxy_protocol):
        argv += ["--proxy-protocol", "--proxy-allow", config.proxy_allow]
    return argv


def _file_config(path: str | None) -> Config | None:
    """What the file and the environment alone configure (None: no file, or it does not load now)."""
    if not path:
        return None
    try:
        return config_module.load(argparse.Namespace(config=path))
    except ConfigError:
        return None


def describe_exit(returncode: int) -> str:
    """``exited with status 3`` or ``killed by SIGKILL``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _death_signal() -> Callable[[], None]:
    """A preexec function asking the kernel to SIGTERM the child when the core dies (resolved before the
    fork: the child only makes the call)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))

    return preexec


# The core alone talks to systemd (NotifyAccess=main) and owns the inherited sockets: children must not try.
_SYSTEMD_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def _child_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in _SYSTEMD_ONLY}


class Supervisor:
    """Runs and keeps ``config.workers`` edge children (see the module docstring).

    ``peers``: the core's live gateways and observers (for the trust rule and per-worker session counts)."""

    def __init__(self, config: Config, *, peers: Collection[object]) -> None:
        self.config = config
        self.peers = peers
        self.workers = [Worker(i, f"worker-{i}") for i in range(config.workers)]
        self._names = frozenset(worker.name for worker in self.workers)
        # Every edge's connection count, shared (idled.server.edge.occupancy): max_connections is the daemon's.
        self.occupancy_fd, self.occupancy = Occupancy.create(len(self.workers)) if self.workers else (-1, [])
        self.core_address = ""
        self.socket_path: Path | None = None  # the internal socket, once bound (removed at exit)
        self.public: list[trio.socket.SocketType] = []  # the listeners' own sockets (fileno, close)
        self.stopping = False
        self.command = edge_command  # what starts one edge (tests substitute a stand-in)
        self.config_file: str | None = None  # the core's --config (or $IDLED_CONFIG), forwarded to the edges
        self._preexec = _death_signal()

    def adopt(self, public: Sequence[trio.socket.SocketType], core_socket: Path) -> None:
        """The public listening sockets to hand to the children, and the core's internal socket path."""
        self.public = list(public)
        self.core_address = f"unix:{core_socket}"
        self.socket_path = core_socket

    # -- the trust rule --------------------------------------------------------------------------------

    def trusts(self, stream: trio.abc.Stream, login: Login) -> bool:
        """A login that needs no token: see ``idled.server.internal`` for the rule and why."""
        if login.role != "gateway" or login.token:
            return False
        pid = peer_pid(stream)
        worker = next((w for w in self.workers if pid is not None and w.pid == pid), None)
        if worker is None or login.name != worker.name:
            return False
        # Its own link is already up: a second token-less "worker-i" from that edge is a relayed client.
        return not any(getattr(peer, "name", None) == worker.name for peer in self.peers)

    def is_link(self, peer: object) -> bool:
        """Whether a peer of the core is one of its edges' own links (a gateway named after a worker)."""
        return isinstance(peer, GatewayLink) and peer.name in self._names

    # -- running -----------------------------------------------------------------------------------------

    async def run(self, beat: Callable[[float], None] | None = None,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every worker and keep them running; ``started`` once all listen (or STARTUP_TIMEOUT).

        ``beat(now)`` is called every tenth of a tick meanwhile: the core's monitor (which keeps the stall
        guard's clock beating) starts only after READY=1, and a second of edges starting up is no pause."""
        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                nursery.start_soon(self._keep, worker)
            with trio.move_on_after(STARTUP_TIMEOUT):
                while not all(worker.listening.is_set() for worker in self.workers):
                    if beat is not None:
                        beat(trio.current_time())
                    await trio.sleep(self.config.tick / 10)
            waiting = [w.name for w in self.workers if not w.listening.is_set()]
            if waiting:
                log.warning("workers not listening after %g s: %s (serving anyway)", STARTUP_TIMEOUT, ", ".join(waiting))
            task_status.started()

    async def _spawn(self, worker: Worker) -> Child:
        fds = [s.fileno() for s in self.public]
        occupancy = f"{self.occupancy_fd},{worker.index}"
        argv = self.command(self.config, worker.name, self.core_address, fds, occupancy, self.config_file)
        self.occupancy[worker.index].publish(0)  # a new process holds nothing yet
        process = Child.spawn(argv, pass_fds=[*fds, self.occupancy_fd], preexec=self._preexec)
        worker.process, worker.started_at = process, time.monotonic()
        if worker.listening.is_set():  # a restart: wait for the new process to listen (run() may wait on the first)
            worker.listening = trio.Event()
        log.info("%s started (pid %d)", worker.name, process.pid)
        return process

    async def _keep(self, worker: Worker) -> None:
        backoff = BACKOFF_MIN
        while not self.stopping:
            process = await self._spawn(worker)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._copy_log, worker, process)
                    returncode = await process.wait()
            finally:
                with trio.CancelScope(shield=True):
                    if process.returncode is None:  # cancelled (the core is failing): leave no orphan
                        process.send_signal(signal.SIGKILL)
                        await process.wait()
                    await process.stderr.aclose()
            if self.stopping:
                return
            how = describe_exit(returncode)
            if not worker.ever_listened:
                raise Fatal("worker", worker.name, f"{how} before it listened (see its log lines above)", EXIT_FAILURE)
            if time.monotonic() - worker.started_at >= STEADY:
                backoff = BACKOFF_MIN
            log.error("%s (pid %d) %s; its sessions end (gateway_lost); restarting in %g s", worker.name, process.pid, how, backoff)
            await trio.sleep(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)
            worker.restarts += 1

    async def _copy_log(self, worker: Worker, process: Child) -> None:
        """Copy the child's stderr to ours, prefixed; its IDLED_LISTENING line marks it ready."""
        prefix = f"{worker.name}: ".encode()
        pending = b""
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        while True:
            chunk = await process.stderr.receive_some(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > MAX_LINE:
                lines.append(pending[:MAX_LINE])
                pending = b""
            for line in lines:
                if line.startswith(LISTENING) and not worker.listening.is_set():
                    worker.listening.set()
                    worker.ever_listened = True
                    log.info("%s (pid %d) listening", worker.name, process.pid)
                    continue
                if out is not None:
                    out.write(prefix + line[:MAX_LINE] + b"\n")
                    out.flush()

    # -- signals ---------------------------------------------------------------------------------------

    def hangup(self) -> None:
        """Forward SIGHUP (reload) to every live worker."""
        for worker in self.workers:
            self._signal(worker, signal.SIGHUP)

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM every worker (they close their users with server_shutdown and exit), wait up to
        ``timeout`` seconds, then SIGKILL what is left."""
        self.stopping = True
        for worker in self.workers:
            self._signal(worker, signal.SIGTERM)
        with trio.move_on_after(timeout):
            for worker in self.workers:
                if worker.process is not None:
                    await worker.process.exited.wait()
        for worker in self.workers:
            if worker.pid is not None:
                log.warning("%s (pid %d) did not stop within %g s: SIGKILL", worker.name, worker.pid, timeout)
                self._signal(worker, signal.SIGKILL)
                assert worker.process is not None
                await worker.process.exited.wait()
        for sock in self.public:
            sock.close()

    @staticmethod
    def _signal(worker: Worker, signum: int) -> None:
        if worker.process is not None:
            worker.process.send_signal(signum)

    # -- what the metrics see ----------------------------------------------------------------------------

    def view(self) -> list[tuple[str, int | None, int, int, int]]:
        """Per worker: name, pid (None: down), restarts, sessions the core holds through its link, connections
        it holds (its slot of the shared occupancy). Read on the event loop (``peers`` changes there)."""
        sessions = {getattr(p, "name", None): len(getattr(p, "uids", ())) for p in self.peers}
        counts = self.occupancy[0].counts() if self.occupancy else [0] * len(self.workers)
        return [(w.name, w.pid, w.restarts, sessions.get(w.name, 0), counts[w.index]) for w in self.workers]
