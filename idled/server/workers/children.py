"""The processes of ``idled serve --workers N`` as the root sees them: how one is started, watched and heard.

Theory of operation
-------------------
``Child`` is one process started from the event loop's own thread (``PR_SET_PDEATHSIG`` is tied to the thread
that forked, see below), with its stderr on a pipe and its exit awaited on a pidfd. ``Slot`` is what stays
when the process changes: a name (``core``, ``worker-<i>``), restarts, whether the current process listens.

Each child's stderr is read line by line (lines capped at ``MAX_LINE`` bytes) by ``copy_log`` and copied to
the root's stderr behind a ``core: `` or ``worker-<i>: `` prefix, so one journal shows the whole daemon and no
line is lost with a process: the pipe belongs to the root, which reads it to the end after the child died.
A child's ``IDLED_LISTENING`` line is not copied: it marks the child ready (the root prints its own).

Children run in their own session (a terminal's Ctrl-C reaches only the root, which stops them in order) and
get a signal if the root dies (``PR_SET_PDEATHSIG``: SIGKILL for the core -- a dead root is a crashed
daemon, and the next one recovers the log -- and SIGTERM for an edge, which closes its users and exits), so no
orphan keeps the public port or the event log. A child whose root died before it could ask exits at once.
``edge_command`` is the command line of one edge; the core's is the root's own (``idled.server.workers.root``).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from idled.ops import config as config_module
from idled.ops.config import Config, ConfigError

__all__ = ["BACKOFF_MAX", "BACKOFF_MIN", "STARTUP_TIMEOUT", "STOP_TIMEOUT", "Child", "Slot", "copy_log",
           "death_signal", "describe_exit", "edge_command"]

log = logging.getLogger("idled.server.workers.children")

BACKOFF_MIN = 0.1  # seconds before the first restart of a child that died
BACKOFF_MAX = 5.0  # the doubling stops here
STEADY = 60.0  # a child up this long has its backoff reset
STARTUP_TIMEOUT = 30.0  # READY=1 at the latest this long after the core listens
STOP_TIMEOUT = 10.0  # SIGTERM -> SIGKILL
MAX_LINE = 8192  # bytes of one child log line copied to the root's stderr; the rest is cut
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
                start_new_session=True,  # a terminal's SIGINT must reach only the root, which stops them in order
                preexec_fn=preexec,
                env=child_environment(),
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
class Slot:
    """One child's place: its name stays, its process changes on every restart (``index``: -1 for the core)."""

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

    def signal(self, signum: int) -> None:
        if self.process is not None:
            self.process.send_signal(signum)


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
        "tls_cert": ("--tls-cert", config.tls_cert or ""),  # TLS and PROXY: idled.door.tls, at each edge
        "tls_key": ("--tls-key", config.tls_key or ""),
        "tls_client_ca": ("--tls-client-ca", config.tls_client_ca or ""),
        "max_connections": ("--max-connections", str(config.max_connections)),  # the daemon's: see occupancy
        "max_pending_per_address": ("--max-pending-per-address", str(config.max_pending_per_address)),
        "ws_origins": ("--ws-origins", config.ws_origins),  # WebSocket: idled.door.websocket, at each edge
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


def death_signal(signum: int) -> Callable[[], None]:
    """A preexec function asking the kernel to send ``signum`` to the child when the root dies (resolved before
    the fork: the child only makes the calls). A root that died before the call leaves the child orphaned:
    then it exits at once."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signum))
        if os.getppid() != parent:
            os._exit(1)

    return preexec


# The root alone talks to systemd (NotifyAccess=main) and owns the inherited sockets: children must not try.
_SYSTEMD_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def child_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in _SYSTEMD_ONLY}


async def copy_log(prefix: str, process: Child, on_listening: Callable[[], None]) -> None:
    """Copy the child's stderr to ours behind ``prefix`` until its end (see the module docstring); its first
    IDLED_LISTENING line calls ``on_listening`` instead of being copied."""
    tag = f"{prefix}: ".encode()
    pending = b""
    listened = False
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
            if line.startswith(LISTENING) and not listened:
                listened = True
                on_listening()
                continue
            if out is not None:
                out.write(tag + line[:MAX_LINE] + b"\n")
                out.flush()
    if pending and out is not None:
        out.write(tag + pending[:MAX_LINE] + b"\n")
        out.flush()
