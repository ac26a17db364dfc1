"""The machinery of `idled bench`: every idle detector under the same simulated keepalive load, plus a bare dict as the floor.

Theory of operation
-------------------
Time is integer ticks (read them as seconds). For each size N one *schedule* is built before anything is
timed, and every detector (and each floor) is driven through exactly that schedule:

(`idled.tools.bench.schedule`, which says how keys log in, ping and fall silent).

Simulated tick ``s`` then runs: add the keys logging in at ``s``; touch every key of ``touches[s]`` with
``touch(key, s)`` (one clock reading around the batch); then the server's tick task -- ``advance(s,
limit=chunk)`` at the tick boundary, then again while ``next_due() <= s`` -- timing each call. A warm-up of
one timeout (or of the login spread, if longer) is run untimed, then ``--seconds`` measured ticks.

Why advance at *every* tick boundary (``--wake tick``) rather than only when ``next_due()`` says so
(``--wake due``): the wheel files a deadline relative to its own clock, which moves only in ``advance``.
If a tick passes without one, the next touches land one tick beyond the ring, in the overflow level, and
come back as a cascade later: at 100k keys that was an 88 ms tick at the first due bucket. ``--wake due``
keeps that behaviour measurable.

The clock (``--clock``) is this thread's CPU time by default (``thread_time_ns``, ~0.7 us a reading): on a
shared machine a wall clock charges the detector for every time slice another process takes, which swamps
sub-millisecond figures (a 4 ms preemption inside a 0.4 ms chunk). ``--clock wall`` (``perf_counter_ns``)
gives what an event loop sees on a quiet machine. Reported per detector and size:

* ``touch_ns``: measured touch time / measured touches (the loop's own iteration is included, the same for
  the two floors, which run the identical loop: the *dict floor* with ``store = d.__setitem__``, one C call
  and one cache miss per key at 1M keys; the *record floor* (``RecordFloor``) with a Python method doing
  ``entries[key].tick = now`` over one ``Entry`` per key -- the least a one-record detector's keepalive can
  cost: the wheel's call shape, the lookup and the store into the record, two misses);
* ``tick_mean_ms`` / ``tick_max_ms``: all the detector work of one tick, i.e. the sum of that tick's
  ``next_due`` and ``advance`` calls. It is measured with the chunked calls, so it is the unchunked work plus
  the small per-chunk overhead (``--chunk 0`` runs truly unchunked to compare); the max is the stall an
  unchunked tick would cause in an event loop;
* ``call_max_ms``: the longest single ``advance`` *or* ``next_due`` call (both hold the event loop; the
  heap's ``next_due`` pops stale entries and is not bounded by the chunk). The table adds ``call_p99_ms``:
  a max is one sample, and on a shared machine one unlucky sample;
* ``cpu_ms_per_s``: (measured touch time + measured tick time) / measured seconds;
* ``bytes_per_key``: a separate, untimed pass under ``tracemalloc`` (which slows allocation): the logins,
  then one full timeout of pings and ticks so buckets are spread as in steady state; the largest
  traced size at a tick end after the last login, over N. The key strings exist before tracing starts and
  are not counted; tick numbers are small cached ints;
* ``lateness_max_ticks``: max over silent keys of expiry tick - (last real activity + timeout); the contract
  says it lies in ``[0, 1]``;
* ``early``: expiries of a live key, of a silent key before its deadline tick, or of a key twice (must be 0);
  ``missed`` (table only): silent keys never expired although their deadline passed (must be 0).

Garbage collection: before each timed run ``gc.collect(); gc.freeze()`` moves the schedule and everything
else already alive into the permanent generation, so a full collection triggered during the run does not
rescan millions of schedule entries (a benchmark artefact). At the end of the warm-up one untimed
``gc.collect()`` moves the detector's own long-lived tables to the oldest generation, as in a server that has
been up for a while. The collector stays *enabled*: collections triggered by a detector's own allocations
(the heap's tuples) are its real cost in a server and are charged to the call they interrupt; the table
says how many passes ran in the measured window and the longest. The benchmark's own record of what expired
(``ExpiryLog``) is made before the freeze and never adds a young container, so no pass is the benchmark's
own doing. Each detector is freed and collected before the next.

Best of two: every timed run is made twice (``REPEATS``; the floors too), through the same schedule, and
each figure is the better of the two -- for ``call_max_ms``/``call_p99_ms`` call by call: the two runs make
the same calls with the same work, so the k-th call's time is the lesser of its two timings. A stall of the
detector's own (a dict growth, a collector pass its allocations cause) recurs in both runs at the same call;
what other processes do to a shared machine (cache and memory-bandwidth contention, which a CPU clock does
not exclude) rarely hits the same call twice. Measured at 1M keys, lazy ring: calls of 0.8-5.3 ms (no
system time, page faults or context switches in them; three in a row at one tick) in 3 of 11 runs whose
other calls peaked at 0.29-0.47 ms, each found in one run only.

The verdict (`idled.tools.bench.table`): every detector must expire exactly at every size (never early,
at most one tick late, none missed), and at the target size (1,000,000 keys) the performance targets must
pass; `idled bench` exits 3 when one FAILED. Below the target size the performance targets are shown but
not judged (the ratios they bound grow with the number of keys).
"""

from __future__ import annotations

import gc
import itertools
import math
import tracemalloc
from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns, thread_time_ns
from typing import Any, TextIO

from idled.core.detector import Detector, Entry
from idled.core.factory import make_detector
from idled.tools.bench.schedule import Schedule, build_schedule
from idled.tools.loadtest.histogram import percentile

__all__ = [
    "DEFAULT_SIZES", "DEFAULT_TIMEOUT", "DEFAULT_SLOTS", "DEFAULT_SECONDS", "DEFAULT_SILENT_FRACTION", "CLOCKS",
    "REPEATS", "FLOORS", "RunResult", "RecordFloor", "best_of", "run_floor", "run_detector", "check_expiries",
    "measure_bytes_per_key", "SizeReport", "bench_size",
]

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
DEFAULT_TIMEOUT = 30
DEFAULT_SLOTS = 30
DEFAULT_SECONDS = 60
DEFAULT_SILENT_FRACTION = 0.01
REPEATS = 2  # timed runs of the floor and of each detector, best kept (module docstring: "Best of two")


TouchFn = Callable[[str, int], Any]  # the benchmark's keys are strings
Clock = Callable[[], int]  # nanoseconds

# "cpu": this thread's CPU time, blind to the preemption a shared machine inflicts (the default: it measures
# the detector's work). "wall": perf_counter, what an event loop on a quiet machine would see.
CLOCKS: dict[str, Clock] = {"cpu": thread_time_ns, "wall": perf_counter_ns}



# -- timed runs --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    """One detector (or a floor) through one schedule."""

    touch_ns: float
    tick_mean_ms: float
    tick_max_ms: float
    call_max_ms: float
    cpu_ms_per_s: float
    bytes_per_key: float
    lateness_max_ticks: float
    early: int
    missed: int
    prunes: int  # heap rebuilds seen in the measured window (diagnostic; 0 for other detectors)
    call_p99_ms: float = 0.0  # table only: the max is one sample, and a noisy machine inflates it
    gc_passes: int = 0  # table only: collector passes during the measured window (any generation)
    gc_max_ms: float = 0.0

    @property
    def exact(self) -> bool:
        """No key expired early or never, none later than one tick past its deadline."""
        return self.early == 0 and self.missed == 0 and self.lateness_max_ticks <= 1


def _timed_touches(touch: TouchFn, batch: list[str], now: int, clock: Clock) -> int:
    """The per-keepalive loop, shared by every detector and both floors so they pay the same overhead."""
    start = clock()
    for key in batch:
        touch(key, now)
    return clock() - start


class RecordFloor:
    """The record floor's store: one ``Entry`` per key (the wheel's record class, so the same size), and a
    touch that is a Python method storing the tick into the record -- the call shape of the wheel's bound
    ``touch``, without its work (the lookup of ``self.entries.get``, the ``None`` check). A keepalive of any
    one-record detector pays at least this: a Python call, the map lookup, the store into the record (two
    cache misses at 1M keys, where ``dict.__setitem__`` -- a C call -- has one)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def add(self, key: str, now: int) -> None:
        entry = Entry()
        entry.key, entry.tick, entry.timeout, entry.place = key, now, 0, None  # every slot set, as the wheel's
        self.entries[key] = entry

    def touch(self, key: str, now: int) -> None:
        self.entries[key].tick = now


FLOORS = ("dict floor", "record floor")


def run_floor(schedule: Schedule, *, clock: Clock = thread_time_ns, kind: str = "dict floor") -> RunResult:
    """A floor (``FLOORS``) prefilled with the keys, driven through the same touch loop: the cost to beat.
    "dict floor": a plain dict, touch = ``store.__setitem__``; "record floor": see ``RecordFloor``."""
    add: TouchFn
    touch: TouchFn
    if kind == "record floor":
        records = RecordFloor()
        add, touch = records.add, records.touch
    elif kind == "dict floor":
        store: dict[str, int] = {}
        add = touch = store.__setitem__
    else:
        raise ValueError(f"unknown floor {kind!r}")
    for s, batch in enumerate(schedule.logins):
        for key in batch:
            add(key, s)
    touch_total = 0
    gc.collect()
    gc.freeze()
    try:
        for s in range(1, schedule.end + 1):
            spent = _timed_touches(touch, schedule.touches[s], s, clock)
            if s > schedule.warmup:
                touch_total += spent
    finally:
        gc.unfreeze()
    return RunResult(
        touch_ns=touch_total / max(schedule.measured_touches(), 1), tick_mean_ms=0.0, tick_max_ms=0.0,
        call_max_ms=0.0, cpu_ms_per_s=touch_total / 1e6 / schedule.measured_seconds, bytes_per_key=0.0,
        lateness_max_ticks=0.0, early=0, missed=0, prunes=0,
    )


class ExpiryLog:
    """Every (tick, key) a run expired, kept where the collector does not look during the run.

    Made before the run's ``gc.freeze()``, its two flat containers are frozen and only grow; each call's result
    list dies at once. Kept as one young ``(tick, keys)`` tuple per call instead, the log itself made the
    collector's young passes visit thousands of cold keys (0.4-1.9 ms each at 1M keys, charged to whichever
    detector call they interrupted: the lazy ring's call_max was such a pass, not its own work)."""

    __slots__ = ("keys", "ticks")

    def __init__(self) -> None:
        self.ticks = array("q")
        self.keys: list[Hashable] = []

    def add(self, tick: int, keys: list[Hashable]) -> None:
        self.keys.extend(keys)
        self.ticks.extend(itertools.repeat(tick, len(keys)))

    def pairs(self) -> list[tuple[int, list[Hashable]]]:
        """The log as ``check_expiries`` reads it (built after the timed run)."""
        return [(tick, [key]) for tick, key in zip(self.ticks, self.keys)]


class _Ticker:
    """The server's tick task for one detector: all the detector work of one tick, each call timed."""

    def __init__(self, detector: Detector, kind: str, schedule: Schedule, *, chunk: int | None, clock: Clock,
                 wake: str) -> None:
        self.detector = detector
        self.next_due, self.advance = detector.next_due, detector.advance
        self.kind = kind
        self.limit = chunk
        self.clock = clock
        self.every_tick = wake == "tick"
        # A detector that keeps saying "due" without making progress would hang the benchmark: fail instead.
        self.max_calls = 1000 + 64 * (schedule.size // (chunk or schedule.size or 1) + 1) * max(
            1, math.ceil(schedule.pings_per_timeout)
        )

    def tick(self, s: int, call_times: list[int], expired: ExpiryLog) -> tuple[int, int]:
        """Run tick `s`: (ns spent, heap prunes seen). Appends each call's ns and what expired."""
        clock, next_due, advance = self.clock, self.next_due, self.advance
        tick_ns = calls = pruned = 0
        # wake="tick": advance at every tick boundary, then again while something is still due.
        # wake="due": only while next_due() <= s (a tick task that sleeps until the next due bucket).
        check_first = not self.every_tick
        while True:
            if check_first:
                start = clock()
                due = next_due()
                spent = clock() - start
                tick_ns += spent
                call_times.append(spent)
                if due is None or due > s:
                    break
            check_first = True
            calls += 1
            if calls > self.max_calls:
                raise RuntimeError(f"{self.kind}: next_due() stays <= {s} after {self.max_calls} advance calls")
            heap = getattr(self.detector, "_heap", None)  # diagnostic peek: the heap's prune replaces its list
            start = clock()
            keys = advance(s, self.limit)
            spent = clock() - start
            tick_ns += spent
            call_times.append(spent)
            if keys:
                expired.add(s, keys)
            if heap is not None and getattr(self.detector, "_heap", None) is not heap:
                pruned += 1
        return tick_ns, pruned


def run_detector(
    kind: str,
    schedule: Schedule,
    *,
    slots: int,
    chunk: int | None,
    clock: Clock = thread_time_ns,
    wake: str = "tick",
) -> tuple[RunResult, list[tuple[int, list[Hashable]]], list[int]]:
    """Drive one detector through the schedule; returns the timings, every (tick, expired keys), and the time
    of every call of the measured window (ns, in order: two runs through one schedule make the same calls)."""
    touch_total = tick_total = tick_max = 0
    all_calls: list[int] = []  # every next_due/advance call of the measured window, ns
    prunes = 0
    expired = ExpiryLog()  # (made before the freeze below: see ExpiryLog)
    pauses: list[int] = []  # collector passes in the measured window, ns (a diagnostic)
    started = [0, False]  # start of the current pass; whether we are in the measured window

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = clock()
        elif started[1]:
            pauses.append(clock() - started[0])

    gc.collect()
    gc.freeze()
    detector: Detector = make_detector(kind, timeout=schedule.timeout, slots=slots)
    ticker = _Ticker(detector, kind, schedule, chunk=chunk, clock=clock, wake=wake)
    gc.callbacks.append(on_gc)
    try:
        add, touch = detector.add, detector.touch
        for s in range(1, schedule.end + 1):
            measured = s > schedule.warmup
            if s == schedule.warmup + 1:
                # A server that has run for a while holds the detector's big tables in the oldest
                # generation; without this, the first young collections of the window would still
                # traverse them (a start-up artefact, ~7 ms at 1M keys).
                gc.collect()
                started[1] = True
            for key in schedule.logins[s]:
                add(key, s)
            touch_ns = _timed_touches(touch, schedule.touches[s], s, clock)
            call_times: list[int] = []
            tick_ns, pruned = ticker.tick(s, call_times, expired)
            if measured:
                touch_total += touch_ns
                tick_total += tick_ns
                tick_max = max(tick_max, tick_ns)
                all_calls.extend(call_times)
                prunes += pruned
    finally:
        gc.callbacks.remove(on_gc)
        gc.unfreeze()
    # The detector goes with this frame (or, being a cycle -- the wheel's ``touch`` is a bound method stored
    # on itself -- at the gc.collect() that every timed run and memory pass starts with).
    seconds = schedule.measured_seconds
    result = RunResult(
        touch_ns=touch_total / max(schedule.measured_touches(), 1),
        tick_mean_ms=tick_total / 1e6 / seconds,
        tick_max_ms=tick_max / 1e6,
        call_max_ms=max(all_calls, default=0) / 1e6,
        cpu_ms_per_s=(touch_total + tick_total) / 1e6 / seconds,
        bytes_per_key=0.0,
        lateness_max_ticks=0.0,
        early=0,
        missed=0,
        prunes=prunes,
        call_p99_ms=percentile(all_calls, 0.99) / 1e6,
        gc_passes=len(pauses),
        gc_max_ms=max(pauses, default=0) / 1e6,
    )
    return result, expired.pairs(), all_calls


def best_of(runs: Sequence[tuple[RunResult, list[int]]]) -> RunResult:
    """One result from timed runs of one detector through one schedule: each figure's best (see the module
    docstring). Call by call when the runs made the same calls (they do: same schedule, same work)."""
    results = [result for result, _ in runs]
    calls = [times for _, times in runs]
    if len({len(times) for times in calls}) == 1:
        per_call = [min(times) for times in zip(*calls)]
    else:  # (never seen) not the same calls: the run whose worst call was the least bad
        per_call = min(calls, key=lambda times: max(times, default=0))
    first = results[0]
    return RunResult(
        touch_ns=min(r.touch_ns for r in results),
        tick_mean_ms=min(r.tick_mean_ms for r in results),
        tick_max_ms=min(r.tick_max_ms for r in results),
        call_max_ms=max(per_call, default=0) / 1e6,
        cpu_ms_per_s=min(r.cpu_ms_per_s for r in results),
        bytes_per_key=first.bytes_per_key,
        lateness_max_ticks=first.lateness_max_ticks,
        early=first.early,
        missed=first.missed,
        prunes=first.prunes,
        call_p99_ms=percentile(per_call, 0.99) / 1e6,
        gc_passes=min(r.gc_passes for r in results),
        gc_max_ms=min(r.gc_max_ms for r in results),
    )


def check_expiries(
    schedule: Schedule, expired_log: list[tuple[int, list[Hashable]]]
) -> tuple[int, int, float]:
    """(early, missed, lateness_max_ticks) of one run against the schedule's silent keys."""
    timeout = schedule.timeout
    early = 0
    lateness_max = 0.0
    seen: set[Hashable] = set()
    for tick, keys in expired_log:
        for key in keys:
            last = schedule.silent_last.get(key)  # type: ignore[call-overload]
            if last is None or key in seen or tick < math.ceil(last) + timeout:
                early += 1  # a live key, a second expiry, or before the deadline tick
            else:
                lateness_max = max(lateness_max, tick - (last + timeout))
            seen.add(key)
    missed = sum(1 for key in schedule.silent_last if key not in seen)
    return early, missed, lateness_max


def measure_bytes_per_key(kind: str, schedule: Schedule, *, slots: int) -> float:
    """Steady-state traced memory of one detector over its keys (keys themselves not counted)."""
    if schedule.size == 0:
        return 0.0
    last_tick = min(schedule.end, schedule.login_end + schedule.timeout)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        detector = make_detector(kind, timeout=schedule.timeout, slots=slots)
        largest = 0
        for s in range(1, last_tick + 1):
            for key in schedule.logins[s]:
                detector.add(key, s)
            for key in schedule.touches[s]:
                detector.touch(key, s)
            detector.advance(s)  # every tick boundary (the default wake="tick" of the timed run)
            while (due := detector.next_due()) is not None and due <= s:
                detector.advance(s)
            if s >= schedule.login_end:
                largest = max(largest, tracemalloc.get_traced_memory()[0])
        del detector
    finally:
        tracemalloc.stop()
        gc.collect()
    return (largest - base) / schedule.size


# -- one size, all detectors -----------------------------------------------------------------------------------


@dataclass(slots=True)
class SizeReport:
    size: int
    pings_per_timeout: float
    measured_touches: int
    silent: int
    floor: RunResult  # the dict floor
    results: dict[str, RunResult]
    record_floor: RunResult


def bench_size(
    size: int,
    *,
    kinds: Sequence[str],
    timeout: int,
    slots: int,
    pings_per_timeout: float,
    seconds: int,
    silent_fraction: float,
    chunk: int | None,
    seed: int,
    login_spread: float | None,
    memory: bool,
    clock: Clock,
    wake: str,
    progress: TextIO | None,
) -> SizeReport:
    def say(message: str) -> None:
        if progress is not None:
            print(message, file=progress, flush=True)

    say(f"[{size:,} keys] building the schedule")
    schedule = build_schedule(
        size,
        timeout=timeout,
        pings_per_timeout=pings_per_timeout,
        seconds=seconds,
        silent_fraction=silent_fraction,
        seed=seed,
        login_spread=login_spread,
    )
    floors = []
    for floor_kind in FLOORS:  # best of two, as every timed run
        say(f"[{size:,} keys] {floor_kind}")
        runs_ = [run_floor(schedule, clock=clock, kind=floor_kind) for _ in range(REPEATS)]
        floors.append(min(runs_, key=lambda r: r.touch_ns))
    results: dict[str, RunResult] = {}
    for kind in kinds:
        runs: list[tuple[RunResult, list[int]]] = []
        checks: list[tuple[int, int, float]] = []
        for n in range(REPEATS):
            say(f"[{size:,} keys] {kind}: timed run {n + 1} of {REPEATS}")
            run, expired_log, calls = run_detector(kind, schedule, slots=slots, chunk=chunk, clock=clock, wake=wake)
            checks.append(check_expiries(schedule, expired_log))
            runs.append((run, calls))
            del expired_log, calls
        result = best_of(runs)
        del runs
        # Exact in every run, or reported as the worst run.
        result.early, result.missed = max(c[0] for c in checks), max(c[1] for c in checks)
        result.lateness_max_ticks = max(c[2] for c in checks)
        if memory:
            say(f"[{size:,} keys] {kind}: memory pass")
            result.bytes_per_key = measure_bytes_per_key(kind, schedule, slots=slots)
        results[kind] = result
    return SizeReport(
        size, pings_per_timeout, schedule.measured_touches(), len(schedule.silent_last), floors[0], results, floors[1]
    )

