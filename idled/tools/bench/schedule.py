"""The simulated keepalive load of `idled bench`: who logs in and who pings at each tick, fixed per seed.

Theory of operation
-------------------
Time is integer ticks (read them as seconds). For each size N one schedule is built before anything is
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
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["JITTER", "Schedule", "build_schedule"]

JITTER = (0.75, 0.95)  # ping interval as a fraction of the keepalive period


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
