"""The root of ``idled serve --workers N``: a small supervisor that is not the core, so the edges outlive it.

Theory of operation
-------------------
With workers the daemon is N + 2 processes: this root, the core (``idled serve`` with the hidden
``--core-of-workers``: presence, detector, event log, metrics) and N edges (``idled edge``). The root holds
everything that must survive a crash of the core, and nothing of presence (it imports no presence, log or
protocol machinery), so it is small enough not to crash itself:

* **Sockets.** It opens the public listening socket(s) through the door -- or adopts systemd's -- which judges
  the auth rule on every endpoint and on what the sockets are bound to (``idled.door``), and it binds the core's internal unix socket
  (``idled.server.workers.internal``) itself. Every edge inherits the public sockets (``--listen-fd``); every core it
  starts inherits the internal one and accepts on it, plus the public ones (for their addresses only: the core
  never accepts there). The internal socket outlives the core: while a core is being restarted, the edges'
  reconnects wait in its backlog and are accepted the moment the new core runs -- no refused connection, no
  backoff to wait out.
* **Shared state.** The edges' connection counts (``idled.server.workers.occupancy``) and the roster
  (``idled.server.workers.roster``: each edge's pid and restarts, the core's restarts and heartbeat) are two
  memfds the root creates and every core inherits: a new core knows at once which processes are its edges
  (the trust rule of ``idled.server.workers.edges``) and what ``/status``, the status page and ``idled_worker_*``
  show.
* **Keeping.** One keeper task per child: start it, copy its stderr behind ``core:``/``worker-<i>:``
  (``idled.server.workers.children.copy_log``), wait for its exit, restart it after a backoff of 0.1 s doubling to
  5 s (reset once it has been up a minute). A child that exits before it ever listened during the start is a
  configuration error: the root stops with one fatal line and the child's exit status (a core's 2 stays 2, so
  ``RestartPreventExitStatus=2`` still holds; a core that exits 2 later is not restarted either). **A dead core** costs no user: the edges keep their users
  connected and answer their pings; their links drop, reconnect, and re-attach every live user to the new
  core, whose recovery first wrote ``offline restart`` for every session the log showed online (see
  docs/edge.md). **A dead edge** is a lost gateway to the core (``gateway_lost`` for its sessions); its users
  reconnect to a live edge.
* **Ready.** Once the core and every edge printed ``IDLED_LISTENING`` (the edges only after the core's
  welcome; at most ``STARTUP_TIMEOUT`` after the core), the root prints its own ``IDLED_LISTENING`` line per
  public socket and tells systemd ``READY=1``: the root is the unit's main process (``NotifyAccess=main``).
* **Watchdog.** The root sends systemd a ``STATUS=`` line every 5 s (core up or restarting, edges up). With
  ``WatchdogSec=`` the root pings systemd from its own loop, and judges the core by its
  heartbeat (the core's monitor beats the roster): a core silent for a whole watchdog period is killed
  (SIGABRT) and restarted like a crashed one, while the edges keep their users.
* **Signals.** SIGHUP is forwarded to every child. SIGTERM/SIGINT stop in order: the core first (it ends every
  session, reason ``shutdown``, tells the edges and relays, and exits), SIGKILL past its grace; then the
  internal socket is closed (an edge's reconnect is refused at once), then the edges (they close their users
  with ``server_shutdown`` and exit), SIGKILL past ``STOP_TIMEOUT``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import trio

from idled.door.addresses import bound_address, display
from idled.door.door import Door
from idled.ops import systemd
from idled.ops.config import Config, ConfigError
from idled.ops.fatal import EXIT_FAILURE, EXIT_LOG, EXIT_USAGE, Fatal
from idled.protocol.address import UnixPath, format_address
from idled.server.runtime.signals import SIGNALS, until_stopped
from idled.server.workers import internal
from idled.server.workers.children import (
    BACKOFF_MAX, BACKOFF_MIN, STARTUP_TIMEOUT, STEADY, STOP_TIMEOUT, Child, Slot, copy_log, death_signal,
    describe_exit, edge_command,
)
from idled.server.workers.occupancy import Occupancy
from idled.server.workers.roster import Roster

__all__ = ["CORE_GRACE", "Root", "core_command", "parse_core_fds"]

log = logging.getLogger("idled.server.workers.root")

STATUS_EVERY = 5.0  # seconds between two systemd STATUS= lines
CORE_GRACE = 30.0  # seconds a SIGTERMed core may take (its own drain is shorter: the login timeout, at least 5 s)


def core_command(flags: Sequence[str], internal_fd: int, roster_fd: int, occupancy_fd: int,
                 public_fds: Sequence[int]) -> list[str]:
    """The core's command line: the root's own serve flags, plus the descriptors it inherits."""
    fds = ",".join(str(fd) for fd in (internal_fd, roster_fd, occupancy_fd, *public_fds))
    return [sys.executable, "-m", "idled.cli.main", "serve", *flags, "--core-of-workers", fds]


def parse_core_fds(value: str) -> tuple[int, int, int, list[int]]:
    """``--core-of-workers INTERNAL,ROSTER,OCCUPANCY,PUBLIC...`` -> the descriptors; ValueError otherwise."""
    parts = value.split(",")
    if len(parts) < 4 or not all(part.isdigit() for part in parts):
        raise ValueError(f"--core-of-workers takes INTERNAL,ROSTER,OCCUPANCY,PUBLIC[,PUBLIC...] fds, got {value!r}")
    fds = [int(part) for part in parts]
    return fds[0], fds[1], fds[2], fds[3:]


class Root:
    """The root process (see the module docstring). ``flags``: the serve flags to start the core with;
    ``secret``: whether logins need a token (the auth rule on the public sockets)."""

    def __init__(self, config: Config, flags: Sequence[str], *, secret: bytes | None,
                 env: Mapping[str, str] | None = None, config_file: str | None = None,
                 reload_config: Callable[[], Config] | None = None) -> None:
        self.config = config
        self._reload_config = reload_config  # SIGHUP: a restarted edge then gets what the file says now
        self.flags = list(flags)
        self.secret = secret
        self.env = dict(os.environ) if env is None else dict(env)
        self.config_file = config_file  # forwarded to the edges (a SIGHUP makes them re-read it)
        self.core = Slot(-1, "core")
        self.workers = [Slot(i, f"worker-{i}") for i in range(config.workers)]
        self.occupancy_fd, self.occupancy = Occupancy.create(len(self.workers))
        self.roster = Roster.create(len(self.workers))
        self.public: list[trio.socket.SocketType] = []
        self.addresses: list[tuple[str, int | None]] = []
        self.internal: trio.socket.SocketType | None = None
        self.socket_path: Path | None = None
        self.stopping = False
        self.edge_command = edge_command  # what starts one edge (tests substitute a stand-in)
        self._stop = trio.Event()

    @property
    def slots(self) -> list[Slot]:
        return [self.core, *self.workers]

    # -- running ---------------------------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the sockets, start the core and the edges, keep them until SIGTERM/SIGINT or ``stop()``."""
        try:
            await self._open_public()
            await self._open_internal()
            with trio.open_signal_receiver(*SIGNALS) as signals:
                async with trio.open_nursery() as nursery:
                    await self._start(nursery)
                    task_status.started([port for _, port in self.addresses if port is not None])
                    await until_stopped(self._stop, self.hangup, signals)
                    await self._stop_children()
                    nursery.cancel_scope.cancel()
        finally:
            self._close_internal()
            for sock in self.public:
                sock.close()

    async def _start(self, nursery: trio.Nursery) -> None:
        """Start every child; return once all listen (READY=1 sent)."""
        for slot in self.slots:
            nursery.start_soon(self._keep, slot)
        await self.core.listening.wait()  # or the keeper's Fatal ends the nursery
        with trio.move_on_after(STARTUP_TIMEOUT):
            for worker in self.workers:
                await worker.listening.wait()
        waiting = [w.name for w in self.workers if not w.listening.is_set()]
        if waiting:
            log.warning("workers not listening after %g s: %s (serving anyway)", STARTUP_TIMEOUT, ", ".join(waiting))
        for host, port in self.addresses:
            log.info("listening on %s: the core and %d edges", display(host, port), len(self.workers))
            if port is not None:
                print(f"IDLED_LISTENING host={host} port={port}", file=sys.stderr, flush=True)
        systemd.notify(systemd.READY, env=self.env)
        interval = systemd.watchdog_interval(self.env)
        if interval is not None:
            nursery.start_soon(self._watchdog, interval)
        nursery.start_soon(self._status)

    async def _open_public(self) -> None:
        """The public client port, through the door; the rule judged on every endpoint first, the core's metrics
        endpoint and API too (the core opens those itself, through its own door), so that a refused
        configuration stops here, before a child starts."""
        cfg = self.config
        door = Door.of(cfg, secret=self.secret is not None, env=self.env)
        door.check()
        listeners = await door.open("client")
        self.public = [listener.socket for listener in listeners]
        self.addresses = [bound_address(listener) for listener in listeners]

    async def _open_internal(self) -> None:
        """Bind the core's internal socket, unless a live daemon already serves it (then: refuse to start)."""
        directory = Path(self.config.resolved_data_dir(self.env))
        path = internal.core_socket_path(self.env, directory)
        await trio.to_thread.run_sync(lambda: path.parent.mkdir(mode=0o700, parents=True, exist_ok=True))
        if await _answers(path):
            raise Fatal("internal socket", str(path), "another idled serve --workers is running on it", EXIT_LOG)
        listener = await internal.open_internal_listener(path)
        self.internal, self.socket_path = listener.socket, path
        log.info("workers: %d edges on the public port; core on unix:%s", len(self.workers), path)

    def _close_internal(self) -> None:
        if self.internal is not None:
            self.internal.close()
            self.internal = None
        if self.socket_path is not None:
            internal.remove_socket(self.socket_path)
            self.socket_path = None

    def _spawn(self, slot: Slot) -> Child:
        public = [sock.fileno() for sock in self.public]
        if slot is self.core:
            assert self.internal is not None
            fds = [self.internal.fileno(), self.roster.fd, self.occupancy_fd, *public]
            argv = core_command(self.flags, fds[0], fds[1], fds[2], public)
            self.roster.clear_heartbeat()
            process = Child.spawn(argv, pass_fds=fds, preexec=death_signal(signal.SIGKILL))
        else:
            occupancy = f"{self.occupancy_fd},{slot.index}"
            argv = self.edge_command(self.config, slot.name, format_address(UnixPath(str(self.socket_path))), public, occupancy,
                                     self.config_file)
            self.occupancy[slot.index].publish(0)  # a new process holds nothing yet
            process = Child.spawn(argv, pass_fds=[*public, self.occupancy_fd], preexec=death_signal(signal.SIGTERM))
            self.roster.set_worker(slot.index, process.pid, slot.restarts)
        slot.process, slot.started_at = process, time.monotonic()
        if slot.listening.is_set():  # a restart: wait for the new process to listen
            slot.listening = trio.Event()
        log.info("%s started (pid %d)", slot.name, process.pid)
        return process

    async def _keep(self, slot: Slot) -> None:
        """Run ``slot``'s process, and restart it whenever it exits, until the root stops."""
        backoff = BACKOFF_MIN
        while not self.stopping:
            process = self._spawn(slot)
            returncode = await self._watch(slot, process)
            if self.stopping:
                return
            if not slot.ever_listened or (slot is self.core and returncode == EXIT_USAGE):
                # (A core that says its configuration is wrong -- a file edited since -- is not restarted into
                # it: RestartPreventExitStatus=2 holds for the whole daemon.)
                status = returncode if slot is self.core and returncode > 0 else EXIT_FAILURE
                when = "before it listened" if not slot.ever_listened else "(a configuration error)"
                raise Fatal(slot.name, f"pid {process.pid}", f"{describe_exit(returncode)} {when} "
                            "(see its log lines above)", status)
            if time.monotonic() - slot.started_at >= STEADY:
                backoff = BACKOFF_MIN
            what = ("the edges keep their users and re-attach them" if slot is self.core
                    else "its sessions end (gateway_lost)")
            log.error("%s (pid %d) %s; %s; restarting in %g s", slot.name, process.pid, describe_exit(returncode),
                      what, backoff)
            await trio.sleep(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)
            slot.restarts += 1
            if slot is self.core:
                self.roster.set_core_restarts(slot.restarts)

    async def _watch(self, slot: Slot, process: Child) -> int:
        """Copy the process's log and wait for its exit; never leave it running (cancelled: SIGKILL)."""

        def listening() -> None:
            slot.listening.set()
            slot.ever_listened = True
            log.info("%s (pid %d) listening", slot.name, process.pid)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(copy_log, slot.name, process, listening)
                return await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:  # cancelled (the root is failing): leave no orphan
                    process.send_signal(signal.SIGKILL)
                    await process.wait()
                await process.stderr.aclose()
                if slot is not self.core:
                    self.roster.set_worker(slot.index, None, slot.restarts)

    async def _watchdog(self, interval: float) -> None:
        """Ping systemd every ``interval``; restart a core whose heartbeat is older than the watchdog period."""
        with systemd.Notifier(self.env) as notifier:
            while True:
                notifier.send(systemd.WATCHDOG)
                age = self.roster.heartbeat_age()
                if self.core.pid is not None and self.core.listening.is_set() and age is not None and age > 2 * interval:
                    log.error("core (pid %d) silent for %.1f s (watchdog): SIGABRT", self.core.pid, age)
                    self.core.signal(signal.SIGABRT)
                    self.roster.clear_heartbeat()
                await trio.sleep(interval)

    async def _status(self) -> None:
        """A ``STATUS=`` line for ``systemctl status`` every ``STATUS_EVERY`` seconds (the core's own are not
        sent: only the main process may)."""
        with systemd.Notifier(self.env) as notifier:
            while notifier.enabled:
                up = sum(w.pid is not None for w in self.workers)
                core = "up" if self.core.pid is not None else "restarting"
                notifier.send(systemd.status(f"core {core} ({self.core.restarts} restarts); edges up {up}/{len(self.workers)}"))
                await trio.sleep(STATUS_EVERY)

    # -- signals ---------------------------------------------------------------------------------------------

    def hangup(self) -> None:
        """SIGHUP: every live child reloads its configuration (and the root, for the edges it restarts later)."""
        if self._reload_config is not None:
            try:
                self.config = self._reload_config()
            except ConfigError as exc:
                log.warning("SIGHUP: configuration not reloaded by the root: %s", exc)
        for slot in self.slots:
            slot.signal(signal.SIGHUP)

    def stop(self) -> None:
        """Begin an orderly stop (what SIGTERM does)."""
        self._stop.set()

    async def _stop_children(self) -> None:
        """The core first (every session ends ``shutdown``), then the edges (they close their users)."""
        self.stopping = True
        await _terminate([self.core], CORE_GRACE)
        self._close_internal()  # an edge's reconnect is refused now, not left waiting in the backlog
        await _terminate(self.workers, STOP_TIMEOUT)


async def _terminate(slots: Sequence[Slot], timeout: float) -> None:
    """SIGTERM every slot's process, wait up to ``timeout`` seconds, then SIGKILL what is left."""
    for slot in slots:
        slot.signal(signal.SIGTERM)
    with trio.move_on_after(timeout):
        for slot in slots:
            if slot.process is not None:
                await slot.process.exited.wait()
    for slot in slots:
        if slot.pid is not None:
            log.warning("%s (pid %d) did not stop within %g s: SIGKILL", slot.name, slot.pid, timeout)
            slot.signal(signal.SIGKILL)
            assert slot.process is not None
            await slot.process.exited.wait()


async def _answers(path: Path) -> bool:
    """Whether a live process accepts on the unix socket at ``path`` (a stale file from a crash does not)."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with trio.move_on_after(1.0):
            await sock.connect(os.fspath(path))
            return True
        return False
    except OSError:
        return False
    finally:
        sock.close()
