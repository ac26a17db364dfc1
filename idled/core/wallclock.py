"""A wall clock that never goes backwards: the system's wall clock, read through the monotonic clock.

Theory of operation
-------------------
Every wall-clock time idled stamps or judges by -- an event's ``ts`` and the ``last_seen`` and ``deadline``
derived with it, a token's expiry, a replication heartbeat's time -- is *our time*: ``mono + offset``, where
``mono`` is the monotonic clock (which no one steps) and ``offset`` is our estimate of ``wall - mono``. Each
reading ``(wall, mono)`` of the two clocks compares the system's offset, ``target = wall - mono``, with ours:

* **in sync** (``|target - offset| <= jitter``): nothing changes, so our time advances exactly with the
  monotonic clock: elapsed times are exact, and the jitter of reading two clocks one after the other is
  absorbed. (NTP's slewing moves ``CLOCK_MONOTONIC`` and ``CLOCK_REALTIME`` together: in sync they stay.)
* **the system clock is ahead** (a forward step, or catching up after a backward one): ``offset = target``
  at once. Time jumps forward with it, as the system's did; nothing that was true becomes false.
* **the system clock is behind** (a backward step: NTP correcting a fast clock, an operator, a VM restored):
  we do not follow. Our time keeps advancing with the monotonic clock, but ``slew`` slower (``offset`` drops
  by ``slew x elapsed``, never below ``target``) until the two meet: chrony's default maximum slew rate,
  83,333 ppm, so a step back of one hour is absorbed in twelve hours, and any duration measured on our time
  meanwhile is at most 1/12 short of the real one -- never negative.

So our time never decreases: between two readings ``mono`` grows by ``e >= 0`` and ``offset`` falls by at
most ``slew x e < e``. (A reading whose ``mono`` is below an earlier one, which a monotonic clock never gives,
counts as ``e = 0``; and the result is never below the last one returned, whatever floating point rounds.)

``floor(t, mono)``: our time from ``mono`` on is at least ``t`` -- the last ``ts`` of the event log when a run
starts (a clock stepped back while the daemon was down), then slewed towards the system's like any step.

Worked by hand, slew 0.1 for round numbers: ``read(1000, 0)`` -> 1000 (offset 1000). ``read(1010, 10)`` -> 1010
(in sync). The system steps back 100 s: ``read(920, 20)`` -> target 900, offset ``max(900, 1000 - 0.1 x 10)``
= 999 -> 1019, not 920 (10 s of monotonic time moved our time 9 s). ``read(1020, 120)``: offset
``max(900, 999 - 10)`` = 989 -> 1109, 89 s ahead of the system's. 1000 s after the step the offset meets
900, and our time is the system's again. ``steps`` counts the readings where the system's offset moved
by more than ``jitter`` since the previous reading (``last_step``: by how much, signed), for the server's log.

Pure: no clock is read here (``idled.server.runtime.clock.WallClock`` reads them); plain floats in, a float out.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["JITTER", "MAX_SLEW", "MonotonicWall"]

MAX_SLEW: Final = 1 / 12  # chrony's default maxslewrate, 83,333 ppm: our time runs at least 11/12 as fast
JITTER: Final = 0.001  # seconds: a difference this small between the two offsets is noise, not a step


class MonotonicWall:
    """Our time from readings of the system's wall and monotonic clocks (see the module docstring)."""

    __slots__ = ("slew", "jitter", "steps", "last_step", "_offset", "_mono", "_last", "_target")

    def __init__(self, *, slew: float = MAX_SLEW, jitter: float = JITTER) -> None:
        if not 0.0 < slew < 1.0 or not 0.0 <= jitter < math.inf:
            raise ValueError(f"slew must be in (0, 1) and jitter >= 0 (got slew {slew!r}, jitter {jitter!r})")
        self.slew = slew
        self.jitter = jitter
        self.steps = 0  # readings where the system's wall clock moved against the monotonic one (beyond jitter)
        self.last_step = 0.0  # by how much, at the last one: negative is a step back
        self._offset: float | None = None  # our time - mono (None: no reading yet)
        self._mono = -math.inf  # the largest mono seen
        self._last = -math.inf  # the largest time returned (or floored to)
        self._target: float | None = None  # the system's offset at the previous reading

    def read(self, wall: float, mono: float) -> float:
        """Our time at this reading of the system's wall clock ``wall`` and monotonic clock ``mono``."""
        target = wall - mono
        previous = self._target
        if previous is not None and abs(target - previous) > self.jitter:
            self.steps += 1
            self.last_step = target - previous
        self._target = target
        offset = self._offset
        elapsed = mono - self._mono if mono > self._mono else 0.0
        if offset is None or target > offset + self.jitter:
            offset = target  # first reading, or the system is ahead: follow at once
        elif target < offset - self.jitter:
            offset = max(target, offset - self.slew * elapsed)  # behind: slew towards it, never step back
        self._offset = offset
        mono = max(mono, self._mono)
        self._mono = mono
        now = max(mono + offset, self._last)
        self._last = now
        return now

    def floor(self, t: float, mono: float) -> None:
        """From monotonic time ``mono`` on, our time is at least ``t`` (then slews towards the system's)."""
        mono = max(mono, self._mono)
        if self._offset is None or t - mono > self._offset:
            self._offset = t - mono
        self._mono = mono
        self._last = max(self._last, t)

    def ahead(self) -> float:
        """Seconds our time was ahead of the system's wall clock at the last reading (0: in sync -- within the
        jitter -- or no reading yet)."""
        if self._offset is None or self._target is None:
            return 0.0
        gap = self._offset - self._target
        return gap if gap > self.jitter else 0.0
