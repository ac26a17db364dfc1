"""The server's clock: trio's monotonic clock minus every stall the event loop could not run through.

Theory of operation
-------------------
Every deadline is measured on ``now() = trio.current_time() - paused``. The monitor task (``monitor.py``)
calls ``beat(t)`` ten times a tick, so in a healthy process ``now()`` never finds a gap since the last beat
longer than a tick or so. If the event loop could not run for ``stall_limit`` seconds or more (SIGSTOP, a VM
pause, a starved machine), no packet could be read during that time, so silence during it proves nothing:
the whole pause is added to ``paused``, which moves every deadline later by the pause at once (no per-key
work). Whichever task first calls ``now()`` after the pause applies it, before it touches or expires
anything.

Worked by hand: beats at 100.0, 100.1; the process is stopped until 110.2; stall_limit 0.2. The tick task
wakes first and calls ``now()``: gap 10.1 > 0.2, so paused = 10.1 and now() = 100.1. A user whose deadline
was 100.5 is due at trio time 110.6, not at once.
"""

from __future__ import annotations

import logging
import math

import trio

__all__ = ["Clock"]

log = logging.getLogger("idled.server.clock")


class Clock:
    """The pause-adjusted monotonic clock (``now``) and the trio deadline for a server-clock time."""

    __slots__ = ("paused", "stall_limit", "_last_beat")

    def __init__(self, stall_limit: float) -> None:
        self.paused = 0.0  # seconds the event loop could not run, summed: every deadline moved by this
        self.stall_limit = stall_limit  # a gap between beats at least this long is a stall (SIGHUP may change it)
        self._last_beat = 0.0

    def start(self) -> None:
        """The first beat: call it when the tasks that beat (the monitor) are about to start."""
        self._last_beat = trio.current_time()

    def beat(self, t: float) -> None:
        """The loop ran at trio time ``t`` (after ``now()`` applied any stall up to it)."""
        self._last_beat = t

    def heartbeat(self) -> float:
        """The loop is running: apply any stall up to here (``now``), then ``beat``. Returns the trio time."""
        t = trio.current_time()
        self.now()
        self._last_beat = t
        return t

    def now(self) -> float:
        """The pause-adjusted monotonic clock every deadline is measured on."""
        t = trio.current_time()
        gap = t - self._last_beat
        if gap > self.stall_limit:
            self._last_beat = t
            self.paused += gap
            log.warning("event loop could not run for %.3f s: moved every deadline by the pause", gap)
        return t - self.paused

    def wake_time(self, due: float) -> float:
        """The trio time at which the server clock (``current_time() - paused``) reads at least ``due``.

        ``(due + paused) - paused`` can be one ulp below ``due``: woken at exactly that deadline (a virtual
        clock does so), the tick task would find nothing due yet, sleep until the same deadline, and spin."""
        t = due + self.paused
        while t - self.paused < due:
            t = math.nextafter(t, math.inf)
        return t
