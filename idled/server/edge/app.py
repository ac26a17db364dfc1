"""The edge's lifecycle: reach the core, listen, serve users, reload on SIGHUP, drain on SIGTERM.

Theory of operation
-------------------
``serve()`` runs one nursery: the core link (``CoreLink.run``, reconnecting for ever -- unless, at start, the
core and this edge cannot speak: TLS on one side only, a certificate that does not verify; then the edge
exits with one line, ``idled.door.outbound``), then -- once the
core's first welcome has told the edge its parameters -- the accept loop, whose handler is the server's own
``Doorway`` with the edge's roles (the server's user loop ``run_user`` on ``EdgeUsers`` for users,
``EdgeUsers.relay`` for gateways, observers and standbys). It prints ``IDLED_LISTENING host=H port=P`` once
listening. Listeners are opened from ``--host/--port`` or adopted from inherited descriptors (``--listen-fd``,
the ``--workers`` supervisor passes the public socket to every edge and the kernel spreads the accepts).

*Accepting when full.* The limit is ``max_connections`` capped to the descriptor budget
(``idled.ops.fdbudget``; a relay counts twice). Under ``--workers`` the edges share their counts
(``idled.server.workers.occupancy``): ``max_connections`` is then the whole daemon's, and each edge is also
capped to its own budget. The accept loop is the core's (``idled.door.accept``: the spare descriptor,
``busy`` when descriptors run out anyway), with this edge as its ``Room``: when full the edge stops
accepting, so on a socket shared by several edges the kernel hands new connections to one with room; a
connection still waiting is left to them while one has room (up to ``OVERFLOW_PATIENCE``), then -- or at once
when all are full -- this edge accepts it and refuses it with ``busy``, so the client learns instead of
hanging in the backlog.

Like the core, the edge runs the stall guard's clock and the monitor task (``idled.server.runtime.monitor``: loop
lag as ``idled_event_loop_lag_seconds``, the GC policy's thaw as a hook). The link measures the core's
silence on that clock, so a pause of the edge itself (SIGSTOP, a GC walk) never counts as the core gone.

With a metrics port (``--metrics-port``) the edge serves ``/metrics`` and a ``/status`` of its own (``status``:
role ``edge``, the core it is on, its link's state, its connections, the limits in force), which ``idled
status --metrics`` prints; ``/`` is a note pointing to the core's page (an edge has no live figures of its own).

SIGTERM/SIGINT drain: stop accepting, close every user with ``server_shutdown`` (each task detaches its uid
on the link), wait for them (bounded by the grace period), send the link's pending frames and ``bye``, exit.
SIGHUP re-reads the configuration (file and environment; flags still win) and applies the log level and the
doorway's limits (``max_connections``, ``login_timeout``, ``max_frame``) and TLS certificates, as the core does
(``idled.server.roles.table``: the counts, role table, user plane, connection limit and reload they share).
"""

from __future__ import annotations

import functools
import logging
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from idled.door.accept import Shortage, accept_all
from idled.door.addresses import display
from idled.door.door import Door, client_gate, close_all, metrics_gate
from idled.door.outbound import LinkPolicy
from idled.ops.config import Config
from idled.ops.fdbudget import Budget, ConnectionLimit, edge_budget, open_file_limit
from idled.ops.gcpolicy import GcPolicy
from idled.ops.health import Health
from idled.ops.nullmetrics import NullMetrics
from idled.protocol import ErrorCode
from idled.server.edge.link import CoreLink
from idled.server.edge.users import EdgeUsers
from idled.server.roles.doorway import Doorway, auth_secret, refuse, refuse_out_of_descriptors
from idled.server.roles.table import (
    DOOR_RELOADABLE, connection_counts, connection_limit, reload_door, roles, user_plane,
)
from idled.server.runtime.clock import Clock
from idled.server.runtime.monitor import Monitor
from idled.server.runtime.reload import reload
from idled.server.runtime.signals import SIGNALS, until_stopped
from idled.server.workers.occupancy import Occupancy

if TYPE_CHECKING:  # (exporters only: a process without metrics never imports prometheus_client)
    from idled.ops.metrics import Metrics

__all__ = ["Edge", "RELOADABLE"]

log = logging.getLogger("idled.server.edge")

RELOADABLE = DOOR_RELOADABLE
GRACE = 5.0  # seconds a drain may take at most


class Edge:
    """One ``idled edge`` process (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        *,
        core: str,
        name: str,
        listen_fds: Sequence[int] = (),
        metrics: Metrics | NullMetrics | None = None,
        reload_config: Callable[[], Config] | None = None,
        link_secret: bytes | None = None,
        gc_policy: GcPolicy | None = None,
        occupancy: Occupancy | None = None,
        links: LinkPolicy | None = None,
    ) -> None:
        self.config = config
        self.occupancy = occupancy  # --workers: every edge's connection count (then max_connections is the daemon's)
        self.secret = auth_secret(config)
        self.listen_fds = tuple(listen_fds)
        self.metrics = NullMetrics() if metrics is None else metrics
        self._reload_config = reload_config
        self.clock = Clock(config.stall_ticks * config.tick)
        self.monitor = Monitor(self.clock, tick=config.tick, env={}, metrics=self.metrics)
        link = CoreLink(core, name, secret=link_secret, on_ended=self._on_ended, clock=self.clock.now,
                        wall=self.clock.wall,
                        links=LinkPolicy() if links is None else links)
        self.users = EdgeUsers(link, core)
        self.link = self.users.link
        self.connections = connection_counts()
        relay = self.users.relay
        self.plane = user_plane(self.users, self.connections, lambda code: self.doorway.reject(code))
        link.drain = self.plane.drain  # a mark is answered after what the plane let gather is read
        self.door = Door.of(config, secret=self.secret is not None, env={}, api=False)
        self.doorway = Doorway(
            config, sessions=self.users, roles=roles(self.users, gateway=relay, observer=relay, standby=relay),
            secret=self.secret, metrics=self.metrics, connections=self.connections, gate=client_gate(config),
            wall=self.clock.wall,
        )
        self.gc_policy = gc_policy  # None: the interpreter's default (tests run many edges in one process)
        self.budget: Budget | None = None  # set by _limit
        self.doorway.limit = self._limit(config.max_connections)
        self.shortage = Shortage(lambda: str(self.budget))
        self.overflow_refused = 0  # connections refused busy because every edge seemed full
        self.ports: list[int] = []
        self._accept_scope = trio.CancelScope()
        self._stop = trio.Event()

    def _on_ended(self, uids: tuple, reason: str) -> None:
        self.users.on_ended(uids, reason)

    async def serve(self, *, task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED) -> None:
        # The door first (idled.door): the rule on every endpoint, before the link or anything else starts.
        self.door.check()
        async with trio.open_nursery() as nursery:
            self.clock.start()
            hooks: list[Callable[[], object]] = [self.gc_policy.maybe_thaw] if self.gc_policy is not None else []
            if self.occupancy is not None:
                hooks.append(self._publish)
            nursery.start_soon(self.monitor.run, self._status_line, hooks)
            nursery.start_soon(self._run_link)
            nursery.start_soon(self.plane.run)
            if "metrics" in self.door.endpoints:
                metrics_listeners = await self.door.open("metrics")
                if self.metrics.registry is not None:
                    # Its own /status (the core it is on, its link, its users) beside /metrics; no live page.
                    health = Health(None, status=self.status, listening=lambda: bool(self.ports) and not self.users.stopping,
                                    secret=self.secret, wall=self.clock.wall)
                    from idled.ops.http import serve_metrics  # (an edge that exports: idled.ops.nullmetrics)

                    await nursery.start(functools.partial(serve_metrics, health=health, page=False),
                                        self.metrics.registry, metrics_listeners, metrics_gate())
                else:
                    close_all({"metrics": metrics_listeners})
            log.info("waiting for the core at %s", self.link.addresses)
            await self.link.ready.wait()
            if self.gc_policy is not None:
                # As in the core (idled.ops.gcpolicy): without it, full collections walking every user's task
                # and stream stop this loop for hundreds of ms during a login ramp, and every keepalive read
                # meanwhile reaches the core that much later. (Its thaw is the monitor's hook.)
                self.gc_policy.start()
            # The client port once the core has answered (a client is refused at once until then, not left
            # waiting in a backlog): inherited sockets (--workers) are judged, others bound.
            if self.listen_fds:
                listeners = self._listeners()
                self.door.judge(self.door.endpoints["client"], listeners)
            else:
                listeners = await self.door.open("client")
            # Signals are received from before IDLED_LISTENING on (until then the default handlers end it).
            with trio.open_signal_receiver(*SIGNALS) as signals:
                for listener in listeners:
                    host, port = listener.socket.getsockname()[:2]
                    self.ports.append(port)
                    log.info("edge listening on %s, core %s", display(host, port), self.link.address)
                    print(f"IDLED_LISTENING host={host} port={port}", file=sys.stderr, flush=True)
                nursery.start_soon(self._accept, listeners, nursery)
                task_status.started(self.ports)
                await until_stopped(self._stop, self._reload, signals, stopping="draining")
            await self._drain()
            nursery.cancel_scope.cancel()

    async def _run_link(self) -> None:
        """The core link; a configuration no core can speak at start ends the edge (one ``Fatal`` line)."""
        link = self.link
        await link.run()
        if link.mismatches:
            raise link.links.fatal_round("edge link", link.mismatches)

    def status(self) -> dict[str, Any]:
        """``/status`` of an edge (read on the event loop): its role and name, the core it is on (``leader``:
        None while the link is down), the link (``edge``), its connections and the limits in force."""
        link, cfg = self.link, self.config
        limit = ConnectionLimit.of(cfg.max_connections, self.budget)
        error = link.last_error
        part = {"cores": link.addresses, "core": link.welcomed_by, "link": "up" if link.connected else "down",
                "logins": link.connections, "users": link.live, "attaching": link.attaches_in_flight,
                "last_error": None if error is None else str(error)}
        return {"role": "edge", "name": link.name, "leader": link.welcomed_by if link.connected else None,
                "edge": part, "connections": dict(self.connections), "ports": list(self.ports),
                "stopping": self.users.stopping,
                "config": {**limit.fields(), "login_timeout": cfg.login_timeout, "max_frame": cfg.max_frame,
                           "auth": self.secret is not None, "tls": cfg.tls_cert is not None,
                           "proxy_protocol": cfg.proxy_protocol}}

    def _status_line(self) -> str:
        return f"{self.connections['user']} users; core link {'up' if self.link.connected else 'down'}"

    def _listeners(self) -> list[trio.SocketListener]:
        listeners = []
        for fd in self.listen_fds:
            sock = socket.socket(fileno=fd)
            listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        return listeners

    def _limit(self, max_connections: int) -> int:
        """``max_connections`` capped to the descriptor budget (``idled.ops.fdbudget``), with a warning."""
        self.budget = edge_budget(open_file_limit(), len(self.listen_fds))
        # --workers: max_connections is the daemon's (checked in full()), this edge's own limit its budget.
        return connection_limit(max_connections, self.budget, log, shared=self.occupancy is not None)

    # -- the accept loop's Room (idled.door.accept): pause when full, so a shared socket's connections go to
    # an edge with room

    def _held(self) -> int:
        """Descriptors of connections: every connection, a relay twice (it holds a second one)."""
        return sum(self.connections.values()) + self.users.relays

    def _publish(self) -> None:
        if self.occupancy is not None:
            self.occupancy.publish(self._held())

    def full(self) -> bool:
        """At this edge's limit, or (``--workers``) the daemon holds ``max_connections`` over all its edges."""
        held = self._held()
        if self.occupancy is None:
            return held >= self.doorway.limit
        self.occupancy.publish(held)
        return held >= self.doorway.limit or self.occupancy.total() >= self.config.max_connections

    def elsewhere(self) -> bool:
        """Another edge of this daemon has room (see ``idled.server.workers.occupancy``)."""
        occupancy = self.occupancy
        return (occupancy is not None and occupancy.total() < self.config.max_connections
                and occupancy.elsewhere(self.doorway.limit))

    def enter(self) -> None:
        self.connections["pending"] += 1  # the doorway is told so (handle(counted=True))

    async def overflow(self, stream: trio.SocketStream) -> None:
        """A connection still waiting when every edge is full: it takes the slot of this edge's oldest connection
        not logged in yet (idled.door.gate), or, when every one has logged in, is refused busy."""
        if self.doorway.gate.waiting:  # the doorway's gate evicts the oldest of them for it (it is over the limit)
            self.enter()
            await self.doorway.handle(stream, counted=True)
            return
        self.overflow_refused += 1
        await refuse(stream)

    async def _accept(self, listeners: list[trio.SocketListener], handlers: trio.Nursery) -> None:
        handle = functools.partial(self.doorway.handle, counted=True)
        with self._accept_scope:
            await accept_all(listeners, handle, handlers, refuse_out_of_descriptors, self.shortage, self)

    def stop(self) -> None:
        self._stop.set()

    async def _drain(self) -> None:
        self.users.stopping = True
        self._accept_scope.cancel()
        with trio.move_on_after(GRACE) as grace:
            grace.shield = True
            closed = self.users.close_all(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")
            # Users and logins in progress only: relayed gateways, observers and standbys are the core's peers, ended
            # by the core (under --workers it closes them before it exits and the root stops the edges); a relay still open
            # after the link's bye is cut when the nursery is cancelled.
            while self.connections["user"] or self.connections["pending"]:
                await trio.sleep(0.01)
            await self.link.close()
            log.info("drained: closed %d users", closed)

    def _reload(self) -> None:
        """SIGHUP (``idled.server.runtime.reload``); the supervisor, not the edge, tells systemd."""
        reload(self.config, self._reload_config, RELOADABLE, self._apply, log)

    def _apply(self, config: Config) -> None:
        previous, self.config = self.config, config
        reload_door(self.doorway, previous, config, self._limit)
