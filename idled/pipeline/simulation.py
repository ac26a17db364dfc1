"""One synthetic daemon's behaviour: who logs in when, how sessions end, crashes and maintenance.

The simulation is a heap of per-user next actions ``(at, user, version, action)``, so events come out in
time order, seqs strictly increase, and memory stays O(users) however many events are written. A user's
version is bumped when an outage ends its session: the END already queued for it then no longer matches and
is dropped when popped. With a grace (`GenConfig.grace`, the daemon's ``offline_grace``), a ``closed`` end
queues a GRACE action instead of the offline: a login of the user before it fires continues the session
with no event at all (the GRACE is voided by a version bump), else the offline is written when it fires,
with its original ts and ``"grace"`` -- so its seq comes after other users' later events, as in the daemon.
The rules (session lengths, end reasons, diurnal gaps, flap bursts, lateness, what a
crash or a graceful stop emits) are described in `idled.pipeline.generate`; writing goes through a
`SyntheticLog`, so this module only decides *what* happens and *when*.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Final

from idled.pipeline.genconfig import DEVICE_NAMES, GenConfig
from idled.pipeline.synthlog import SyntheticLog

__all__ = ["DETECTORS", "uid_for", "detector_for", "DaemonSimulation"]

DETECTORS: Final = ("ring-lazy", "heap", "scan", "ring-eager")
_TICK: Final = 1.0
_MEDIAN_SESSION_S: Final = 240.0
_SESSION_SIGMA: Final = 1.1
_MAX_SESSION_S: Final = 12 * 3600.0
_BASE_GAP_S: Final = 790.0  # mean offline gap at the diurnal peak; calibrated for ~100 events/user/day
_END_REASONS: Final = ("idle", "closed", "logout", "gateway_lost", "detach")
_END_WEIGHTS: Final = (45, 25, 20, 5, 5)
_END_BOUNDS: Final = tuple(zip(_END_REASONS, [sum(_END_WEIGHTS[: i + 1]) for i in range(len(_END_WEIGHTS))]))
_END_TOTAL: Final = sum(_END_WEIGHTS)
_LOG_MEDIAN: Final = math.log(_MEDIAN_SESSION_S)
_MEAN_SESSION_S: Final = _MEDIAN_SESSION_S * math.exp(_SESSION_SIGMA**2 / 2)
_LOGIN: Final = 0
_END: Final = 1
_GRACE: Final = 2  # a closed session's grace has passed: its offline is written now, with its original ts


def uid_for(user: int) -> int | str:
    """The uid of user index `user` (see `idled.pipeline.generate`)."""
    if user % 100 == 1:
        return str(1_000_000 + user - 1)
    if user % 10 == 5:
        return f"user-{user}"
    return 1_000_000 + user


def detector_for(daemon: int) -> str:
    return DETECTORS[daemon % len(DETECTORS)]


def _diurnal(ts: float) -> float:
    """Activity multiplier in [0.3, 1]: 1 at 20:00 UTC, 0.3 at 08:00."""
    hour = (ts % 86400.0) / 3600.0
    return 0.3 + 0.35 * (1.0 + math.cos(2.0 * math.pi * (hour - 20.0) / 24.0))


class DaemonSimulation:
    """Daemon `daemon` of `config`: `run()` plays it from start to end through `log` (left closed)."""

    def __init__(self, config: GenConfig, daemon: int, log: SyntheticLog) -> None:
        self.config = config
        self.log = log
        self.detector = log.detector
        self.rng = random.Random(config.seed * 1_000_003 + daemon)
        self.users = list(range(daemon, config.users, config.daemons))
        self.uids = [uid_for(u) for u in self.users]
        self.index = {uid: j for j, uid in enumerate(self.uids)}
        rng = self.rng
        n = len(self.users)
        self.timeouts = [rng.choices((45.0, 90.0, 30.0), (70, 20, 10))[0] for _ in range(n)]
        self.version = [0] * n
        self.online_since = [-1.0] * n  # login ts while online, -1.0 while offline
        self.burst_left = [0] * n
        self.plan: list[tuple[str, float]] = [("", 0.0)] * n  # (end reason, last_seen) of the current session
        horizon = config.hours * 3600.0
        self.end = config.start + horizon
        self.bursts: dict[int, list[float]] = {}
        for j in range(n):
            if rng.random() < config.flappers:
                self.bursts[j] = sorted(config.start + rng.uniform(0.05, 0.95) * horizon for _ in range(rng.choice((1, 2))))
        outages = [(config.start + rng.uniform(0.05, 0.95) * horizon, "crash") for _ in range(config.crashes)]
        outages += [(config.start + rng.uniform(0.3, 0.7) * horizon, "maintenance") for _ in range(config.maintenance)]
        self.outages = sorted(outages)
        self.down_until = 0.0
        self.heap: list[tuple[float, int, int, int]] = []
        self.restarts = self.shutdowns = 0
        # Devices and grace draw from their own generator, so a log with them holds the same sessions as one
        # without (the main stream is untouched) -- except where a grace joins sessions.
        self.device_rng = random.Random(config.seed * 1_000_003 + daemon + 7919) if config.devices else None
        self.device: list[str | None] = [None] * n  # the device of j's current session
        self.grace = config.grace
        self.pending: dict[int, tuple[float, float]] = {}  # j -> (closed at, last_seen) while its grace runs

    def _emit(self, kind: str, j: int, ts: float, reason: str, last_seen: float, timeout: float,
              grace: float | None = None) -> None:
        self.log.emit(kind, self.uids[j], ts, reason, last_seen, timeout, self.device[j], grace)

    # -------------------------------------------------------------------------------------- behaviour

    def _gap(self, ts: float) -> float:
        return self.rng.expovariate(_diurnal(ts) / _BASE_GAP_S)

    def _lateness(self) -> float:
        rng = self.rng
        late = rng.random() * _TICK + rng.expovariate(1 / 0.003)
        if self.detector == "heap" and rng.random() < 0.001:
            late += rng.uniform(0.05, 0.15)  # the heap's periodic pruning stall
        return late

    def _schedule_login(self, j: int, after: float) -> None:
        """Plan user j's next login after a session ended (or the daemon restarted) at `after`."""
        rng = self.rng
        if self.burst_left[j] > 0:
            at = after + rng.uniform(3.0, 30.0)
        else:
            at = after + self._gap(after)
            bursts = self.bursts.get(j)
            if bursts and bursts[0] <= at:
                at = max(bursts.pop(0), after + rng.uniform(3.0, 30.0))
                self.burst_left[j] = rng.randint(6, 25)
        heapq.heappush(self.heap, (at, j, self.version[j], _LOGIN))

    def _login(self, j: int, ts: float) -> None:
        """Emit j's online and plan its offline: the END action fires when the daemon would emit it. Within a
        closed session's grace the user is still online: no event, the session goes on (`DaemonSimulation`)."""
        rng = self.rng
        timeout = self.timeouts[j]
        if self.device_rng is not None:
            self.device[j] = DEVICE_NAMES[self.device_rng.randrange(self.config.devices)]
        if self.pending.pop(j, None) is not None:
            self.version[j] += 1  # the queued GRACE action is void
        else:
            self.online_since[j] = ts
            self._emit("online", j, ts, "login", ts, timeout)
        if self.burst_left[j] > 0:
            self.burst_left[j] -= 1
            activity_end = ts + rng.uniform(2.0, 45.0)
            reason = "closed" if rng.random() < 0.65 else "gateway_lost"
        else:
            activity_end = ts + min(math.exp(_LOG_MEDIAN + _SESSION_SIGMA * rng.gauss()), _MAX_SESSION_S)
            pick = rng.random() * _END_TOTAL
            reason = _END_REASONS[-1]
            for candidate, bound in _END_BOUNDS:  # rng.choices is ~2 us; this is a few hundred ns
                if pick < bound:
                    reason = candidate
                    break
        if reason == "idle":
            # The last keepalive is the end of the activity; the detector fires after the deadline.
            last_seen = activity_end
            offline_at = last_seen + timeout + self._lateness()
        else:
            offline_at = activity_end
            last_seen = max(ts, offline_at - rng.uniform(0.0, 30.0))
        self.plan[j] = (reason, last_seen)
        heapq.heappush(self.heap, (offline_at, j, self.version[j], _END))

    def _end_session(self, j: int, ts: float) -> None:
        reason, last_seen = self.plan[j]
        if reason == "closed" and self.grace > 0:
            # The daemon's offline_grace: the offline waits; a login before it passes continues the user.
            self.pending[j] = (ts, last_seen)
            heapq.heappush(self.heap, (ts + self.grace, j, self.version[j], _GRACE))
        else:
            self._emit("offline", j, ts, reason, last_seen, self.timeouts[j])
            self.online_since[j] = -1.0
        self._schedule_login(j, ts)

    def _grace_passed(self, j: int) -> None:
        """The offline of a closed session whose grace passed: its original ts, seq from now on."""
        ended, last_seen = self.pending.pop(j)
        self._emit("offline", j, ended, "closed", last_seen, self.timeouts[j], self.grace)
        self.online_since[j] = -1.0

    def _outage(self, at: float, kind: str) -> None:
        rng = self.rng
        online = [j for j, since in enumerate(self.online_since) if since >= 0.0]
        for j in online:
            self.version[j] += 1  # drop their planned END from the heap
        if kind == "maintenance":
            for j in online:  # server.end_all(): one offline per session, same wall time
                if j in self.pending:  # its grace offline, at once, as it was
                    self._grace_passed(j)
                    continue
                self._emit("offline", j, at, "shutdown", self.online_since[j], self.timeouts[j])
                self.online_since[j] = -1.0
                self.shutdowns += 1
            self.log.stop()
            restart = at + rng.uniform(5.0, 20.0)
            self.log.open()
        else:
            self.log.crash(at)
            restart = at + rng.uniform(5.0, 60.0)
            recovery = self.log.open()
            self.pending.clear()  # a grace in progress dies with the process: recover() finds the user online
            for uid, record in recovery.online.items():  # what the server does before accepting connections
                j = self.index[uid]
                self.device[j] = record.get("device")
                last_seen = record.get("last_seen", restart)
                self._emit("offline", j, restart, "restart", last_seen, record.get("timeout", self.timeouts[j]))
                self.online_since[j] = -1.0
                self.restarts += 1
        self.down_until = restart
        for j in online:
            heapq.heappush(self.heap, (restart + rng.uniform(1.0, 30.0), j, self.version[j], _LOGIN))

    # -------------------------------------------------------------------------------------- run

    def _start(self) -> None:
        """Open the log and queue every user's first login."""
        config = self.config
        rng = self.rng
        self.log.open()  # recover() creates the directory
        # Start near steady state: the share of users a running daemon would have online reconnects within
        # a minute of the daemon starting (the usual reconnect storm); the rest log in after a residual gap.
        mean_gap = _BASE_GAP_S / _diurnal(config.start)
        p_online = _MEAN_SESSION_S / (_MEAN_SESSION_S + mean_gap)
        for j in range(len(self.users)):
            first = rng.uniform(0.0, 60.0) if rng.random() < p_online else self._gap(config.start)
            heapq.heappush(self.heap, (config.start + first, j, 0, _LOGIN))

    def run(self) -> None:
        """Play every action due before the end, then stop the log gracefully."""
        self._start()
        rng = self.rng
        outages = list(self.outages)
        heap = self.heap
        version = self.version
        end = self.end
        while heap:
            at, j, ver, action = heapq.heappop(heap)
            if ver != version[j]:
                continue
            if at >= end:
                break
            if outages and at >= outages[0][0]:
                heapq.heappush(heap, (at, j, ver, action))
                outage_at, kind = outages.pop(0)
                self._outage(outage_at, kind)
                continue
            if action == _LOGIN:
                if at < self.down_until:
                    heapq.heappush(heap, (self.down_until + rng.uniform(0.0, 30.0), j, ver, _LOGIN))
                else:
                    self._login(j, at)
            elif action == _END:
                self._end_session(j, at)
            else:
                self._grace_passed(j)
        self.log.stop()
