"""Prometheus metrics for idled, over an injected registry.

Theory of operation
-------------------
:class:`Metrics` builds every collector against the ``CollectorRegistry`` it is given -- nothing
lives at module level, so tests (and two servers in one process) each use a fresh registry.
There are two kinds of metric:

* **Things that happen** -- counters and histograms the server bumps on its own paths
  (``metrics.logins.labels(role="user", result="ok").inc()``, ``metrics.offline_lateness.observe(s)``).
  prometheus-client guards each with a lock, ~0.3 us: affordable on the per-event path, and
  these never touch the per-keepalive path.

* **Sizes** -- connections by role, sessions online, keys in the detector. Mirroring them in
  gauges would cost a store on every connect, login and touch. Instead the server registers one
  snapshot callable (:meth:`Metrics.register_snapshot`) that returns a :data:`Snapshot` mapping,
  and a custom collector turns it into gauges *at scrape time*.

The snapshot must be read on the trio event loop (the presence table is not thread-safe), yet the
scrape must not run on the loop: rendering takes milliseconds, and prometheus_client's own process collector
listed ``/proc/self/fd`` to export ``process_open_fds`` -- ~21 ms with 19k fds open, ~110 ms at 100k
connections, the very stall idled exists to avoid. (``idled.ops.procstats`` now counts them with one
``stat`` where the kernel allows, and lists only on kernels before 6.2.) So
:func:`idled.ops.http.serve_metrics` renders in a worker thread (``trio.to_thread.run_sync``), and the snapshot
collector hops back onto the loop for just the snapshot call (``trio.from_thread.run_sync`` with
the token captured when the snapshot was registered). Every value in one scrape therefore comes
from one consistent loop-side snapshot, and the loop is never blocked for the file listing.
The scrape endpoint itself, and the health probes beside it, are `idled.ops.http`.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypedDict

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Gauge,
    Histogram,
    PlatformCollector,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from idled import __version__
from idled.ops.procstats import ProcessStats

__all__ = [
    "CONTENT_TYPE",
    "ROLES",
    "SNAPSHOT_KEYS",
    "Snapshot",
    "Metrics",
    "lateness_buckets",
]

log = logging.getLogger(__name__)

# generate_latest() writes the classic text format; every idled name is a legacy-valid name, so it
# is exactly version 0.0.4, which every Prometheus release parses. (Hard-coded: older
# prometheus-client releases lack the CONTENT_TYPE_PLAIN_0_0_4 constant.)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Roles a connection can have; "pending" = accepted, login not yet completed.
ROLES: tuple[str, ...] = ("user", "gateway", "observer", "standby", "pending")


class Snapshot(TypedDict, total=False):
    """What the snapshot callable returns. Every key is optional; a missing key omits its metric.

    connections             role -> open connections (roles in ROLES; a missing role reads as 0)
    sessions_online         sessions currently online (logged in, not yet timed out): one per session key, so a
                            user online on several devices counts several times
    users_online            users currently online: with a live session, or waiting out offline_grace
    detector_keys           keys (uids) tracked by the detector, ring plus overflow
    detector_overflow_keys  of those, keys parked in the overflow wheel (deadline beyond the ring)
    observer_queued_bytes   bytes held for observers beyond the shared event window (replies, watchlist queues)
    eventlog_damaged_bytes  damaged bytes the last recovery skipped in place or quarantined
    eventlog_damaged_records  records lost to that damage (estimated)
    eventlog_rolls_deferred segment rolls put off for lack of a descriptor since the start
    eventlog_degraded       1 while the server runs degraded (its event log's disk is full), else 0
    eventlog_held_events    events not written to the event log yet (held in memory while degraded)
    sessions_held           sessions due whose owner (an edge) has not yet confirmed its users' activity up to
                            the deadline: online until it does (idled.core.watermarks)
    gateway_watermark_lag   gateway name -> seconds its watermark is behind the server clock (edges, and
                            gateways that answer marks)
    wall_clock_ahead        seconds the daemon's wall clock is ahead of the system's: slewing away a step back
                            (idled.core.wallclock); 0 in sync
    """

    connections: Mapping[str, int]
    sessions_online: int
    users_online: int
    detector_keys: int
    detector_overflow_keys: int
    observer_queued_bytes: int
    eventlog_damaged_bytes: int
    eventlog_damaged_records: int
    eventlog_rolls_deferred: int
    eventlog_degraded: int
    eventlog_held_events: int
    sessions_held: int
    gateway_watermark_lag: Mapping[str, float]
    wall_clock_ahead: float


# Scalar keys; the labelled ones ("connections", "gateway_watermark_lag") are rendered on their own.
SNAPSHOT_KEYS: tuple[str, ...] = (
    "sessions_online", "users_online", "detector_keys", "detector_overflow_keys", "observer_queued_bytes",
    "eventlog_damaged_bytes", "eventlog_damaged_records", "eventlog_rolls_deferred", "sessions_held",
    "wall_clock_ahead", "eventlog_degraded", "eventlog_held_events",
)

# Durations of work done on the event loop: a tick, a stall. 100 us .. 10 s.
_LOOP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# fdatasync: ~0.15 ms on a fast SSD, tens of ms on a busy disk, seconds when the disk is dying.
_FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Lateness in ticks: fine below one tick (where every offline should land), coarse above.
_LATENESS_TICKS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0, 3.0, 5.0, 10.0)


def lateness_buckets(tick: float) -> tuple[float, ...]:
    """Histogram bounds for offline lateness: fractions of a tick up to ten ticks (one is exactly ``tick``)."""
    if not tick > 0:
        raise ValueError(f"tick must be positive, got {tick!r}")
    # Round so a 0.1 s tick gives le="0.03", not le="0.030000000000000002".
    return tuple(float(f"{tick * ticks:.9g}") for ticks in _LATENESS_TICKS)


class _SnapshotCollector(Collector):
    """Gauges read at scrape time from the server's snapshot callable, on the event loop."""

    def __init__(self) -> None:
        self._fn: Callable[[], Mapping[str, Any]] | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._loop_thread: int | None = None

    def set_source(self, fn: Callable[[], Mapping[str, Any]], token: trio.lowlevel.TrioToken | None) -> None:
        self._fn = fn
        self._token = token
        self._loop_thread = threading.get_ident() if token is not None else None

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {
            "connections": GaugeMetricFamily(
                "idled_connections", "Open client connections by role (pending: login not completed).", labels=["role"]
            ),
            "sessions_online": GaugeMetricFamily(
                "idled_sessions_online", "Sessions currently online (one per device of a user; see idled_users_online)."
            ),
            "users_online": GaugeMetricFamily(
                "idled_users_online", "Users currently online (with a live session, or waiting out offline_grace)."
            ),
            "detector_keys": GaugeMetricFamily("idled_detector_keys", "Keys tracked by the idle detector."),
            "detector_overflow_keys": GaugeMetricFamily(
                "idled_detector_overflow_keys", "Detector keys whose deadline lies beyond the ring (overflow wheel)."
            ),
            "observer_queued_bytes": GaugeMetricFamily(
                "idled_observer_queued_bytes", "Bytes held for observers beyond the shared event window (replies, watchlist queues)."
            ),
            "eventlog_damaged_bytes": GaugeMetricFamily(
                "idled_eventlog_damaged_bytes", "Damaged bytes the last recovery skipped in place or quarantined."
            ),
            "eventlog_damaged_records": GaugeMetricFamily(
                "idled_eventlog_damaged_records", "Records the last recovery found lost to damage (estimated)."
            ),
            "eventlog_rolls_deferred": GaugeMetricFamily(
                "idled_eventlog_rolls_deferred", "Segment rolls put off for lack of a descriptor since the start."
            ),
            "eventlog_degraded": GaugeMetricFamily(
                "idled_eventlog_degraded",
                "1 while the event log cannot be written (a full disk): new work is refused, events are held in memory.",
            ),
            "eventlog_held_events": GaugeMetricFamily(
                "idled_eventlog_held_events", "Events not yet written to the event log (held in memory while degraded)."
            ),
            "sessions_held": GaugeMetricFamily(
                "idled_sessions_held",
                "Sessions past their deadline kept online until their edge confirms its users' activity up to it.",
            ),
            "wall_clock_ahead": GaugeMetricFamily(
                "idled_wall_clock_ahead_seconds",
                "How far the daemon's wall clock (event ts, token expiry) is ahead of the system's: a step back of "
                "the system clock, being slewed away. 0 in sync.",
            ),
            "gateway_watermark_lag": GaugeMetricFamily(
                "idled_gateway_watermark_lag_seconds",
                "How far behind the server clock a gateway's confirmed activity (its watermark) is.",
                labels=["gateway"],
            ),
        }

    def describe(self) -> Iterable[Metric]:
        # Names only: registration must not call the snapshot (it may not be registered yet).
        return list(self._families().values())

    def _read(self) -> Mapping[str, Any] | None:
        fn, token = self._fn, self._token
        if fn is None:
            return None
        try:
            if token is not None and threading.get_ident() != self._loop_thread:
                return trio.from_thread.run_sync(fn, trio_token=token)
            return fn()
        except trio.RunFinishedError:
            return None  # the loop is gone; nothing to report
        except Exception:
            # A broken snapshot must not cost the scrape every other metric.
            log.exception("metrics snapshot failed")
            return None

    def collect(self) -> Iterable[Metric]:
        snapshot = self._read()
        if snapshot is None:
            return []
        families = self._families()
        out: list[Metric] = []
        connections = snapshot.get("connections")
        if connections is not None:
            family = families["connections"]
            for role in ROLES:
                family.add_metric([role], float(connections.get(role, 0)))
            for role in sorted(set(connections) - set(ROLES)):
                family.add_metric([role], float(connections[role]))
            out.append(family)
        lags = snapshot.get("gateway_watermark_lag")
        if lags is not None:
            family = families["gateway_watermark_lag"]
            for name in sorted(lags):
                family.add_metric([name], float(lags[name]))
            out.append(family)
        for key in SNAPSHOT_KEYS:
            value = snapshot.get(key)
            if value is not None:
                families[key].add_metric([], float(value))
                out.append(families[key])
        return out


class Metrics:
    """Every idled metric, registered on ``registry``.

    Counters and histograms (bumped by the server):
      presence_events          idled_presence_events_total{kind,reason}   kind: online|offline
      frames_rejected          idled_frames_rejected_total{reason}        reason: the protocol error code
      logins                   idled_logins_total{role,result}
      detector_ticks           idled_detector_ticks_total
      tick_duration            idled_tick_duration_seconds                histogram, one observation per tick
      offline_lateness         idled_offline_lateness_seconds             histogram, offline time - deadline
      event_loop_lag           idled_event_loop_lag_seconds               histogram (use observe_loop_lag)
      event_loop_stall_max     idled_event_loop_stall_max_seconds         gauge, largest lag seen
      eventlog_records         idled_eventlog_records_total
      eventlog_bytes           idled_eventlog_bytes_total
      eventlog_fsync_duration  idled_eventlog_fsync_duration_seconds      histogram
    Constant gauges: idled_info{version,python} = 1, idled_tick_seconds = tick.
    Scrape-time gauges from the snapshot (see :class:`Snapshot`): idled_connections{role}, idled_observer_queued_bytes,
    idled_eventlog_damaged_bytes, idled_eventlog_damaged_records, idled_eventlog_rolls_deferred,
    idled_eventlog_degraded, idled_eventlog_held_events,
    idled_sessions_online, idled_detector_keys, idled_detector_overflow_keys.
    Standard collectors: process_* (process_open_fds, process_max_fds, process_resident_memory_bytes,
    process_cpu_seconds_total, ...), python_gc_*, python_info.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        tick: float,
        version: str = __version__,
        process_collectors: bool = True,
    ) -> None:
        self.registry = registry
        r = registry
        self.presence_events = Counter(
            "idled_presence_events", "Presence events emitted.", ["kind", "reason"], registry=r
        )
        self.frames_rejected = Counter(
            "idled_frames_rejected", "Frames rejected (the connection is closed), by error code.", ["reason"], registry=r
        )
        self.logins = Counter("idled_logins", "Login attempts by role and result.", ["role", "result"], registry=r)
        self.detector_ticks = Counter("idled_detector_ticks", "Detector ticks processed.", registry=r)
        self.tick_duration = Histogram(
            "idled_tick_duration_seconds", "Time spent processing one detector tick.", buckets=_LOOP_BUCKETS, registry=r
        )
        self.offline_lateness = Histogram(
            "idled_offline_lateness_seconds",
            "How long after its deadline (last activity + timeout) each offline event fired.",
            buckets=lateness_buckets(tick),
            registry=r,
        )
        self.event_loop_lag = Histogram(
            "idled_event_loop_lag_seconds",
            "How late the event loop woke a sleeping probe task (scheduling lag).",
            buckets=_LOOP_BUCKETS,
            registry=r,
        )
        self.event_loop_stall_max = Gauge(
            "idled_event_loop_stall_max_seconds", "Largest event-loop lag seen since start.", registry=r
        )
        self.eventlog_records = Counter("idled_eventlog_records", "Records appended to the event log.", registry=r)
        self.eventlog_bytes = Counter("idled_eventlog_bytes", "Bytes appended to the event log.", registry=r)
        self.eventlog_fsync_duration = Histogram(
            "idled_eventlog_fsync_duration_seconds",
            "Duration of each event-log fsync (group commit).",
            buckets=_FSYNC_BUCKETS,
            registry=r,
        )
        self.info = Gauge("idled_info", "idled build information.", ["version", "python"], registry=r)
        self.info.labels(version=version, python=platform.python_version()).set(1)
        self.tick_seconds = Gauge("idled_tick_seconds", "Configured detector tick.", registry=r)
        self.tick_seconds.set(tick)
        self._stall_max = 0.0
        self._snapshot = _SnapshotCollector()
        r.register(self._snapshot)
        if process_collectors:
            r.register(ProcessStats())
            GCCollector(registry=r)
            PlatformCollector(registry=r)

    def register_snapshot(
        self, fn: Callable[[], Mapping[str, Any]], *, trio_token: trio.lowlevel.TrioToken | None = None
    ) -> None:
        """Make ``fn`` the source of the scrape-time gauges (keys: :data:`SNAPSHOT_KEYS`).

        Call it from inside the server's ``trio.run``: the current trio token is captured so that
        scrapes rendered in worker threads run ``fn`` back on the event loop. Outside trio (plain
        synchronous use, tests) ``fn`` is simply called wherever the scrape happens.
        Registering again replaces the previous callable.
        """
        if trio_token is None:
            try:
                trio_token = trio.lowlevel.current_trio_token()
            except RuntimeError:
                trio_token = None
        self._snapshot.set_source(fn, trio_token)

    def observe_loop_lag(self, seconds: float) -> None:
        """Record one event-loop lag sample and keep the largest-stall gauge up to date."""
        self.event_loop_lag.observe(seconds)
        if seconds > self._stall_max:
            self._stall_max = seconds
            self.event_loop_stall_max.set(seconds)

    def render(self) -> bytes:
        """The text exposition of everything in the registry (what GET /metrics returns)."""
        return generate_latest(self.registry)
