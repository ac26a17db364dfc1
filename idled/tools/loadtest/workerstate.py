"""What a load-test worker's sessions share: configuration, counters, records, and the report they make.

`Worker` runs on one trio loop, so the counters are plain ints touched by the engine (user connections) or
the gateway tasks without locks. Records (silent, bye, failed, closed, late) accumulate between reports and
are handed over, and reset, by `report()`.

The worker also measures itself, so the run can tell the generator's cost and lag from the server's: its
own CPU seconds (``getrusage``) and its operations (logins + keepalives sent + pongs read + connections
ended) at three marks -- the start, the moment its ramp is done (every session logged in or failed), and
the stop -- plus two histograms: timer lag (how late a keepalive, a silent / bye moment or a gateway slot
ran behind its schedule) and, for the engine, the duration of each loop turn. The marks and histograms go
in every report's ``gen`` block (the histograms in the final one only).
"""

from __future__ import annotations

import os
import random
import resource
import time
from collections import Counter
from typing import Any

import trio

from idled.tools.loadtest.histogram import Histogram

__all__ = ["Worker"]


class Worker:
    """State and counters of one worker process. Everything here runs on one trio loop."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.index: int = cfg["worker"]
        self.workers: int = cfg["workers"]
        self.mode: str = cfg["mode"]
        self.host: str = cfg["host"]
        self.port: int = cfg["port"]
        self.sources: list[str] = cfg["sources"]
        self.uid_base: int = cfg["uid_base"]
        self.sessions: int = cfg["sessions"]
        self.devices: int = int(cfg.get("devices") or 1)  # users: connections per uid (session i: device i % K)
        self.keepalive: float = cfg["keepalive"]
        self.ping_every: float | None = cfg.get("ping_every")  # the interval after the ramp (None: keepalive)
        self.jitter: float = cfg["jitter"]
        self.ramp: float = cfg["ramp"]
        self.connect_timeout: float = cfg["connect_timeout"]
        # the plan arrives as (index, kind, moment) triples
        self.plan: dict[int, tuple[int, float]] = {int(i): (int(kind), float(at)) for i, kind, at in cfg["plan"]}
        self.gateways: int = cfg.get("gateways", 0)
        self.gateway_tick: float = cfg.get("gateway_tick", 0.05)
        self.late_by: float = float(cfg.get("late_by") or 0.0)  # planned late sessions: delay of one keepalive
        # a bound on the worker's own life (seconds after t0): it stops even if the coordinator never says so
        self.max_seconds: float = float(cfg.get("max_seconds") or 86400.0)
        self.secret: bytes | None = bytes.fromhex(cfg["secret"]) if cfg.get("secret") else None
        self.rng = random.Random(cfg.get("seed", 0) * 1000 + self.index)
        self.max_inflight = int(cfg.get("max_inflight", 500))
        self.inflight = trio.CapacityLimiter(self.max_inflight)
        self.name = cfg.get("name", f"loadtest-{os.getpid()}")
        self.t0 = 0.0  # trio time of the plan's moment 0
        # counters (cumulative)
        self.conns = 0  # connections logged in and open now
        self.logged_in = 0
        self.attached = 0  # gateway sessions attached
        self.pinging = 0  # sessions currently kept alive
        self.pings = 0  # session keepalives sent (pings, or uids touched)
        self.frames = 0
        self.pongs = 0
        self.ended = 0  # connections that ended after logging in (closed by the server, bye, error)
        self.lag_hist = Histogram()
        self.turn_hist = Histogram()  # engine loop turns (seconds of work between two waits)
        self.errors: Counter[str] = Counter()
        self.closes: Counter[str] = Counter()  # how silent / bye connections ended (expected)
        self.timeout: float | None = None
        self.timeouts_differ = 0
        self.ramp_done = False
        self._gateways_ramped = 0
        self.connect_hist = Histogram()
        self.login_hist = Histogram()
        # records since the last report
        self.silent_records: list[tuple[int, float]] = []
        self.bye_records: list[tuple[int, float]] = []
        self.failed_records: list[int] = []
        # pingers closed by the server: (index, send before last, last send, close time, how) -- wall clock
        self.closed_records: list[tuple[int, float, float, float, str]] = []
        # planned late sessions: (index, last send, when the delayed keepalive is planned) -- wall clock
        self.late_records: list[tuple[int, float, float]] = []
        # MQTT (no observer there): sessions accepted, and sessions the broker closed as events --
        # (index, close time, "idle" | "logout", last send + timeout, last send), wall clock
        self.online_records: list[int] = []
        self.offline_records: list[tuple[int, float, str, float, float]] = []
        # self-measurement marks: {"wall", "cpu", "ops"} at start, ramp done, stop
        self.marks: dict[str, dict[str, float]] = {}

    # -- helpers --

    @property
    def fast_from(self) -> float:
        """Trio time of the ramp's planned end, when ``ping_every`` takes over."""
        return self.t0 + self.sessions / self.ramp

    def token(self, role: str, name: str | int) -> str | None:
        if self.secret is None:
            return None
        from idled.protocol.tokens import mint  # only when auth is on

        return mint(self.secret, role, name, time.time() + 7 * 86400)

    def lag(self, late: float) -> None:
        """How late a ping or a slot ran behind its schedule (client overload): the distribution (and its max)."""
        self.lag_hist.record(late)

    def gateway_ramped(self) -> None:
        """One more gateway of this worker has attached all its sessions."""
        self._gateways_ramped += 1
        if self._gateways_ramped == len(range(self.index, self.gateways, self.workers)):
            self.set_ramp_done()

    def set_ramp_done(self) -> None:
        self.ramp_done = True
        self.mark("ramp")

    @property
    def ops(self) -> int:
        """Operations on connections so far: logins (attaches) + keepalives sent + pongs read + ends."""
        return self.logged_in + self.attached + self.pings + self.pongs + self.ended

    def mark(self, name: str) -> None:
        """Note the wall time, this process's CPU seconds and the operations so far (first call per name)."""
        if name not in self.marks:
            ru = resource.getrusage(resource.RUSAGE_SELF)
            self.marks[name] = {"wall": time.time(), "cpu": ru.ru_utime + ru.ru_stime, "ops": self.ops}

    def report(self, final: bool = False) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "t": "final" if final else "report", "worker": self.index, "wall": time.time(), "conns": self.conns,
            "logged_in": self.logged_in, "attached": self.attached, "pinging": self.pinging, "pings": self.pings,
            "frames": self.frames, "pongs": self.pongs, "lag_max": max(0.0, self.lag_hist.max), "errors": dict(self.errors),
            "closes": dict(self.closes), "timeout": self.timeout, "timeouts_differ": self.timeouts_differ,
            "ramp_done": self.ramp_done, "silent": self.silent_records, "bye": self.bye_records,
            "failed": self.failed_records, "closed": self.closed_records, "late": self.late_records,
            "online": self.online_records, "offline": self.offline_records,
            "ended": self.ended, "gen": self._gen(final),
        }
        self.silent_records, self.bye_records, self.failed_records = [], [], []
        self.closed_records, self.late_records = [], []
        self.online_records, self.offline_records = [], []
        if final:
            msg["connect_hist"] = self.connect_hist.to_dict()
            msg["login_hist"] = self.login_hist.to_dict()
        return msg

    def _gen(self, final: bool) -> dict[str, Any]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        gen: dict[str, Any] = {"cpu": ru.ru_utime + ru.ru_stime, "ops": self.ops, "marks": self.marks,
                               "counts": {"logins": self.logged_in + self.attached, "pings": self.pings,
                                          "pongs": self.pongs, "ended": self.ended}}
        if final:
            gen["lag_hist"] = self.lag_hist.to_dict()
            gen["turn_hist"] = self.turn_hist.to_dict()
        return gen
