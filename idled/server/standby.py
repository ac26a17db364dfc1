"""A standby core (``idled serve --standby-of HOST:PORT``): a read-only copy of the active core's event log.

Theory of operation
-------------------
The standby runs no presence table, no ticker and no log writer of its own: its log is written only by the
replication link (``idled.server.ha.follow.StandbyLink``), record for record as the active wrote it. What it
serves from that copy:

* observers, exactly as the active does (``idled.server.roles.observers``: ``subscribe`` live, ``from``,
  ``durable`` -- durable here meaning synced on the standby's own disk --, watchlists), fed through the
  bus's ``relay`` as records are written;
* ``query``, answered from the replicated log's open sessions (``StandbyQueries``): a user is online if its
  last durable record on the active is an ``online``; ``last_seen`` from the replicated last-seen map. So an
  answer is as old as the standby's lag, and a user online on the active for less than its fsync interval
  is not online here yet;
* ``idled events`` on its data directory (the same segment files), ``/metrics`` (the link's
  ``idled_standby_*`` gauges) and ``/status`` (its ``standby`` part).

User and gateway logins are refused with ``not_leader``, naming the active, so that clients and edges look
there. So are ``standby`` logins (no cascading: a standby replicates from the active, never from another
standby), with a reason that says so; a standby's link that meets one logs it and tries again, so a core it
follows that becomes the active (promoted, elected) is followed from then on. An observer's ``replicate`` is
``not_allowed`` here as on the active. The one place that says which role a core has is the
choice in ``idled.cli.serve`` between this class and ``idled.server.app.Server``; a promotion (later work)
stops the link (``StandbyLink`` keeps its state in one place), closes the log, and starts a ``Server`` on the
same directory, which recovers it as after any restart.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from idled.door.accept import Shortage, accept_all
from idled.door.addresses import bound_address, display
from idled.door.door import Door, Listening, client_gate, close_all, http_connections, metrics_gate
from idled.door.outbound import LinkPolicy
from idled.log.eventlog import EventLog
from idled.ops import systemd
from idled.ops.config import Config, address_setting
from idled.ops.fatal import fatal_on_log_error
from idled.ops.fdbudget import Budget, ConnectionLimit, open_file_limit
from idled.ops.health import Health
from idled.ops.http import serve_metrics
from idled.ops.metrics import Metrics
from idled.ops.nullmetrics import NullMetrics
from idled.protocol import ErrorCode, FrameDecoder, Login, ProtocolError, Query, Status, Uid, encode
from idled.protocol.address import format_address
from idled.server.engine.bus import EventBus
from idled.server.engine.queries import Queries
from idled.server.ha.follow import StandbyLink
from idled.server.roles.doorway import Connection, Doorway, auth_secret, refuse_out_of_descriptors
from idled.server.roles.observers import Observers
from idled.server.roles.table import connection_counts, connection_limit
from idled.server.runtime.clock import WallClock, floor_wall
from idled.server.runtime.signals import SIGNALS, until_stopped
from idled.server.status.overview import settings_part

__all__ = ["StandbyServer", "StandbyQueries", "StandbyCollector"]

log = logging.getLogger("idled.server.standby")

GRACE = 5.0  # seconds a shutdown may take


class StandbyQueries(Queries):
    """``query`` on a standby: from the replicated log's open sessions and last-seen map (see the module
    docstring). Devices are not known here."""

    def __init__(self, log: EventLog, bus: EventBus, first_seq: int, wall: Callable[[], float]) -> None:
        self.log, self.bus, self.first_seq, self.wall = log, bus, first_seq, wall  # no presence table on a standby

    async def answer(self, query: Query) -> bytes:
        log, wall = self.log, self.wall()
        online = {uid: log.online_since(uid) is not None for uid in query.uids}
        if not query.last_seen:
            return encode(Status(online))
        seen: dict[Uid, float | None] = {uid: (log.online_since(uid) if online[uid] else log.last_seen(uid, wall))
                                         for uid in query.uids}
        return encode(Status(online, seen, {}))


class StandbyCollector(Collector):
    """``idled_standby_*`` at scrape time, read from the link (a few attribute reads: safe from any thread)."""

    def __init__(self, link: StandbyLink) -> None:
        self.link = link

    def collect(self) -> Iterator[Metric]:
        link = self.link
        yield GaugeMetricFamily("idled_standby_lag_records", "records the active has durable and this standby "
                                "has not written yet", value=link.lag_records)
        yield GaugeMetricFamily("idled_standby_lag_seconds", "seconds since this standby last held every record "
                                "the active had reported durable (0 while it does)", value=link.lag_seconds())
        yield GaugeMetricFamily("idled_standby_connected", "1 while the replication link to the active is up",
                                value=1.0 if link.connected else 0.0)
        yield GaugeMetricFamily("idled_standby_last_seq", "the last seq in this standby's log", value=link.log.last_seq)


class _Admission:
    """The doorway's view of the standby: stopping or not."""

    def __init__(self) -> None:
        self.stopping = False

    def refuse_if_stopping(self) -> None:
        if self.stopping:
            raise ProtocolError(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")


class StandbyServer:
    """One standby daemon: ``serve()`` runs it until SIGTERM/SIGINT or ``stop()``."""

    def __init__(self, config: Config, *, metrics: Metrics | NullMetrics | None = None,
                 env: dict[str, str] | None = None, link: LinkPolicy | None = None) -> None:
        assert config.standby_of is not None
        self.config = config
        self.link_policy = link  # the process's (a node's: shared by its roles); None: made from config at start
        self.env = dict(os.environ) if env is None else env
        self.metrics = NullMetrics() if metrics is None else metrics
        self.secret = auth_secret(config)
        self.active = address_setting(config.standby_of, "standby_of")
        # Every listener through the door (idled.door): a standby serves no HTTP API.
        self.door = Door.of(config, secret=self.secret is not None, env=self.env)
        self.log = self._make_log()
        self.bus = EventBus()
        self.connections = connection_counts()
        self.admission = _Admission()
        self.wall = WallClock()  # never goes backwards; floored to the log's last ts (as a promoted core's is)
        self.tokens = WallClock(report=False)  # token expiry's: never goes backwards, never floored (server.clock)
        self.ports: list[int] = []
        self.budget: Budget | None = None  # set by serve() once the listeners are known (the link counts as one)
        self.limit = ConnectionLimit.of(config.max_connections, None)  # as configured until the budget is known
        self.link: StandbyLink | None = None
        self.observers: Observers | None = None
        self._peers: set[Connection] = set()
        self._stop_event = trio.Event()
        self._accept_scope = trio.CancelScope()
        self.stopped = trio.Event()

    def _make_log(self) -> EventLog:
        cfg = self.config
        return EventLog(cfg.resolved_data_dir(self.env), segment_bytes=cfg.segment_bytes,
                        retention_bytes=cfg.retention_bytes, retention_seconds=cfg.retention_seconds,
                        last_seen_horizon=cfg.last_seen_horizon)

    @property
    def largest_stall(self) -> float:
        return 0.0

    def stop(self) -> None:
        self._stop_event.set()

    async def serve(self, listeners: Sequence[trio.SocketListener] | Listening | None = None, *,
                    task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the active and serve observers until SIGTERM/SIGINT or ``stop()``. ``listeners``: as for
        ``Server.serve`` (None: opened through the door; a sequence: the client port's; a mapping by endpoint)."""
        try:
            # The door first, as the active core's: the rule, then every listener, before the log is read.
            self.door.check()
            opened = await self.door.open_all(listeners)
            try:
                addresses = [bound_address(listener) for listener in opened["client"]]
                self.ports = [port for _, port in addresses if port is not None]
                # As the active's: descriptors never run out under the log's (or the link's) feet.
                self.budget = Budget.of(open_file_limit(), listeners=sum(len(group) for group in opened.values()) + 1,
                                        http=http_connections(self.config, opened))
                with fatal_on_log_error(str(self.log.directory)):
                    recovery = await trio.to_thread.run_sync(self.log.recover)
                floor_wall(self.wall, recovery.last_ts, log)
                doorway = self._build()
            except BaseException:
                close_all(opened)
                raise
            async with trio.open_nursery() as nursery:
                with trio.open_signal_receiver(*SIGNALS) as signals:
                    await self._start(nursery, doorway, opened, addresses)
                    task_status.started(self.ports)
                    await until_stopped(self._stop_event, lambda: log.info("SIGHUP: a standby reloads nothing"), signals)
                await self._shutdown(nursery)
        finally:
            self.log.close()
            self.stopped.set()

    def _build(self) -> Doorway:
        first = self.log.last_seq + 1
        self.bus.start(first)
        self.bus.durable_to(self.log.durable_seq)
        self.observers = Observers(None, self.bus, self.log, first_seq=first, peers=self._peers,
                                   queries=StandbyQueries(self.log, self.bus, first, self.wall), max_watch=self.config.max_watch,
                                   replica=True)
        host, port = self.active
        self.link = StandbyLink(
            self.log, self.bus, host=host, port=port, fsync=self.config.fsync, fsync_interval=self.config.fsync_interval,
            secret=self.secret, name=f"standby-{socket.gethostname()}"[:128], reopen=self._reopen,
            make_log=self._make_log, wall=self.wall,
            policy=self.link_policy if self.link_policy is not None else LinkPolicy.of(self.config),
        )
        roles = {"uid": self._not_leader, "gateway": self._not_leader, "observer": self.observers.run,
                 "standby": self._not_leader}
        doorway = Doorway(self.config, sessions=self.admission, roles=roles, secret=self.secret, metrics=self.metrics,
                          connections=self.connections, gate=client_gate(self.config), wall=self.tokens)
        doorway.limit = connection_limit(self.config.max_connections, self.budget, log)
        self.limit = ConnectionLimit.of(self.config.max_connections, self.budget)
        return doorway

    def _reopen(self, new: EventLog, first_seq: int) -> None:
        """The link's log changed (re-sync, snapshot) or a new run of seqs began (a gap): point readers at it."""
        self.log = new
        observers = self.observers
        assert observers is not None
        observers.log = new
        observers.first_seq = first_seq
        observers.queries.log = new
        observers.queries.first_seq = first_seq

    @property
    def leader(self) -> str:
        """The active core this standby follows, as ``HOST:PORT`` (``[V6]:PORT``)."""
        return format_address(self.active)

    async def _not_leader(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        # `leader` lets clients and edges given a list of cores go straight there (docs/protocol.md).
        leader = self.leader
        if login.role == "standby":
            raise ProtocolError(ErrorCode.NOT_LEADER, f"this core is a standby of the active core at {leader}; a "
                                "standby replicates from the active, not from another standby (no cascading)",
                                leader=leader)
        raise ProtocolError(ErrorCode.NOT_LEADER, f"this core is a standby of the active core at {leader}; log in there",
                            leader=leader)

    async def _start(self, nursery: trio.Nursery, doorway: Doorway, opened: Listening,
                     addresses: list[tuple[str, int | None]]) -> None:
        link = self.link
        assert link is not None
        metrics_listeners = opened.get("metrics", [])
        if metrics_listeners and isinstance(self.metrics, Metrics):
            self.metrics.registry.register(StandbyCollector(link))
            health = Health(self.log.directory, status=self.status, listening=lambda: not self.admission.stopping,
                            secret=self.secret, wall=self.tokens)
            await nursery.start(functools.partial(serve_metrics, health=health), self.metrics.registry,
                                metrics_listeners, metrics_gate())
        else:
            close_all({"metrics": metrics_listeners})
        await nursery.start(link.run)
        shortage = Shortage(lambda: "standby")
        await nursery.start(self._accept, opened["client"], nursery, doorway, shortage)
        for host, port in addresses:
            log.info("standby of %s listening on %s", format_address(self.active), display(host, port))
            if port is not None:
                print(f"IDLED_LISTENING host={host} port={port}", file=sys.stderr, flush=True)
        systemd.notify(systemd.READY, env=self.env)

    async def _accept(self, listeners: Sequence[trio.SocketListener], handlers: trio.Nursery, door: Doorway,
                      shortage: Shortage, task_status: trio.TaskStatus[None]) -> None:
        with self._accept_scope:
            await accept_all(listeners, door.handle, handlers, refuse_out_of_descriptors, shortage, task_status=task_status)

    async def _shutdown(self, nursery: trio.Nursery) -> None:
        self.admission.stopping = True
        self._accept_scope.cancel()
        systemd.notify(systemd.STOPPING, env=self.env)
        with trio.move_on_after(GRACE) as grace:
            grace.shield = True
            for peer in list(self._peers):
                peer.close(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")
            while self.connections["observer"]:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()  # the link syncs what it wrote as it is cancelled

    def status(self) -> dict[str, Any]:
        """``/status``: the standby's part (``standby``: the link's state and lag), the leader it follows, and
        what an operator looks for first."""
        link = self.link
        return {"role": "standby", "leader": self.leader, "connections": dict(self.connections),
                "next_seq": self.log.last_seq + 1, "ports": list(self.ports), "stopping": self.admission.stopping,
                "data_dir": str(self.log.directory), "standby": link.status() if link is not None else None,
                "config": settings_part(self.config, self.limit)}
