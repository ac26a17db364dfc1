"""`idled bench --growth`: the presence table grown from 0 to N sessions, every login timed on its own.

Theory of operation
-------------------
The detector benchmark (`idled.tools.bench.detectors`) times keepalives and ticks of a detector that is
already full; it never times a login. A login is where the maps grow, and a Python dict grows in one go:
when it is full, the next insertion copies every entry into a table twice as large (~30 ms at 700k entries
here), inside that one call, with the event loop stopped. Maps that always hold the same keys grow at the
same insertion (at 349,525 and 699,050 entries, ...), so their copies add up in one login. This mode
measures exactly that, through the server's own object -- ``PresenceTable`` over a detector from
``make_detector`` -- as a gateway drives it:

* N sessions (uids ``"u<i>"``, built before timing) attach at ``--login-rate`` per simulated second from
  20 owners (gateways), each with ``--keepalive`` (none: the default timeout). Every login is timed alone.
* Live sessions send a keepalive every ``0.85 x`` their keepalive period (the gateway path, ``touch_owned``),
  and at every tick boundary the tick task runs: ``expire(now, limit=chunk)`` while ``next_due() <= now``,
  each call timed. So the ramp is the server's ramp, at simulated time.
* The collector runs as in the server: ``GcPolicy`` (freeze what survives a full collection); its passes
  land in the calls they interrupt, as in the server, and are also counted on their own (the timed full
  collection below excepted).
* After the ramp: every session is touched once in a random order (``touch_ns``: the direct user
  connection's keepalive, ``touch``); then one full collection of everything, unfrozen (what the hourly
  thaw of the GC policy costs with these sessions alive); then time runs out and every session expires
  (untimed: all were touched at one instant, so they share one bucket -- a benchmark artefact), which
  checks that none is lost.
* ``bytes_per_session``: a separate untimed pass under tracemalloc: the logins alone; the uid strings
  exist before tracing and are not counted.

It uses only the presence table's and the factory's public names, so the same file can be run against
an older checkout (``PYTHONPATH=old python idled/tools/bench/growth.py``) to compare in one run.
"""

from __future__ import annotations

import gc
import math
import random
import sys
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from idled.core.factory import make_detector
from idled.core.presence import Owner, PresenceTable, Uid, ticks_for
from idled.core.timeouts import DEFAULT_MAX_TIMEOUT, DEFAULT_TICK, KEEPALIVE_FACTOR
from idled.ops.gcpolicy import GcPolicy
from idled.tools.bench.detectors import CLOCKS

__all__ = ["GrowthResult", "grow", "report_lines"]

Clock = Callable[[], int]  # nanoseconds
OWNERS = 20  # gateways the sessions are spread over (as `idled loadtest --gateways 20`)
PING_FRACTION = 0.85  # a live session pings at this fraction of its keepalive period
SLOWEST = 5  # slowest logins listed, with the session count they happened at


class _Owner:
    """A gateway, as far as the presence table is concerned: an identity (told nothing: nobody releases here)."""

    __slots__ = ()

    def release(self, uid: Uid, code: str, reason: str) -> None:
        pass


@dataclass(slots=True)
class GrowthResult:
    detector: str
    size: int
    login_us: float  # mean
    login_max_ms: float
    login_p999_ms: float
    slowest: list[tuple[int, float]]  # (sessions before the login, ms), slowest first
    touch_ns: float  # presence.touch, random order, at full size
    call_max_ms: float  # longest tick-task call (expire / next_due) during the ramp
    gc_passes: int
    gc_max_ms: float
    full_gc_ms: float  # one unfrozen full collection at full size
    expired: int
    bytes_per_session: float = 0.0


def _table(kind: str, timeout: float, slots: int) -> PresenceTable:
    tick = DEFAULT_TICK
    detector = make_detector(kind, timeout=ticks_for(timeout, tick), slots=slots)
    return PresenceTable(detector, tick=tick, timeout=timeout, max_timeout=DEFAULT_MAX_TIMEOUT, detector_name=kind)


def _tick_task(presence: PresenceTable, now: float, chunk: int | None, clock: Clock, calls: list[int]) -> int:
    """The server's tick task at ``now``: expire while something is due; returns how many expired."""
    expired = 0
    while True:
        start = clock()
        due = presence.next_due()
        calls.append(clock() - start)
        if due is None or due > now:
            return expired
        start = clock()
        expired += len(presence.expire(now, now, chunk))
        calls.append(clock() - start)


def grow(
    kind: str,
    uids: Sequence[str],
    *,
    rate: float,
    timeout: float,
    keepalive: float | None,
    slots: int,
    chunk: int | None,
    clock: Clock,
    seed: int,
) -> GrowthResult:
    """Attach every uid at ``rate`` per simulated second, then touch all, collect, and expire all."""
    presence = _table(kind, timeout, slots)
    owners = [_Owner() for _ in range(OWNERS)]
    n = len(uids)
    period = PING_FRACTION * (timeout / KEEPALIVE_FACTOR if keepalive is None else keepalive)
    logins: list[int] = []
    calls: list[int] = []
    pauses: list[int] = []
    started = [0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = clock()
        else:
            pauses.append(clock() - started[0])

    policy = GcPolicy(thaw_every=math.inf)
    policy.start()
    gc.callbacks.append(on_gc)
    try:
        login, touch_owned = presence.login, presence.touch_owned
        next_tick = 1
        for i, uid in enumerate(uids):
            now = (i + 1) / rate
            while now >= next_tick:  # the tick boundaries passed before this login: keepalives, then the tick
                _keepalives(touch_owned, uids, owners, rate, period, next_tick, i)
                _tick_task(presence, float(next_tick), chunk, clock, calls)
                next_tick += 1
            start = clock()
            login(uid, owners[i % OWNERS], now, now, keepalive)
            logins.append(clock() - start)
        end = n / rate
        touch_ns = _touch_all(presence, uids, end, clock, seed)
        gc.callbacks.remove(on_gc)
        gc.unfreeze()  # the policy's hourly thaw: the next full collection walks everything (then refreezes)
        start = clock()
        gc.collect()
        full_gc = clock() - start
        gc.callbacks.append(on_gc)
        final = ticks_for(end + presence.timeout_for(keepalive), 1.0) + 1.0  # every deadline has passed
        expired = _tick_task(presence, final, chunk, clock, [])
    finally:
        if on_gc in gc.callbacks:
            gc.callbacks.remove(on_gc)
        policy.stop()
    order = sorted(range(n), key=logins.__getitem__, reverse=True)[:SLOWEST]
    return GrowthResult(
        detector=kind,
        size=n,
        login_us=sum(logins) / max(n, 1) / 1e3,
        login_max_ms=max(logins, default=0) / 1e6,
        login_p999_ms=sorted(logins)[int(0.999 * (n - 1))] / 1e6 if n else 0.0,
        slowest=[(i, logins[i] / 1e6) for i in order],
        touch_ns=touch_ns,
        call_max_ms=max(calls, default=0) / 1e6,
        gc_passes=len(pauses),
        gc_max_ms=max(pauses, default=0) / 1e6,
        full_gc_ms=full_gc / 1e6,
        expired=expired,
    )


def _keepalives(
    touch_owned: Callable[[Uid, Owner, float], bool], uids: Sequence[str], owners: Sequence[Owner],
    rate: float, period: float, tick: int, logged_in: int,
) -> None:
    """The keepalives of the simulated second ending at ``tick``: every session whose login was a whole
    number of periods before a moment of it (untimed: the detector benchmark times keepalives)."""
    k = 1
    while tick - k * period > 0:
        low = max(0, math.ceil(((tick - 1) - k * period) * rate))
        high = min(logged_in, math.ceil((tick - k * period) * rate))
        for i in range(low, high):
            touch_owned(uids[i], owners[i % OWNERS], float(tick))
        k += 1


def _touch_all(presence: PresenceTable, uids: Sequence[str], now: float, clock: Clock, seed: int) -> float:
    """Mean ns of ``presence.touch`` over every session once, in a random order (cache misses as in a server)."""
    order = list(uids)
    random.Random(seed).shuffle(order)
    touch = presence.touch
    start = clock()
    for uid in order:
        touch(uid, now)
    return (clock() - start) / max(len(order), 1)


def bytes_per_session(kind: str, uids: Sequence[str], *, timeout: float, keepalive: float | None, slots: int) -> float:
    """Traced memory of the presence table and its detector after every uid attached, per session."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        presence = _table(kind, timeout, slots)
        owners = [_Owner() for _ in range(OWNERS)]
        for i, uid in enumerate(uids):
            now = i * 1e-5
            presence.login(uid, owners[i % OWNERS], now, now, keepalive)
        used = tracemalloc.get_traced_memory()[0] - base
        del presence
    finally:
        tracemalloc.stop()
        gc.collect()
    return used / max(len(uids), 1)


def report_lines(
    sizes: Sequence[int], kinds: Sequence[str], *, rate: float, timeout: float, keepalive: float | None,
    slots: int, chunk: int | None, clock_name: str, seed: int, memory: bool,
) -> Iterator[str]:
    """Grow each size with each detector; one table row per (size, detector), yielded as it is done."""
    clock = CLOCKS[clock_name]
    yield (
        f"idled bench --growth: 0 -> N sessions at {rate:,.0f} attaches/s (simulated), {OWNERS} owners, "
        f"timeout {timeout:g} s, keepalive {'default' if keepalive is None else f'{keepalive:g} s'}, tick 1 s, "
        f"{slots} slots, chunk {chunk or 'none'}, {clock_name} clock, seed {seed}, python {sys.version.split()[0]}"
    )
    yield (
        f"{'size':>9}  {'detector':<10} {'login_us':>8} {'login_max_ms':>12} {'login_p999_ms':>13} {'touch_ns':>8} "
        f"{'call_max_ms':>11} {'gc_passes':>9} {'gc_max_ms':>9} {'full_gc_ms':>10} {'bytes/session':>13} {'expired':>9}"
    )
    for size in sizes:
        uids = [f"u{i}" for i in range(size)]
        for kind in kinds:
            r = grow(kind, uids, rate=rate, timeout=timeout, keepalive=keepalive, slots=slots, chunk=chunk,
                     clock=clock, seed=seed)
            if memory:
                r.bytes_per_session = bytes_per_session(kind, uids, timeout=timeout, keepalive=keepalive, slots=slots)
            yield (
                f"{size:>9,}  {kind:<10} {r.login_us:>8.2f} {r.login_max_ms:>12.2f} {r.login_p999_ms:>13.3f} "
                f"{r.touch_ns:>8.0f} {r.call_max_ms:>11.2f} {r.gc_passes:>9,} {r.gc_max_ms:>9.2f} "
                f"{r.full_gc_ms:>10.1f} {r.bytes_per_session:>13.1f} {r.expired:>9,}"
            )
            yield "           slowest logins (sessions before it: ms): " + ", ".join(
                f"{i:,}: {ms:.2f}" for i, ms in r.slowest
            )
            del r
            gc.collect()


if __name__ == "__main__":  # any checkout: PYTHONPATH=CHECKOUT python growth.py [N [KEEPALIVE|- [KIND ...]]]
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    keepalive = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
    for line in report_lines([size], sys.argv[3:] or ["ring-lazy"], rate=50_000.0, timeout=30.0, keepalive=keepalive,
                             slots=30, chunk=128, clock_name="cpu", seed=1, memory=True):
        print(line, flush=True)
