"""Synthetic presence event logs, written with the daemon's real `EventLog` writer.

Theory of operation
-------------------
Each daemon is simulated on its own (one process per daemon, up to the CPU count) over its share of the
users (user i belongs to daemon i % D). The simulation is a heap of per-user next actions, so events come out
in time order, seqs strictly increase, and memory stays O(users) however many events are written:

* **Sessions.** A user logs in, stays a lognormal time (median 4 min), and the session ends by ``idle`` (45 %:
  the last keepalive is at the end of the activity, the offline fires at ``deadline + lateness``),
  ``closed`` (25 %), ``logout`` (20 %), ``gateway_lost`` or ``detach``. The next login follows an exponential
  gap whose mean follows a diurnal curve (busiest at 20:00 UTC, quietest at 08:00). Calibrated so that
  100,000 users x 24 h is about 10 million events.
* **Lateness** is what a tick-driven detector gives: uniform within one 1 s tick plus scheduling jitter
  (ms), plus rare loop stalls for the ``heap`` detector. Daemon d runs detector
  ``("ring-lazy", "heap", "scan", "ring-eager")[d % 4]``.
* **Flappers** (``--flappers`` of the users) have one or two bursts of 6-25 sessions of 2-45 s, 3-30 s apart.
* **Crashes** (``--crashes`` per daemon): the writer dies mid-record (half a record is written), the log is
  reopened after 5-60 s with `EventLog.recover()` -- which truncates the torn record and reports the uids
  left online -- and one ``offline``/``restart`` is appended for each, as the server does. Their users
  reconnect 1-30 s later; logins due during the outage wait for the restart.
* **Maintenance** (``--maintenance`` per daemon): a graceful stop, ``offline``/``shutdown`` for everyone,
  and a restart 5-20 s later.
* **Duplicate logins** produce no event in the daemon (newest wins, no flap), so there is nothing to write.
* **Damage** (unless ``--no-damage``): after the run, one record about 40 % into the log gets a flipped body
  byte (its CRC fails) and half a record is appended to the last segment (a torn tail).

uids: mostly ints; every 10th user a name ("user-<i>"), and every 100th (i % 100 == 1) the *string* form of
its neighbour's int uid -- ``"1000100"`` next to ``1000100`` -- so the pipeline has to keep 42 and "42" apart.
"""

from __future__ import annotations

import heapq
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Final

from idled.log.eventlog import DEFAULT_SEGMENT_BYTES, EventLog, Recovery, encode_record, list_segments

__all__ = ["GenConfig", "DaemonStats", "generate", "DETECTORS", "DEFAULT_START", "uid_for"]

DEFAULT_START: Final = 1_777_593_600.0  # 2026-05-01T00:00:00Z
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


@dataclass(frozen=True, slots=True)
class GenConfig:
    out: str
    users: int
    hours: float
    seed: int = 1
    daemons: int = 1
    start: float = DEFAULT_START
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    flappers: float = 0.005  # fraction of users
    crashes: int = 2  # per daemon
    maintenance: int = 1  # graceful restarts per daemon
    damage: bool = True
    batch: int = 2048  # events per EventLog.append

    def __post_init__(self) -> None:
        if self.users < 1 or not self.hours > 0 or self.daemons < 1:
            raise ValueError("need users >= 1, hours > 0, daemons >= 1")
        if not 0 <= self.flappers <= 1 or self.crashes < 0 or self.maintenance < 0:
            raise ValueError("need 0 <= flappers <= 1, crashes >= 0, maintenance >= 0")

    def daemon_dir(self, daemon: int) -> str:
        return self.out if self.daemons == 1 else os.path.join(self.out, f"daemon-{daemon}")


@dataclass(frozen=True, slots=True)
class DaemonStats:
    directory: str
    detector: str
    users: int
    events: int
    restart_offlines: int
    shutdown_offlines: int
    crashes: int
    truncated_bytes: int  # torn records cut off by recover() after the simulated crashes
    corrupted_seq: int | None  # the record whose body byte was flipped
    torn_tail_bytes: int
    bytes: int
    segments: int
    seconds: float


def uid_for(user: int) -> int | str:
    """The uid of user index `user` (see module docstring)."""
    if user % 100 == 1:
        return str(1_000_000 + user - 1)
    if user % 10 == 5:
        return f"user-{user}"
    return 1_000_000 + user


def _diurnal(ts: float) -> float:
    """Activity multiplier in [0.3, 1]: 1 at 20:00 UTC, 0.3 at 08:00."""
    hour = (ts % 86400.0) / 3600.0
    return 0.3 + 0.35 * (1.0 + math.cos(2.0 * math.pi * (hour - 20.0) / 24.0))


class _Daemon:
    """One daemon's simulation; `run()` writes its log and returns its stats."""

    def __init__(self, config: GenConfig, daemon: int) -> None:
        self.config = config
        self.directory = config.daemon_dir(daemon)
        self.detector = DETECTORS[daemon % len(DETECTORS)]
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
        self.pending: list[dict[str, Any]] = []
        self.log: EventLog | None = None
        self.seq = 0
        self.events = self.restarts = self.shutdowns = self.truncated = 0
        self.corrupt_target: dict[str, Any] | None = None
        self.corrupt_after = config.start + 0.4 * horizon

    # -------------------------------------------------------------------------------------- writing

    def _open(self) -> Recovery:
        # Retention off: a synthetic log keeps everything it wrote.
        log = EventLog(self.directory, segment_bytes=self.config.segment_bytes, retention_bytes=1 << 62, retention_seconds=1e12)
        recovery = log.recover()
        self.truncated += recovery.truncated_bytes
        self.seq = recovery.next_seq - 1
        self.log = log
        return recovery

    def _emit(self, kind: str, j: int, ts: float, reason: str, last_seen: float, timeout: float) -> None:
        self.seq += 1
        event = {
            "seq": self.seq, "kind": kind, "uid": self.uids[j], "ts": ts, "reason": reason,
            "last_seen": last_seen, "deadline": last_seen + timeout, "timeout": timeout, "detector": self.detector,
        }
        self.pending.append(event)
        if self.corrupt_target is None and ts >= self.corrupt_after:
            self.corrupt_target = event
        if len(self.pending) >= self.config.batch:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            assert self.log is not None
            self.log.append(self.pending)
            self.events += len(self.pending)
            self.pending = []

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
        """Emit j's online and plan its offline: the END action fires when the daemon would emit it."""
        rng = self.rng
        timeout = self.timeouts[j]
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
        self._emit("offline", j, ts, reason, last_seen, self.timeouts[j])
        self.online_since[j] = -1.0
        self._schedule_login(j, ts)

    def _outage(self, at: float, kind: str) -> None:
        rng = self.rng
        online = [j for j, since in enumerate(self.online_since) if since >= 0.0]
        for j in online:
            self.version[j] += 1  # drop their planned END from the heap
        assert self.log is not None
        if kind == "maintenance":
            for j in online:  # server.end_all(): one offline per session, same wall time
                self._emit("offline", j, at, "shutdown", self.online_since[j], self.timeouts[j])
                self.online_since[j] = -1.0
                self.shutdowns += 1
            self._flush()
            self.log.sync()
            self.log.close()
            restart = at + rng.uniform(5.0, 20.0)
            self._open()
        else:
            self._flush()
            # Die in the middle of writing a record: half of it reaches the file.
            torn = encode_record({"seq": self.seq + 1, "kind": "online", "uid": 0, "ts": at, "reason": "login",
                                  "last_seen": at, "deadline": at + 45.0, "timeout": 45.0, "detector": self.detector})
            path = self.log.active_path
            self.log.close()
            if path is not None:
                with open(path, "ab") as file:
                    file.write(torn[: len(torn) // 2])
            restart = at + rng.uniform(5.0, 60.0)
            recovery = self._open()
            for uid, record in recovery.online.items():  # what the server does before accepting connections
                j = self.index[uid]
                last_seen = record.get("last_seen", restart)
                self._emit("offline", j, restart, "restart", last_seen, record.get("timeout", self.timeouts[j]))
                self.online_since[j] = -1.0
                self.restarts += 1
        self.down_until = restart
        for j in online:
            heapq.heappush(self.heap, (restart + rng.uniform(1.0, 30.0), j, self.version[j], _LOGIN))

    # -------------------------------------------------------------------------------------- run

    def run(self) -> DaemonStats:
        started = time.perf_counter()
        config = self.config
        rng = self.rng
        self._open()  # recover() creates the directory
        # Start near steady state: the share of users a running daemon would have online reconnects within
        # a minute of the daemon starting (the usual reconnect storm); the rest log in after a residual gap.
        mean_gap = _BASE_GAP_S / _diurnal(config.start)
        p_online = _MEAN_SESSION_S / (_MEAN_SESSION_S + mean_gap)
        for j in range(len(self.users)):
            first = rng.uniform(0.0, 60.0) if rng.random() < p_online else self._gap(config.start)
            heapq.heappush(self.heap, (config.start + first, j, 0, _LOGIN))
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
            else:
                self._end_session(j, at)
        self._flush()
        assert self.log is not None
        self.log.sync()
        self.log.close()
        torn = 0
        corrupted: int | None = None
        if config.damage:
            corrupted = self._corrupt_one()
            torn = self._tear_tail()
        segments = list_segments(self.directory)
        size = sum(os.path.getsize(p) for _, p in segments)
        return DaemonStats(
            directory=self.directory, detector=self.detector, users=len(self.users), events=self.events,
            restart_offlines=self.restarts, shutdown_offlines=self.shutdowns, crashes=config.crashes,
            truncated_bytes=self.truncated, corrupted_seq=corrupted, torn_tail_bytes=torn, bytes=size,
            segments=len(segments), seconds=time.perf_counter() - started,
        )

    # -------------------------------------------------------------------------------------- damage

    def _corrupt_one(self) -> int | None:
        """Flip the last body byte of the record chosen during the run; return its seq."""
        target = self.corrupt_target
        if target is None:
            return None
        needle = encode_record(target)
        for _, path in list_segments(self.directory):
            with open(path, "r+b") as file:
                data = file.read()
                at = data.find(needle)
                if at >= 0:
                    file.seek(at + len(needle) - 1)
                    file.write(bytes([needle[-1] ^ 0xFF]))
                    return target["seq"]
        return None

    def _tear_tail(self) -> int:
        segments = list_segments(self.directory)
        if not segments:
            return 0
        record = encode_record({"seq": self.seq + 1, "kind": "offline", "uid": 0, "ts": self.end, "reason": "idle"})
        tail = record[: len(record) - 5]
        with open(segments[-1][1], "ab") as file:
            file.write(tail)
        return len(tail)


def _run_daemon(args: tuple[GenConfig, int]) -> DaemonStats:
    config, daemon = args
    return _Daemon(config, daemon).run()


def generate(config: GenConfig, *, processes: int | None = None) -> list[DaemonStats]:
    """Write every daemon's log under config.out; daemons run in parallel processes when there are several."""
    os.makedirs(config.out, exist_ok=True)
    jobs = [(config, d) for d in range(config.daemons)]
    workers = min(config.daemons, processes or os.cpu_count() or 1)
    if workers <= 1:
        return [_run_daemon(job) for job in jobs]
    import multiprocessing

    # spawn, not fork: the caller may be a process with threads (a test session running Spark).
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return pool.map(_run_daemon, jobs)
