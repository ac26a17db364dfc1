"""What one load-test run shares between the coordinator's tasks: plan, matcher, workers, samples, series.

`RunState` is built before the server is touched (the plan is fixed by the seed) and filled while the run
goes: `on_event` feeds the matcher from the observer (it runs for every event, so it stays one call),
`record_sample` appends one row of the time series per second, and `scrape` keeps the server's running
stall maximum. Nothing here sleeps except `scrape`, whose HTTP GET runs in a thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TextIO

import psutil
import trio

from idled.protocol import Event
from idled.tools.loadtest.pool import WorkerPool
from idled.tools.loadtest.scenario import Scenario
from idled.tools.loadtest.stats import Matcher, Plan, make_plan
from idled.tools.loadtest.target import STALL_METRIC, Sample, scrape_metrics

__all__ = ["RunState", "SERIES"]

SERIES = ("t", "connections", "sessions", "pinging", "pings_per_s", "online_events", "offline_events",
          "pinger_offlines", "server_cpu_percent", "server_rss_bytes", "stall_max_seconds", "host_cpu_percent",
          "client_cpu_percent")


class RunState:
    """One scenario against one server: the state the coordinator's tasks share."""

    def __init__(self, sc: Scenario, err: TextIO) -> None:
        self.sc = sc
        self.err = err
        self.plan: Plan = make_plan(sc.sessions, silent_fraction=sc.silent_fraction,
                                    bye_fraction=sc.bye_fraction, window=sc.window(), seed=sc.seed,
                                    late_fraction=sc.late_fraction, devices=sc.devices)
        self.matcher = Matcher(self.plan, sc.uid_base)
        self.secret: bytes | None = None
        if sc.secret_file:
            from idled.protocol.tokens import load_secret

            self.secret = load_secret(sc.secret_file)
        self.pool = WorkerPool(sc, self.plan, self.matcher, self.secret)
        self.samples: list[Sample] = []
        self.client_samples: list[tuple[float, float]] = []  # (wall, cpu seconds of coordinator + workers)
        self.series: dict[str, list[Any]] = {k: [] for k in SERIES}
        self.t0 = 0.0
        self.stall: float | None = None
        self.stall_at_ramp_end: float | None = None
        self.metrics_end: dict[str, float] = {}
        self.ramp_done_at: float | None = None
        self.observer_delay: Callable[[], float | None] | None = None
        self.notes: list[str] = []

    def token(self, role: str, name: str) -> str | None:
        if self.secret is None:
            return None
        from idled.protocol.tokens import mint

        return mint(self.secret, role, name, time.time() + 86400)

    def on_event(self, ev: Event) -> None:
        self.matcher.event(ev.kind, ev.uid, ev.ts, ev.reason, ev.deadline, ev.last_seen)

    def say(self, text: str) -> None:
        if not self.sc.quiet:
            print(text, file=self.err, flush=True)

    # -- sampling --

    @staticmethod
    def host_cpu() -> float:
        """Whole-machine CPU use since the previous call, 0..100 (all cores): is the host saturated?"""
        return float(psutil.cpu_percent(interval=None))

    def client_cpu(self) -> float:
        """CPU seconds used so far by the coordinator and its workers."""
        total = 0.0
        for pid in [os.getpid()] + [s.pid for s in self.pool.workers]:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    async def scrape(self, port: int | None) -> dict[str, float] | None:
        """The server's idled_* metrics (None if it has no metrics port or does not answer)."""
        if not port:
            return None
        try:
            metrics = await trio.to_thread.run_sync(scrape_metrics, port, "127.0.0.1", 5.0, abandon_on_cancel=True)
        except (OSError, ValueError):
            return None
        if STALL_METRIC in metrics:
            self.stall = metrics[STALL_METRIC]
        return metrics

    def record_sample(self, sample: Sample | None, now: float, prev: dict[str, Any]) -> dict[str, Any]:
        """Append one row of the time series; returns what the next call needs as `prev`."""
        tot = self.pool.totals()
        dt = now - prev.get("wall", now)
        pings_rate = (tot["pings"] - prev.get("pings", 0)) / dt if dt > 0 else 0.0
        sessions = tot["conns"] if self.sc.mode == "users" else tot["pinging"]
        client = self.client_samples
        row = {
            "t": round(now - self.t0, 3), "connections": tot["conns"], "sessions": sessions,
            "pinging": tot["pinging"], "pings_per_s": round(pings_rate, 2),
            "online_events": self.matcher.online_events, "offline_events": self.matcher.offline_events,
            "pinger_offlines": self.matcher.pinger_offlines,
            "server_cpu_percent": None if sample is None else round(sample.cpu_percent, 2),
            "server_rss_bytes": None if sample is None else sample.rss,
            "stall_max_seconds": self.stall, "host_cpu_percent": round(self.host_cpu(), 1),
            "client_cpu_percent": (
                round((client[-1][1] - client[-2][1]) / (client[-1][0] - client[-2][0]) * 100.0, 1)
                if len(client) >= 2 and client[-1][0] > client[-2][0] else None),
        }
        for key, value in row.items():
            self.series[key].append(value)
        if self.ramp_done_at is None and tot["ramp_done"]:
            self.ramp_done_at = now
        return {"wall": now, "pings": tot["pings"], "tot": tot, "sessions": sessions, "rate": pings_rate}

    def progress(self, prev: dict[str, Any], sample: Sample | None, now: float) -> str:
        """The live progress line."""
        tot = prev["tot"]
        sc = self.sc
        up = f"conns {tot['conns']}/{sc.sessions}" if sc.mode == "users" else \
            f"gw {tot['conns']}/{sc.gateways} sessions {tot['pinging']}/{sc.sessions}"
        srv = "" if sample is None else f" | server cpu {sample.cpu_percent:5.1f}% rss {sample.rss / 2**20:7.1f} MiB"
        stall = "" if self.stall is None else f" stall {self.stall * 1e3:.1f} ms"
        m = self.matcher
        errors = sum(tot["errors"].values())
        host = self.series["host_cpu_percent"][-1] if self.series["host_cpu_percent"] else None
        delay = self.observer_delay() if self.observer_delay else None
        behind = "" if delay is None or delay < 1.0 else f" (observer {delay:.1f} s behind)"
        return (f"[{now - self.t0:6.1f}s] {up} pings/s {prev['rate']:7.1f} online {m.online_events} "
                f"offline {m.offline_events}{behind} (pingers {m.pinger_offlines}) errors {errors}{srv}{stall}"
                + ("" if host is None else f" | host cpu {host:.0f}%"))
