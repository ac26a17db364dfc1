"""`idled bench`: every idle detector under the same simulated keepalive load, plus a bare dict as the floor.

Theory of operation
-------------------
Time is integer ticks (read them as seconds). For each size N one *schedule* is built before anything is
timed, and every detector (and the dict floor) is driven through exactly that schedule:

* Key ``i`` is the string ``"u<i>"``; it logs in at a real time drawn from ``(0, login_spread]``
  (default: one timeout) and then pings every ``P * U(0.75, 0.95)``, where ``P = timeout /
  pings_per_timeout`` is its keepalive period, so a live key always pings before its deadline. Logins are
  spread over a whole timeout, not one keepalive period, because that is the steady state: the lazy ring
  re-files each key about once per timeout, at a phase set by its login, and keeps that phase for several
  timeouts. A million keys logging in within one 6 s period (``--login-spread 6`` at 5 pings per timeout)
  is a reconnect storm, whose lumps the lazy ring carries on for minutes: a different benchmark, kept
  available as an option. (All at tick 0 would be an artefact: a million keys in one bucket.)
* A ``silent_fraction`` of the keys stop pinging at a random moment of the measured window, early enough
  that their deadline falls inside it. Their last real activity time is remembered.
* Real activity at time ``t`` is recorded at tick ``ceil(t)``; the schedule is one list of keys per tick
  (``touches[s]`` = keys active in ``(s-1, s]``), in a random order fixed per run, so dict lookups hit
  memory at random as they would in a server.

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
  the dict floor, which runs the identical loop with ``store = d.__setitem__``);
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
says how many passes ran in the measured window and the longest. Each detector is freed and collected
before the next.

The command exits 1 if any detector expired early, late or not at all; the performance targets are printed
but never decide the exit status (timings on a shared machine are noisy).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import sys
import textwrap
import tracemalloc
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter_ns, thread_time_ns
from typing import Any, TextIO

from idled.core.detector import DEFAULT_CHUNK, Detector
from idled.core.factory import DETECTOR_KINDS, make_detector
from idled.tools.loadtest.stats import percentile

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
DEFAULT_TIMEOUT = 30
DEFAULT_SLOTS = 30
DEFAULT_SECONDS = 60
DEFAULT_SILENT_FRACTION = 0.01
JITTER = (0.75, 0.95)  # ping interval as a fraction of the keepalive period

# Exactly the keys of one JSON row (the spec's contract with anything that reads --json).
ROW_KEYS = (
    "detector",
    "size",
    "pings_per_timeout",
    "touch_ns",
    "tick_mean_ms",
    "tick_max_ms",
    "call_max_ms",
    "cpu_ms_per_s",
    "bytes_per_key",
    "lateness_max_ticks",
    "early",
)

# Targets at TARGET_SIZE keys (from the issue), checked on the table, never on the exit status.
TARGET_SIZE = 1_000_000
TARGET_EAGER_VS_SCAN = 15.0  # scan tick_max / eager tick_max >=
TARGET_EAGER_VS_HEAP = 50.0  # heap tick_max / eager tick_max >=
TARGET_LAZY_VS_DICT = 1.5  # lazy touch_ns / dict touch_ns <=
TARGET_CALL_MAX_MS = 2.0
TARGET_BYTES_PER_KEY = 200.0

TouchFn = Callable[[Hashable, int], Any]
Clock = Callable[[], int]  # nanoseconds

# "cpu": this thread's CPU time, blind to the preemption a shared machine inflicts (the default: it measures
# the detector's work). "wall": perf_counter, what an event loop on a quiet machine would see.
CLOCKS: dict[str, Clock] = {"cpu": thread_time_ns, "wall": perf_counter_ns}


# -- the schedule -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Schedule:
    """Identical work for every detector: who logs in and who pings at each tick ``1..end``."""

    size: int
    timeout: int
    pings_per_timeout: float
    warmup: int  # ticks 1..warmup are not measured (one timeout, or the login spread if longer)
    end: int  # last tick run; ticks warmup+1..end are measured
    logins: list[list[str]]  # logins[s]: keys added at tick s
    touches: list[list[str]]  # touches[s]: keys active in (s-1, s], touched at tick s
    silent_last: dict[str, float]  # silent key -> its last real activity time
    login_end: int  # the last tick with a login

    @property
    def measured_seconds(self) -> int:
        return self.end - self.warmup

    def measured_touches(self) -> int:
        return sum(len(self.touches[s]) for s in range(self.warmup + 1, self.end + 1))


def build_schedule(
    size: int,
    *,
    timeout: int,
    pings_per_timeout: float,
    seconds: int,
    silent_fraction: float,
    seed: int,
    login_spread: float | None = None,
) -> Schedule:
    """Draw logins, pings and silences for ``size`` keys (pure Python; ~0.3 us per ping)."""
    rng = random.Random(seed)
    period = timeout / pings_per_timeout
    lo, hi = JITTER[0] * period, JITTER[1] * period
    spread = float(timeout) if login_spread is None else login_spread
    warmup = max(timeout, math.ceil(spread))
    end = warmup + seconds
    keys = [f"u{i}" for i in range(size)]
    # Silent keys stop inside the measured window, no later than end - timeout - 1 so that their deadline
    # (at most ceil(stop) + timeout) is run before the end.
    silent_ids = rng.sample(range(size), round(size * silent_fraction))
    stop_at = {i: rng.uniform(warmup, end - timeout - 1) for i in silent_ids}

    logins: list[list[str]] = [[] for _ in range(end + 1)]
    touches: list[list[str]] = [[] for _ in range(end + 1)]
    silent_last: dict[str, float] = {}
    order = list(range(size))
    rng.shuffle(order)  # touch order within a tick: random with respect to where keys live in memory
    uniform, ceil, random_ = rng.uniform, math.ceil, rng.random
    for i in order:
        key = keys[i]
        t = spread * (1.0 - random_())  # in (0, spread]: ceil(t) >= 1
        logins[ceil(t)].append(key)
        stop = stop_at.get(i, end)
        last = t
        t += uniform(lo, hi)
        while t <= stop:
            touches[ceil(t)].append(key)
            last = t
            t += uniform(lo, hi)
        if i in stop_at:
            silent_last[key] = last
    # Within a login tick, add in an order unrelated to the touch order, so no detector's dicts end up laid
    # out in the order they are touched (that would flatter every cache miss).
    for batch in logins:
        rng.shuffle(batch)
    login_end = max(s for s, batch in enumerate(logins) if batch) if size else 0
    return Schedule(
        size, timeout, pings_per_timeout, warmup, end, logins, touches, silent_last, login_end
    )


# -- timed runs --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    """One detector (or the dict floor) through one schedule."""

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
    """The per-keepalive loop, shared by every detector and the dict floor so they pay the same overhead."""
    start = clock()
    for key in batch:
        touch(key, now)
    return clock() - start


def run_floor(schedule: Schedule, *, clock: Clock = thread_time_ns) -> RunResult:
    """A plain dict prefilled with the keys, driven through the same touch loop: the cost to beat."""
    store: dict[str, int] = {}
    for s, batch in enumerate(schedule.logins):
        for key in batch:
            store[key] = s
    touch_total = 0
    gc.collect()
    gc.freeze()
    try:
        for s in range(1, schedule.end + 1):
            spent = _timed_touches(store.__setitem__, schedule.touches[s], s, clock)
            if s > schedule.warmup:
                touch_total += spent
    finally:
        gc.unfreeze()
    count = schedule.measured_touches()
    return RunResult(
        touch_ns=touch_total / max(count, 1),
        tick_mean_ms=0.0,
        tick_max_ms=0.0,
        call_max_ms=0.0,
        cpu_ms_per_s=touch_total / 1e6 / schedule.measured_seconds,
        bytes_per_key=0.0,
        lateness_max_ticks=0.0,
        early=0,
        missed=0,
        prunes=0,
    )


def run_detector(
    kind: str,
    schedule: Schedule,
    *,
    slots: int,
    chunk: int | None,
    clock: Clock = thread_time_ns,
    wake: str = "tick",
) -> tuple[RunResult, list[tuple[int, list[Hashable]]]]:
    """Drive one detector through the schedule; returns the timings and every (tick, expired keys)."""
    limit = chunk
    every_tick = wake == "tick"
    # A detector that keeps saying "due" without making progress would hang the benchmark: fail instead.
    max_calls = 1000 + 64 * (schedule.size // (chunk or schedule.size or 1) + 1) * max(
        1, math.ceil(schedule.pings_per_timeout)
    )
    touch_total = tick_total = tick_max = 0
    all_calls: list[int] = []  # every next_due/advance call of the measured window, ns
    prunes = 0
    expired_log: list[tuple[int, list[Hashable]]] = []
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
    gc.callbacks.append(on_gc)
    try:
        add, touch = detector.add, detector.touch
        next_due, advance = detector.next_due, detector.advance
        for s in range(1, schedule.end + 1):
            if s == schedule.warmup + 1:
                # A server that has run for a while holds the detector's big tables in the oldest
                # generation; without this, the first young collections of the window would still
                # traverse them (a start-up artefact, ~7 ms at 1M keys).
                gc.collect()
                started[1] = True
            for key in schedule.logins[s]:
                add(key, s)
            touch_ns = _timed_touches(touch, schedule.touches[s], s, clock)
            tick_ns = calls = 0
            call_times: list[int] = []
            # wake="tick": advance at every tick boundary, then again while something is still due.
            # wake="due": only while next_due() <= s (a tick task that sleeps until the next due bucket).
            check_first = not every_tick
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
                if calls > max_calls:
                    raise RuntimeError(f"{kind}: next_due() stays <= {s} after {max_calls} advance calls")
                heap = getattr(detector, "_heap", None)  # diagnostic peek: the heap's prune replaces its list
                start = clock()
                expired = advance(s, limit)
                spent = clock() - start
                tick_ns += spent
                call_times.append(spent)
                if expired:
                    expired_log.append((s, expired))
                if heap is not None and getattr(detector, "_heap", None) is not heap and s > schedule.warmup:
                    prunes += 1
            if s > schedule.warmup:
                touch_total += touch_ns
                tick_total += tick_ns
                tick_max = max(tick_max, tick_ns)
                all_calls.extend(call_times)
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
    return result, expired_log


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
    floor: RunResult
    results: dict[str, RunResult]


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
    say(f"[{size:,} keys] dict floor")
    floor = run_floor(schedule, clock=clock)
    results: dict[str, RunResult] = {}
    for kind in kinds:
        say(f"[{size:,} keys] {kind}: timed run")
        result, expired_log = run_detector(kind, schedule, slots=slots, chunk=chunk, clock=clock, wake=wake)
        result.early, result.missed, result.lateness_max_ticks = check_expiries(schedule, expired_log)
        del expired_log
        if memory:
            say(f"[{size:,} keys] {kind}: memory pass")
            result.bytes_per_key = measure_bytes_per_key(kind, schedule, slots=slots)
        results[kind] = result
    return SizeReport(
        size, pings_per_timeout, schedule.measured_touches(), len(schedule.silent_last), floor, results
    )


# -- output ------------------------------------------------------------------------------------------------------


def json_rows(reports: Sequence[SizeReport]) -> list[dict[str, Any]]:
    rows = []
    for report in reports:
        for kind, result in report.results.items():
            values = asdict(result)
            row = {
                "detector": kind,
                "size": report.size,
                "pings_per_timeout": _number(report.pings_per_timeout),
            }
            row.update({key: values[key] for key in ROW_KEYS if key not in row})
            rows.append(row)
    return rows


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.inf


def format_table(reports: Sequence[SizeReport], header: str) -> str:
    columns = (
        ("detector", 11, "s"),
        ("touch_ns", 9, ".1f"),
        ("tick_mean_ms", 13, ".3f"),
        ("tick_max_ms", 12, ".3f"),
        ("call_max_ms", 12, ".3f"),
        ("call_p99_ms", 12, ".3f"),
        ("cpu_ms_per_s", 13, ".2f"),
        ("bytes_per_key", 14, ".1f"),
        ("lateness_max", 13, ".3f"),
        ("early", 6, "d"),
        ("missed", 7, "d"),
    )
    lines = [header]
    for report in reports:
        lines.append("")
        lines.append(
            f"size {report.size:,}: {report.measured_touches:,} touches measured, {report.silent:,} silent keys"
        )
        lines.append(" ".join(f"{name:<{width}}" if fmt == "s" else f"{name:>{width}}" for name, width, fmt in columns))
        floor = report.floor
        lines.append(
            f"{'dict floor':<11} {floor.touch_ns:>9.1f} {'-':>13} {'-':>12} {'-':>12} {'-':>12}"
            f" {floor.cpu_ms_per_s:>13.2f} {'-':>14} {'-':>13} {'-':>6} {'-':>7}"
        )
        for kind, result in report.results.items():
            values = asdict(result)
            values["detector"] = kind
            values["lateness_max"] = result.lateness_max_ticks
            lines.append(
                " ".join(
                    f"{values[name]:<{width}{fmt}}" if fmt == "s" else f"{values[name]:>{width}{fmt}}"
                    for name, width, fmt in columns
                )
            )
        lines.extend("  " + line for line in ratio_lines(report))
    largest = max(reports, key=lambda report: report.size, default=None)
    if largest is not None:
        lines.append("")
        note = "" if largest.size == TARGET_SIZE else f" (the targets are set at {TARGET_SIZE:,} keys)"
        lines.append(f"targets at {largest.size:,} keys{note}:")
        lines.extend("  " + line for line in target_lines(largest))
    return "\n".join(lines)


def ratio_lines(report: SizeReport) -> list[str]:
    results, floor = report.results, report.floor
    lines = []
    for kind in ("ring-lazy", "ring-eager", "scan", "heap"):
        if kind in results:
            lines.append(f"{kind} touch / dict floor: {_ratio(results[kind].touch_ns, floor.touch_ns):.2f}x")
    eager = results.get("ring-eager")
    if eager is not None:
        for other in ("scan", "heap"):
            if other in results:
                ratio = _ratio(results[other].tick_max_ms, eager.tick_max_ms)
                lines.append(f"{other} tick_max / ring-eager tick_max: {ratio:.1f}x")
    if "ring-eager" in results and "ring-lazy" in results:
        cpu_e, cpu_l = results["ring-eager"].cpu_ms_per_s, results["ring-lazy"].cpu_ms_per_s
        cheaper = "ring-lazy" if cpu_l < cpu_e else "ring-eager"
        lines.append(f"cpu ring-eager / ring-lazy: {_ratio(cpu_e, cpu_l):.2f}x ({cheaper} costs less CPU)")
    if "heap" in results:
        lines.append(f"heap prunes in the measured window: {results['heap'].prunes}")
    passes = ", ".join(
        f"{kind} {result.gc_passes}" + (f" (longest {result.gc_max_ms:.2f} ms)" if result.gc_passes else "")
        for kind, result in results.items()
    )
    lines.append(f"gc passes in the measured window (charged to the call they interrupt): {passes}")
    return lines


def target_lines(report: SizeReport) -> list[str]:
    results, floor = report.results, report.floor
    lines = []

    def check(label: str, ok: bool, detail: str) -> None:
        lines.append(f"{'PASS' if ok else 'FAIL'}  {label}: {detail}")

    eager, lazy = results.get("ring-eager"), results.get("ring-lazy")
    if eager is not None and "scan" in results:
        ratio = _ratio(results["scan"].tick_max_ms, eager.tick_max_ms)
        check("ring-eager tick_max <= scan/15", ratio >= TARGET_EAGER_VS_SCAN, f"scan/eager = {ratio:.1f}x")
    if eager is not None and "heap" in results:
        ratio = _ratio(results["heap"].tick_max_ms, eager.tick_max_ms)
        check("ring-eager tick_max <= heap/50", ratio >= TARGET_EAGER_VS_HEAP, f"heap/eager = {ratio:.1f}x")
    if lazy is not None:
        ratio = _ratio(lazy.touch_ns, floor.touch_ns)
        check(
            "ring-lazy touch <= 1.5x dict floor",
            ratio <= TARGET_LAZY_VS_DICT,
            f"{lazy.touch_ns:.1f} / {floor.touch_ns:.1f} ns = {ratio:.2f}x",
        )
    for kind in ("ring-eager", "ring-lazy"):
        if kind in results:
            result = results[kind]
            check(f"{kind} call_max <= 2 ms", result.call_max_ms <= TARGET_CALL_MAX_MS, f"{result.call_max_ms:.3f} ms")
            if result.bytes_per_key:
                check(
                    f"{kind} bytes_per_key <= 200",
                    result.bytes_per_key <= TARGET_BYTES_PER_KEY,
                    f"{result.bytes_per_key:.1f}",
                )
    for kind, result in results.items():
        ok = result.exact
        check(
            f"{kind} exact",
            ok,
            f"early {result.early}, lateness_max {result.lateness_max_ticks:.3f} ticks, missed {result.missed}",
        )
    return lines


def plot(reports: Sequence[SizeReport], path: Path, title: str) -> None:
    """tick_max_ms and cpu_ms_per_s against size, log-log, one line per detector (needs idled[plot])."""
    try:
        import matplotlib
    except ImportError as error:  # optional extra: say how to get it instead of a traceback
        raise SystemExit("idled bench --plot needs matplotlib: pip install 'idled[plot]'") from error
    matplotlib.use("Agg")  # files only: never open a window
    import matplotlib.pyplot as plt

    sizes = [report.size for report in reports]
    kinds = [kind for kind in DETECTOR_KINDS if all(kind in report.results for report in reports)]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for kind in kinds:
        left.plot(sizes, [r.results[kind].tick_max_ms for r in reports], marker="o", label=kind)
        right.plot(sizes, [r.results[kind].cpu_ms_per_s for r in reports], marker="o", label=kind)
    right.plot(sizes, [r.floor.cpu_ms_per_s for r in reports], linestyle="--", color="grey", label="dict floor")
    left.set_title("worst tick (unchunked work)")
    left.set_ylabel("tick_max_ms")
    right.set_title("detector CPU per simulated second")
    right.set_ylabel("cpu_ms_per_s")
    for axes in (left, right):
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("keys")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
    figure.suptitle(textwrap.fill(title, 110), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# -- the command -------------------------------------------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError("sizes must be positive")
    return sizes


def _kinds(text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in DETECTOR_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"detectors must be among {', '.join(DETECTOR_KINDS)}")
    return kinds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", type=_sizes, default=list(DEFAULT_SIZES), help="comma-separated key counts (default: %(default)s)"
    )
    parser.add_argument(
        "--pings-per-timeout",
        type=float,
        default=1.0,
        metavar="K",
        help="keepalives each live key sends per timeout, >= 1 (default: 1)",
    )
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help="timeout in ticks (default: %(default)s)")
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS, help="ring slots (default: %(default)s)")
    parser.add_argument(
        "--seconds",
        type=int,
        default=DEFAULT_SECONDS,
        help="measured simulated seconds, after a warm-up of one timeout (default: %(default)s)",
    )
    parser.add_argument(
        "--login-spread",
        type=float,
        metavar="TICKS",
        help="keys log in over this many ticks (default: one timeout, the steady state; "
        "one keepalive period or less simulates a reconnect storm)",
    )
    parser.add_argument(
        "--silent-fraction",
        type=float,
        default=DEFAULT_SILENT_FRACTION,
        help="fraction of keys that go silent and must expire (default: %(default)s)",
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=DEFAULT_CHUNK,
        help="advance() limit, as the server uses it; 0 = unchunked (default: %(default)s)",
    )
    parser.add_argument(
        "--detectors",
        type=_kinds,
        default=list(DETECTOR_KINDS),
        help=f"comma-separated subset of {','.join(DETECTOR_KINDS)} (default: all)",
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: thread CPU time, immune to preemption on a shared machine; wall: perf_counter (default: cpu)",
    )
    parser.add_argument(
        "--wake",
        choices=("tick", "due"),
        default="tick",
        help="tick: advance at every tick boundary, then while next_due() <= now; "
        "due: only while next_due() <= now (default: tick)",
    )
    parser.add_argument("--seed", type=int, default=1, help="schedule random seed (default: %(default)s)")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass (bytes_per_key = 0)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the result rows as JSON")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="plot tick_max and CPU against size")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    k = args.pings_per_timeout
    if not (k >= 1 and math.isfinite(k)):
        print("idled bench: --pings-per-timeout must be >= 1 (else live keys would expire)", file=sys.stderr)
        return 2
    if not 1 <= args.timeout <= 100_000 or args.slots < 1 or args.chunk < 0:
        print("idled bench: --timeout, --slots must be positive and --chunk >= 0", file=sys.stderr)
        return 2
    if args.seconds < args.timeout + 2:
        print(
            f"idled bench: --seconds must be at least timeout + 2 = {args.timeout + 2} "
            "(silent keys must go silent and expire inside the measured window)",
            file=sys.stderr,
        )
        return 2
    if args.login_spread is not None and not 0 < args.login_spread <= 100_000:
        print("idled bench: --login-spread must be positive", file=sys.stderr)
        return 2
    if not 0 <= args.silent_fraction < 1:
        print("idled bench: --silent-fraction must be in [0, 1)", file=sys.stderr)
        return 2

    chunk = args.chunk or None
    spread = args.timeout if args.login_spread is None else args.login_spread
    warmup = max(args.timeout, math.ceil(spread))
    header = (
        f"idled bench: timeout {args.timeout} ticks, {args.slots} slots, {_number(k)} ping(s) per timeout, "
        f"{args.silent_fraction:.1%} silent, logins over {_number(spread)} ticks, "
        f"warm-up {warmup} + {args.seconds} measured ticks, chunk {chunk or 'none'}, {args.clock} clock, "
        f"advance {'every tick' if args.wake == 'tick' else 'only when due'}, seed {args.seed}"
    )
    reports = []
    for size in args.sizes:
        reports.append(
            bench_size(
                size,
                kinds=args.detectors,
                timeout=args.timeout,
                slots=args.slots,
                pings_per_timeout=k,
                seconds=args.seconds,
                silent_fraction=args.silent_fraction,
                chunk=chunk,
                seed=args.seed,
                login_spread=args.login_spread,
                memory=not args.no_memory,
                clock=CLOCKS[args.clock],
                wake=args.wake,
                progress=None if args.quiet else sys.stderr,
            )
        )
    print(format_table(reports, header))
    if args.json is not None:
        args.json.write_text(json.dumps(json_rows(reports), indent=2) + "\n")
    if args.plot is not None:
        plot(reports, args.plot, header.removeprefix("idled bench: "))
    exact = all(result.exact for report in reports for result in report.results.values())
    if not exact:
        print("idled bench: a detector expired a key early, late or never (see early/missed/lateness)", file=sys.stderr)
    return 0 if exact else 1
