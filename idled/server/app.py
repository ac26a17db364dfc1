"""The daemon's lifecycle: recover, listen, serve, reload on SIGHUP, drain and stop on SIGTERM.

Theory of operation
-------------------
Everything below the server package is pure; the server package is the only place that reads clocks,
touches sockets and handles signals, and this module wires its pieces together rather than being them:

* ``runtime.clock.Clock``: the pause-adjusted monotonic clock (the stall guard) every deadline is measured on;
* ``engine.seqs.SeqBlocks``: the durable seq reservation, extended ahead of need;
* ``engine.sessions.Sessions``: the presence table as connections and the tick task change it (room, publish,
  take-over, the shutdown flag);
* ``roles.doorway.Doorway``: admission, login and dispatch of each connection to its role --
  ``roles.users.run_user``
  (the user loop, on the presence table through ``roles.users.CoreUsers``), ``roles.gateways.Gateways``,
  ``roles.observers.Observers``;
  wired, limited and reloaded as an edge's is (``idled.server.roles.table``: the parts the two processes share);
* ``engine.ticker.Ticker``: expiry; ``runtime.monitor.Monitor``: loop lag, the watchdog, periodic hooks;
* ``engine.logtask.LogTask``: the log writer (``idled.log.writer.run_writer``), which group-commits the records the
  bus queues.

``serve()`` goes through the door first (``idled.door``: the rule on every endpoint -- client port, metrics,
API -- then each bound, or adopted from systemd, and judged on its bound address), so a failed bind or a
refused address ends the start before the log is touched or a seq reserved. It fixes the connection limit: ``max_connections``, capped to the descriptor budget
(``idled.ops.fdbudget``: the open-file limit less a reserve for the log, metrics and the rest) with a warning,
so descriptors never run out under the log's feet. Then it recovers the log (which fixes the first seq),
builds the presence table and the pieces above, and runs one nursery: the writer, the /metrics endpoint, the
tick task, one accept loop per listener (``idled.door.accept.accept_all``; handlers run in this nursery, under the
accept loops' own scope so stopping to accept leaves them running), the monitor.
With ``--workers N`` the core is a child of the root (``workers.root``), which runs N ``idled edge`` children on the
public port and restarts the core if it dies: the core accepts only on the internal unix socket the root
passed (``workers.edges.Workers``: the sockets, the edges' pids and counts), and the root speaks to systemd.
Then it waits for SIGTERM/SIGINT or ``stop()``. A full disk does not end it: it runs *degraded*
(``idled.server.engine.degraded``: new work refused with ``unavailable``, sessions kept, events held in memory and
written in seq order once there is room, by itself), whether the disk fills while it runs or was full when it
started. Any other failure of the log (fsync failed, EIO, a damaged state) ends the daemon as one ``Fatal``
naming the log's directory (``idled.ops.fatal``): systemd restarts it onto a recovered log.

Shutdown (``_shutdown``) is bounded by one cancel-scope deadline, the grace period (``MIN_GRACE`` or the
login timeout, whichever is longer; shielded so that the first cancel does not cut it short): stop accepting,
end every session (reason ``shutdown``), let the writer drain and sync, tell the gateways and observers
(after every event has reached them), wait for the connections to close -- then cancel the rest, done or not.
Three of those waits have no event to await (every event delivered to the observers, the relayed peers gone,
every connection closed), so they poll every 10 ms: a few dozen wake-ups in a shutdown that lasts a fraction
of a second, and the deadline, not the polls, bounds how long it may take.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from idled.core.factory import make_detector
from idled.core.presence import PresenceEvent, PresenceTable, ticks_for
from idled.door.accept import Shortage, accept_all
from idled.door.addresses import bound_address, display
from idled.door.door import (
    Door, Listening, api_gate, client_gate, close_all, http_connections, metrics_gate, reload_gate,
)
from idled.log.eventlog import EventLog, Recovery
from idled.log.seqs import SeqReservation
from idled.ops import systemd
from idled.ops.config import Config
from idled.ops.fatal import fatal_on_log_error
from idled.ops.fdbudget import Budget, open_file_limit
from idled.ops.gcpolicy import GcPolicy
from idled.ops.health import Health
from idled.ops.http import serve_metrics
from idled.ops.logs import PeerLog, plural
from idled.ops.metrics import Metrics
from idled.ops.nullmetrics import NullMetrics
from idled.protocol import ErrorCode
from idled.server.election import Election
from idled.server.election.fence import Fence
from idled.server.engine.bus import EventBus
from idled.server.engine.degraded import Degraded, LogHold
from idled.server.engine.logtask import LogTask
from idled.server.engine.queries import Queries
from idled.server.engine.seqs import SeqBlocks
from idled.server.engine.sessions import Sessions
from idled.server.engine.ticker import Ticker
from idled.server.ha.feed import Replicas
from idled.server.roles.doorway import Connection, Doorway, auth_secret, refuse_out_of_descriptors
from idled.server.roles.gateways import Gateways
from idled.server.roles.observers import Observers
from idled.server.roles.plane import UserPlane
from idled.server.roles.table import (
    DOOR_RELOADABLE, connection_counts, connection_limit, reload_door, roles, user_plane,
)
from idled.server.roles.users import CoreUsers
from idled.server.runtime.clock import Clock, floor_wall
from idled.server.runtime.monitor import Monitor
from idled.server.runtime.reload import reload
from idled.server.runtime.signals import SIGNALS, until_stopped
from idled.server.status.lagwatch import LagWatch
from idled.server.status.overview import status_part
from idled.server.status.vitals import Sample, Vitals, histogram_source
from idled.server.workers.edges import Workers

if TYPE_CHECKING:  # (the API is imported by a process that serves it: _start_api)
    from idled.server.api import Api

__all__ = ["RELOADABLE", "NotServing", "Running", "Server"]

log = logging.getLogger("idled.server.app")
peer_log = PeerLog(logging.getLogger("idled.server.peers"))  # debug lines, rate-limited per kind

# Settings SIGHUP applies to the running server; they only shape what happens next (new connections,
# new frames, the log level). The others size structures or bind sockets: they need a restart.
RELOADABLE = (*DOOR_RELOADABLE, "max_gateway_frame", "stall_ticks")
MIN_GRACE = 5.0  # seconds a shutdown may take at least (at least login_timeout, too)


class NotServing(RuntimeError):
    """What a running server has is asked for before ``serve()`` recovered the log (or after it failed to)."""


@dataclasses.dataclass(eq=False, frozen=True)
class Running:
    """What a core runs on, built in one piece once the log is recovered (``Server._recover``): the presence
    table and every part that works on it. Nothing of it exists before recovery fixed the first seq."""

    presence: PresenceTable
    sessions: Sessions
    gateways: Gateways
    observers: Observers
    replicas: Replicas  # standbys (idled.server.ha.feed)
    plane: UserPlane  # logged-in plain TCP users, one thread and one task for all (idled.server.roles.plane)
    doorway: Doorway
    writer: LogTask  # the log-writer task (idled.server.engine.logtask)
    lagwatch: LagWatch
    damage: tuple[int, int]  # (bytes, records) the recovery found damaged: exported as gauges


class Server:
    """One idled daemon. ``serve()`` runs it; ``stop()`` begins a clean shutdown; ``handle(stream)`` serves one
    connection as the accept loop would (tests hand it memory streams)."""

    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics | NullMetrics | None = None,
        env: dict[str, str] | None = None,
        reload_config: Callable[[], Config] | None = None,
        gc_policy: GcPolicy | None = None,
        workers: Callable[[set[Connection]], Workers] | None = None,
        election: Election | None = None,
    ) -> None:
        self.config = config
        self.gc_policy = gc_policy  # None: the interpreter's default (tests run many servers in one process)
        self._reload_config = reload_config
        self.env = dict(os.environ) if env is None else env
        self.metrics = NullMetrics() if metrics is None else metrics
        self.secret = auth_secret(config)
        self.log = EventLog(
            config.resolved_data_dir(self.env),
            segment_bytes=config.segment_bytes,
            retention_bytes=config.retention_bytes,
            retention_seconds=config.retention_seconds,
            last_seen_horizon=config.last_seen_horizon,
        )
        # Under --election (idled.server.node): seq blocks are reserved in etcd too, and the fence stops the
        # server before its first write once the lease is lost.
        self.election = election
        self.fence = Fence(election) if election is not None else None
        self.degraded = Degraded()  # a full disk: why new work is refused now (idled.server.engine.degraded)
        self.seqs = SeqBlocks(SeqReservation(self.log.directory), election, self.degraded)
        self._event_counters: dict[tuple[str, str], Any] = {}
        self.bus = EventBus(on_event=self._count_event)
        self.hold = LogHold(self.degraded, self.bus)  # what the writer holds back on a full disk
        self.vitals = Vitals(self._sample, lateness=histogram_source(self.metrics.offline_lateness)
                             if isinstance(self.metrics, Metrics) else lambda: None)
        self.clock = Clock(config.stall_ticks * config.tick)
        self.monitor = Monitor(self.clock, tick=config.tick, env=self.env, metrics=self.metrics)
        self.connections = connection_counts()
        self._running: Running | None = None  # built by serve() after recovery, which fixes the first seq
        self._accept_scope = trio.CancelScope()
        self._stop_event = trio.Event()
        self.stopped = trio.Event()  # set once serve() has returned (or failed)
        self._peers: set[Connection] = set()  # gateways, observers and standbys, told when the server stops
        self.ports: list[int] = []
        self.addresses: list[tuple[str, int | None]] = []  # what each listener is bound to (getsockname)
        self.budget: Budget | None = None  # set by serve() once the listeners are known
        # Every listener through the door (idled.door): the rule, the gates; what serve() opened, by endpoint.
        self.door = Door.of(config, secret=self.secret is not None, env=self.env)
        self.listening: Listening = {}
        self.shortage = Shortage(lambda: str(self.budget))
        # --workers N (``workers``: adopts what the root passed): the edges take the public port, the core
        # serves them on the internal socket.
        self.workers = workers(self._peers) if workers is not None else None
        self.api: Api | None = None  # the HTTP API (idled.server.api), with api_port

    @property
    def running(self) -> Running:
        """What the core runs on (see `Running`); `NotServing` until ``serve()`` has recovered the log."""
        if self._running is None:
            raise NotServing("the server is not serving yet: await nursery.start(server.serve, ...) first")
        return self._running

    @property
    def stopping(self) -> bool:
        """Shutdown has begun: no new connection or session is accepted."""
        return self._running is not None and self._running.sessions.stopping

    @property
    def largest_stall(self) -> float:
        """Seconds the event loop was late, at worst (the monitor's probe)."""
        return self.monitor.largest_stall

    # -- lifecycle ------------------------------------------------------------------------------------

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener] | Listening | None = None,
        *,
        task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Recover the log, listen, and run until cancelled or ``stop()``; then shut down cleanly.

        ``listeners``: None opens the configured ones through the door (or adopts systemd's); a sequence is the
        client port's (``[]``: accept nothing, every connection then comes through ``handle``); a mapping by
        endpoint name (``idled.door.door``) is what an elected node holds for its roles. What is not given and
        is configured (metrics, API) is opened through the door."""
        try:
            # The door first (idled.door): the rule on every listener, then each one bound (or adopted), before
            # the log is touched or a seq reserved -- a refused or failed start leaves the data directory alone.
            self.door.check()
            given = self.workers.public if listeners is None and self.workers is not None else listeners
            self.listening = opened = await self.door.open_all(given)
            try:
                listeners = opened["client"]
                self.addresses = [bound_address(listener) for listener in listeners]
                self.ports = [port for _, port in self.addresses if port is not None]
                self.budget = Budget.of(open_file_limit(), listeners=sum(len(group) for group in opened.values()),
                                        http=http_connections(self.config, opened))
                with fatal_on_log_error(str(self.log.directory)):
                    recovery, self._running = await self._recover()
            except BaseException:
                close_all(opened)  # not served: the accept loops would have closed them
                raise
            if self.workers is not None:
                for listener in listeners:
                    listener.socket.close()  # the edges accept there; the core knows the addresses now
                listeners = [self.workers.internal]
            self.clock.start()
            async with trio.open_nursery() as nursery:
                # Signals are received from before READY=1 / IDLED_LISTENING on (a SIGTERM right after is a
                # stop) until shutdown begins: the receiver closed, a second Ctrl-C interrupts the shutdown.
                with trio.open_signal_receiver(*SIGNALS) as signals:
                    await self._start(nursery, self._running, recovery, listeners)
                    del recovery  # its open sessions are closed now: not held for the whole run
                    task_status.started(self.ports)
                    await until_stopped(self._stop_event, self._hangup, signals)
                await self._shutdown(nursery, self._running)
        finally:
            self.stopped.set()

    async def _recover(self) -> tuple[Recovery, Running]:
        """Recover the log, then build the presence table and the pieces that work on it."""
        cfg = self.config
        recovery = await trio.to_thread.run_sync(self.log.recover)  # failures: see fatal_on_log_error in serve()
        if recovery.damaged:  # damage skipped in place, a quarantined tail, a bad snapshot (see log/recovery)
            log.warning("event log: %s", recovery.summary())
        floor_wall(self.clock.wall, recovery.last_ts, log)  # ts never below the last one logged, whatever the clock
        detector = make_detector(cfg.detector_kind, timeout=ticks_for(cfg.timeout, cfg.tick), slots=cfg.slots)
        presence = PresenceTable(
            detector,
            tick=cfg.tick,
            timeout=cfg.timeout,
            max_timeout=cfg.max_timeout,
            detector_name=cfg.detector_kind,
            first_seq=await self.seqs.start(recovery.next_seq),
            max_devices=cfg.max_devices,
            offline_grace=cfg.offline_grace,
        )
        if self.gc_policy is not None:
            self.gc_policy.start()  # after the session maps exist: see idled.ops.gcpolicy
        sessions = Sessions(presence, self.bus, self.clock, self.seqs)
        gateways = Gateways(sessions, self._peers, max_frame=cfg.max_gateway_frame, grace=cfg.gateway_grace)
        queries = Queries(presence, self.bus, self.log, first_seq=self.seqs.first, clock=self.clock.now,
                          wall=self.clock.wall)
        observers = Observers(presence, self.bus, self.log, first_seq=self.seqs.first, peers=self._peers,
                              clock=self.clock.now, max_watch=cfg.max_watch, queries=queries)
        replicas = Replicas(self.bus, self.log, sync=cfg.sync_standby, registry=self.metrics.registry,
                                 peers=self._peers, wall=self.clock.wall)
        users = CoreUsers(sessions)
        # Logged-in plain TCP users are served by one thread and one task (idled.server.roles.plane), not one each.
        plane = user_plane(users, self.connections, self._reject)
        sessions.drain = plane.drain  # the tick task reads what the plane let gather (its Coalescing)
        doorway = Doorway(
            cfg, sessions=users, roles=roles(users, gateway=gateways.run, observer=observers.run,
                                             standby=replicas.serve),
            secret=self.secret, metrics=self.metrics, connections=self.connections,
            gate=client_gate(cfg, public=self.workers is None),
            trusts=self.workers.trusts if self.workers is not None else None,
            wall=self.clock.tokens,
        )
        doorway.limit = self._connection_limit(cfg.max_connections)
        writer = LogTask(self.log, self.bus, cfg, metrics=self.metrics, fence=self.fence, hold=self.hold,
                         seqs=self.seqs, last_seq=lambda: presence.next_seq - 1)
        # Edges that fall behind say so (the threshold: beyond a GC walk's pause and a couple of ticks).
        lagwatch = LagWatch(presence.holds, self.clock.now, threshold=max(2.0, 2 * cfg.tick),
                            owns=lambda owner: bool(owner.uids))
        damage = (recovery.skipped_bytes + recovery.truncated_bytes, recovery.corrupt_records)
        return recovery, Running(presence, sessions, gateways, observers, replicas, plane, doorway, writer, lagwatch,
                                 damage)

    def _connection_limit(self, max_connections: int) -> int:
        return connection_limit(max_connections, self.budget, log)

    async def _start(
        self, nursery: trio.Nursery, running: Running, recovery: Recovery, listeners: Sequence[trio.SocketListener]
    ) -> None:
        """Start every task of a running server in ``nursery``; returns once it listens (READY=1 sent)."""
        cfg, presence, sessions = self.config, running.presence, running.sessions
        await nursery.start(running.writer.run)
        if self.fence is not None:
            nursery.start_soon(self.fence.watch)
        # Sessions a crashed run left online end now, before anyone can log in again (in bounded chunks; in
        # the background if the disk is full, logins refused until they are ended).
        await sessions.close_recovered(recovery.online.values(), nursery)
        self.metrics.register_snapshot(self.snapshot)
        if self.workers is not None and self.metrics.registry is not None:
            from idled.server.workers.metrics import WorkerCollector  # (psutil: only under --workers)
            self.metrics.registry.register(WorkerCollector(self.workers.view, self.workers.core_restarts))
        metrics_listeners = self.listening.pop("metrics", [])
        if metrics_listeners and self.metrics.registry is not None:  # NullMetrics: nothing to export
            health = Health(self.log.directory, status=self.status, listening=lambda: bool(self.ports) and not self.stopping,
                            vitals=self.vitals.live, secret=self.secret, wall=self.clock.tokens,
                            degraded=self.hold.readiness)
            await nursery.start(functools.partial(serve_metrics, health=health), self.metrics.registry,
                                metrics_listeners, metrics_gate())
        else:
            close_all({"metrics": metrics_listeners})
        api_listeners = self.listening.pop("api", [])
        if api_listeners:
            await nursery.start(self._start_api(running).serve, api_listeners)
        running.gateways.spawn = nursery.start_soon  # grace periods of gateways that lost their connection
        nursery.start_soon(running.plane.run)
        ticker = Ticker(sessions, tick=cfg.tick, metrics=self.metrics)
        sessions.wake_ticker = ticker.wake
        nursery.start_soon(ticker.run)
        await nursery.start(self._accept, listeners, nursery)
        for host, port in self.addresses:
            log.info("listening on %s", display(host, port))
            if port is not None:
                print(f"IDLED_LISTENING host={host} port={port}", file=sys.stderr, flush=True)
        systemd.notify(systemd.READY, env=self.env)
        hooks: list[Callable[[], object]] = [functools.partial(self.seqs.extend_ahead, presence, nursery),
                                             running.lagwatch.check,
                                             lambda: self.vitals.sample(trio.current_time(), self.clock.wall)]
        if self.gc_policy is not None:
            hooks.append(self.gc_policy.maybe_thaw)
        if self.workers is not None:
            hooks.append(self.workers.beat)  # the root's watchdog watches it
        # Started after READY=1, so the manager never sees WATCHDOG=1 (or STATUS=) before it.
        nursery.start_soon(self.monitor.run, self._status_line, hooks)

    def _start_api(self, running: Running) -> Api:
        from idled.server.api import Api, ApiMetrics, Backend  # (h11 and the API: only a process that serves it)
        backend = Backend(running.sessions, running.observers.queries, self.log, self.vitals, self.status,
                          self.workers.view if self.workers is not None else None, time.monotonic(),
                          running.observers)
        self.api = Api(self.config, backend, secret=self.secret, metrics=ApiMetrics(self.metrics.registry),
                       gate=api_gate(self.config))
        return self.api

    def _reject(self, code: str) -> None:
        self.running.doorway.reject(code)

    async def handle(self, stream: trio.abc.Stream) -> None:
        """Serve one connection, as the accept loop does for each it accepts (once ``serve()`` has started)."""
        await self.running.doorway.handle(stream)

    async def _accept(
        self, listeners: Sequence[trio.SocketListener], handlers: trio.Nursery, task_status: trio.TaskStatus[None]
    ) -> None:
        # Accept loops under their own scope, handlers in the main nursery: stopping to accept
        # (shutdown) closes the listeners and leaves the connections to end cleanly. With no listener
        # (connections are handed to handle() directly) the scope is just held.
        with self._accept_scope:
            await accept_all(listeners, self.handle, handlers, refuse_out_of_descriptors, self.shortage,
                             task_status=task_status)

    def _hangup(self) -> None:
        self._reload()  # under --workers the root forwards SIGHUP to the edges itself

    def stop(self) -> None:
        """Begin a clean shutdown (what SIGTERM does)."""
        self._stop_event.set()

    def _reload(self) -> None:
        """SIGHUP: apply what can change without a restart (``RELOADABLE``), report the rest (``idled.server.runtime.reload``)."""
        reload(self.config, self._reload_config, RELOADABLE, self._apply, log, env=self.env)

    def _apply(self, config: Config) -> None:
        """Hand a reloaded configuration to every piece that reads a RELOADABLE setting."""
        previous, self.config = self.config, config
        self.clock.stall_limit = config.stall_ticks * config.tick
        if self._running is not None:
            reload_door(self._running.doorway, previous, config, self._connection_limit)
            self._running.gateways.max_frame = config.max_gateway_frame
        if self.api is not None:
            reload_gate(self.api.gate, config)

    async def _shutdown(self, nursery: trio.Nursery, running: Running) -> None:
        """Stop accepting, end every session (reason shutdown), flush the log, then cancel the rest."""
        sessions = running.sessions
        sessions.stopping = True
        self._accept_scope.cancel()
        if self.api is not None:
            self.api.close()
        systemd.notify(systemd.STOPPING, env=self.env)
        with trio.move_on_after(max(MIN_GRACE, self.config.login_timeout)) as grace:
            grace.shield = True
            ended = await sessions.end_all("shutdown", ErrorCode.SERVER_SHUTDOWN, "server is shutting down")
            log.info("shutdown: ended %s", plural(ended, "session"))
            self.bus.close_log()
            await running.writer.done.wait()
            # Observers get every shutdown event before their own server_shutdown.
            while self.bus.undelivered():
                await trio.sleep(0.01)
            if self.workers is not None:
                # The gateways and observers the edges relay first, so they end with this server_shutdown;
                # the edges' links last. The root stops the edges once this core has exited (they close their
                # users then: every session is logged `shutdown` already).
                links = self.workers.is_link
                for peer in [p for p in self._peers if not links(p)]:
                    peer.close(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")
                while any(not links(p) for p in self._peers):
                    await trio.sleep(0.01)
            for peer in list(self._peers):
                peer.close(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")
            # Let every logged-in connection send its server_shutdown frame and close (each send is bounded
            # by SEND_ERROR_TIMEOUT): cancelling the nursery while a gateway's or observer's task is still
            # unwinding its own cancel scope would skip its goodbye. Connections still logging in are not
            # waited for; they are cancelled below.
            while any(self.connections[role] for role in ("user", "gateway", "observer", "standby")):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()

    # -- what the outside sees --------------------------------------------------------------------------

    def _count_event(self, event: PresenceEvent) -> None:
        # One labelled child per (kind, reason), looked up once: labels() costs ~2 us, on every login and expiry.
        key = (event.kind, event.reason)
        counter = self._event_counters.get(key)
        if counter is None:
            counter = self._event_counters[key] = self.metrics.presence_events.labels(kind=event.kind, reason=event.reason)
        counter.inc()
        self.vitals.on_event(event)
        peer_log.event(event)

    def _status_line(self) -> str:
        c = self.connections
        return (
            f"{len(self.running.presence)} online; connections: {plural(c['user'], 'user')}, "
            f"{plural(c['gateway'], 'gateway')}, {plural(c['observer'], 'observer')}, {plural(c['standby'], 'standby')}"
        )

    def status(self) -> dict[str, Any]:
        """The server's part of ``GET /status`` (``idled status``); read on the event loop."""
        running = self.running
        return {**self.snapshot(), "next_seq": running.presence.next_seq, "ports": list(self.ports),
                "stopping": self.stopping, "data_dir": str(self.log.directory),
                "replication": running.replicas.status(), **self.hold.status(),
                **status_part(self.config, self.workers, self.vitals, self.fence, self.budget)}

    def _sample(self, wall: float) -> Sample:
        presence = self.running.presence
        return Sample(wall, len(presence), presence.users(), dict(self.connections), presence.next_seq - 1)

    def snapshot(self) -> dict[str, Any]:
        """Sizes for the scrape-time gauges (``Metrics.register_snapshot``); read on the event loop."""
        running = self.running
        presence = running.presence
        stats = presence.detector_stats()
        return {
            "connections": dict(self.connections),
            "sessions_online": len(presence),
            "users_online": presence.users(),
            "detector_keys": stats.keys,
            "detector_overflow_keys": stats.overflow_keys,
            "observer_queued_bytes": running.observers.queued_bytes(),
            "eventlog_damaged_bytes": running.damage[0],
            "eventlog_damaged_records": running.damage[1],
            "eventlog_rolls_deferred": self.log.deferred_rolls,
            "sessions_held": len(presence.holds),
            "gateway_watermark_lag": running.lagwatch.lags(),
            "wall_clock_ahead": self.clock.wall.ahead(),
            **self.hold.snapshot(),
        }
