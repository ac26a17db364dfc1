"""Per-worker metrics of ``idled serve --workers N``: one scrape of the core sees the whole daemon.

Theory of operation
-------------------
A custom collector registered on the core's registry. At scrape time it reads the workers' view (name,
pid, restarts, sessions held through that worker's link: ``idled.server.workers.edges``, from what the root shares) on the event loop -- the same hop as the snapshot
collector in ``idled.ops.metrics``, since ``/metrics`` renders in a worker thread -- then reads each live
child's CPU time and RSS with psutil off the loop. Every family carries a ``worker`` label
(``worker-0`` ...):

  idled_worker_up                      1 while the worker's process runs, 0 while it is being restarted
  idled_worker_restarts_total          restarts since the daemon (its root) started
  idled_worker_sessions                sessions the core holds through the worker's link (its users online)
  idled_worker_connections             connections the worker holds (shared occupancy: what its accept loop sees)
  idled_worker_resident_memory_bytes   RSS of the worker's current process
  idled_worker_cpu_seconds_total       user + system CPU of the worker's current process (a restart resets
                                       it, which Prometheus' rate() reads as a counter reset)

and one family without a label, ``idled_core_restarts_total``: restarts of the core by the root since the
daemon started (the edges held their users meanwhile).

The core's own process_* metrics, sessions, connections (edges count as gateways) and presence events
already cover the rest; the edges export no endpoint of their own (``--metrics-port 0``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import psutil
import trio
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["WorkerCollector"]

log = logging.getLogger("idled.server.workers.metrics")

View = list[tuple[str, int | None, int, int, int]]  # Workers.view(): name, pid, restarts, sessions, connections


class WorkerCollector(Collector):
    """Per-worker gauges and counters; ``view`` is read on the loop whose token is current at construction."""

    def __init__(self, view: Callable[[], View], core_restarts: Callable[[], int] | None = None) -> None:
        self._view = view
        self._core_restarts = core_restarts
        self._token = trio.lowlevel.current_trio_token()
        self._loop_thread = threading.get_ident()

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        return {
            "up": GaugeMetricFamily("idled_worker_up", "1 while the edge worker's process runs.", labels=["worker"]),
            "restarts": CounterMetricFamily(
                "idled_worker_restarts", "Restarts of the edge worker since the daemon started.", labels=["worker"]
            ),
            "sessions": GaugeMetricFamily(
                "idled_worker_sessions", "Sessions the core holds through the edge worker's link.", labels=["worker"]
            ),
            "connections": GaugeMetricFamily(
                "idled_worker_connections", "Connections the edge worker holds.", labels=["worker"]
            ),
            "rss": GaugeMetricFamily(
                "idled_worker_resident_memory_bytes", "Resident memory of the edge worker's process.", labels=["worker"]
            ),
            "cpu": CounterMetricFamily(
                "idled_worker_cpu_seconds", "User and system CPU time of the edge worker's current process.",
                labels=["worker"],
            ),
        }

    def describe(self) -> Iterable[Metric]:
        return [*self._families().values(), *self._core([])]

    def _core(self, value: list[int]) -> list[Metric]:
        if self._core_restarts is None:
            return []
        family = CounterMetricFamily("idled_core_restarts", "Restarts of the core by the daemon's root since it started.")
        for restarts in value:
            family.add_metric([], float(restarts))
        return [family]

    def _read(self) -> View | None:
        try:
            if threading.get_ident() != self._loop_thread:
                return trio.from_thread.run_sync(self._view, trio_token=self._token)
            return self._view()
        except trio.RunFinishedError:
            return None
        except Exception:
            log.exception("worker metrics failed")
            return None

    def collect(self) -> Iterable[Metric]:
        view = self._read()
        if view is None:
            return []
        families = self._families()
        for name, pid, restarts, sessions, connections in view:
            rss = cpu = None
            if pid is not None:
                try:
                    process = psutil.Process(pid)
                    with process.oneshot():
                        times = process.cpu_times()
                        rss, cpu = process.memory_info().rss, times.user + times.system
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pid = None  # it died between the view and now
            families["up"].add_metric([name], 0.0 if pid is None else 1.0)
            families["restarts"].add_metric([name], float(restarts))
            families["sessions"].add_metric([name], float(sessions))
            families["connections"].add_metric([name], float(connections))
            if rss is not None and cpu is not None:
                families["rss"].add_metric([name], float(rss))
                families["cpu"].add_metric([name], cpu)
        core = [self._core_restarts()] if self._core_restarts is not None else []
        return [*families.values(), *self._core(core)]
