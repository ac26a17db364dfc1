"""The standard ``process_*`` metrics, read without listing the descriptor table.

Theory of operation
-------------------
Prometheus client libraries export one family per process fact -- ``process_cpu_seconds_total``,
``process_open_fds``, ``process_max_fds``, ``process_virtual_memory_bytes``, ``process_resident_memory_bytes``,
``process_start_time_seconds`` -- and prometheus_client's ``ProcessCollector`` counts open descriptors by
listing ``/proc/self/fd``. With one descriptor per connection that listing is the whole cost of a scrape:
12.5 ms of CPU per scrape with 19,000 connections open (measured here, 20 scrapes), which at the load test's
one scrape every 5 s is 2.5 ms of CPU a second -- more than the daemon spends on 100 keepalives.

Linux 6.2 and later report a ``/proc/PID/fd`` directory's entry count as its ``st_size``, so one ``stat`` gives
the count whatever the number of descriptors. This collector emits the same families, names and help texts as
the library's, reads ``/proc/self/stat`` once, takes the soft ``RLIMIT_NOFILE`` for ``process_max_fds`` (the
value the library reads from ``/proc/self/limits``), and lists the directory only on a kernel whose
``st_size`` is 0. Where ``/proc`` is missing it emits nothing, as the library does.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from typing import Final

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ProcessStats", "open_descriptors"]

_PAGE: Final = resource.getpagesize()
_TICKS: Final = os.sysconf("SC_CLK_TCK")


def open_descriptors(proc: str = "/proc/self") -> int:
    """How many descriptors the process has open: one ``stat`` on Linux 6.2+, else a listing."""
    count = os.stat(f"{proc}/fd").st_size
    return count if count > 0 else len(os.listdir(f"{proc}/fd"))


def _boot_time(proc_root: str) -> float:
    with open(f"{proc_root}/stat", "rb") as stat:
        for line in stat:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError(f"no btime in {proc_root}/stat")


class ProcessStats(Collector):
    """``process_*`` for this process (module docstring)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._self = f"{proc_root}/self"
        try:
            self._btime: float | None = _boot_time(proc_root)
        except OSError:
            self._btime = None  # no /proc: nothing to export

    def collect(self) -> Iterable[Metric]:
        if self._btime is None:
            return []
        try:
            with open(f"{self._self}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[-1].split()
            open_fds = open_descriptors(self._self)
        except OSError:
            return []
        return [
            GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                              value=float(fields[20])),
            GaugeMetricFamily("process_resident_memory_bytes", "Resident memory size in bytes.",
                              value=float(fields[21]) * _PAGE),
            GaugeMetricFamily("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                              value=float(fields[19]) / _TICKS + self._btime),
            CounterMetricFamily("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                                value=(float(fields[11]) + float(fields[12])) / _TICKS),
            GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", value=float(open_fds)),
            GaugeMetricFamily("process_max_fds", "Maximum number of open file descriptors.",
                              value=float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])),
        ]
