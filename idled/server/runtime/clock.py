"""The server's clock: trio's monotonic clock minus every stall the event loop could not run through.

Theory of operation
-------------------
Every deadline is measured on ``now() = trio.current_time() - paused``. The monitor task (``monitor.py``)
calls ``beat(t)`` four times a tick, so in a healthy process ``now()`` never finds a gap since the last beat
longer than a tick or so. If the event loop could not run for ``stall_limit`` seconds or more (SIGSTOP, a VM
pause, a starved machine), no packet could be read during that time, so silence during it proves nothing:
the whole pause is added to ``paused``, which moves every deadline later by the pause at once (no per-key
work). Whichever task first calls ``now()`` after the pause applies it, before it touches or expires
anything.

Worked by hand: beats at 100.0, 100.1; the process is stopped until 110.2; stall_limit 0.2. The tick task
wakes first and calls ``now()``: gap 10.1 > 0.2, so paused = 10.1 and now() = 100.1. A user whose deadline
was 100.5 is due at trio time 110.6, not at once.

Wall-clock time -- an event's ``ts``, a token's expiry, a heartbeat's time -- is read from ``wall`` (a
``WallClock``): the system's wall clock read through ``idled.core.wallclock.MonotonicWall``, so it never goes
backwards. A forward step of the system clock is followed at once; a backward step is not: our time runs up
to 1/12 slower until the two meet (docs/operations.md, "Clock steps"). It reads the real monotonic clock
(``time.monotonic``), not the pause-adjusted one: a pause is real time on the wall too. ``wall.floor(ts)``
starts it at or after the event log's last ``ts`` (the server does that once the log is recovered). Every
step of the system clock of ``STEP_LOG_MIN`` or more is logged (one warning line, at most one a second).

Token expiry is judged on ``tokens``: the same kind of clock, never going backwards within the run, but never
floored to the log. Within a run a step back revives no expired token; a new run judges tokens on the system
clock. The log floor is for ``ts`` alone because it can be far ahead: a clock that ran a day ahead while
events were logged, then corrected, would otherwise refuse every token for the twelve days our time needs to
meet the system's again -- a restart is how an operator ends that (docs/operations.md, "Clock steps").
"""

from __future__ import annotations

import logging
import math
import time
from typing import Final

import trio

from idled.core.wallclock import MonotonicWall

__all__ = ["Clock", "WallClock", "floor_wall"]

STEP_LOG_INTERVAL: Final = 1.0  # seconds between two lines about the system clock's steps, at least
STEP_LOG_MIN: Final = 0.1  # seconds: a smaller step is not logged (a preemption between the two reads looks like one)

log = logging.getLogger("idled.server.runtime.clock")


class Clock:
    """The pause-adjusted monotonic clock (``now``) and the trio deadline for a server-clock time."""

    __slots__ = ("paused", "stall_limit", "_last_beat", "_current", "wall", "tokens")

    def __init__(self, stall_limit: float) -> None:
        self.wall = WallClock()  # wall-clock time that never goes backwards (see the module docstring)
        self.tokens = WallClock(report=False)  # ... and the one token expiry is judged on: never floored
        self.paused = 0.0  # seconds the event loop could not run, summed: every deadline moved by this
        self.stall_limit = stall_limit  # a gap between beats at least this long is a stall (SIGHUP may change it)
        self._last_beat = 0.0
        # trio's time; from start() on, the run's clock object itself: trio.current_time() works in the loop's
        # thread only, and the user plane's thread stamps keepalives too (under the loop lock: runtime.looplock)
        self._current = trio.current_time

    def start(self) -> None:
        """The first beat: call it when the tasks that beat (the monitor) are about to start."""
        self._current = trio.lowlevel.current_clock().current_time
        self._last_beat = self._current()

    def beat(self, t: float) -> None:
        """The loop ran at trio time ``t`` (after ``now()`` applied any stall up to it)."""
        self._last_beat = t

    def heartbeat(self) -> float:
        """The loop is running: apply any stall up to here (``now``), then ``beat``. Returns the trio time."""
        t = self._current()
        self.now()
        self._last_beat = t
        return t

    def now(self) -> float:
        """The pause-adjusted monotonic clock every deadline is measured on."""
        t = self._current()
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


class WallClock:
    """``wall()``: the system's wall clock (unix seconds), never going backwards (see the module docstring)."""

    __slots__ = ("model", "report", "_steps", "_logged_at", "_unlogged")

    def __init__(self, model: MonotonicWall | None = None, *, report: bool = True) -> None:
        self.model = MonotonicWall() if model is None else model
        self.report = report  # log the system clock's steps (one clock per process says it)
        self._steps = 0  # the model's steps already reported
        self._logged_at = -math.inf  # time.monotonic() of the last line
        self._unlogged = 0  # steps since then not reported

    def __call__(self) -> float:
        model = self.model
        now = model.read(time.time(), time.monotonic())
        if model.steps != self._steps and self.report:
            self._report(model)
        return now

    def floor(self, t: float) -> float:
        """From now on our time is at least ``t`` (the event log's last ``ts``). Returns how far ahead of the
        system's wall clock that puts it (0: not at all)."""
        self.model.floor(t, time.monotonic())
        self()
        return self.model.ahead()

    def ahead(self) -> float:
        """Seconds our time is ahead of the system's wall clock (catching up after a step back; 0 in sync)."""
        return self.model.ahead()

    def _report(self, model: MonotonicWall) -> None:
        self._steps = model.steps
        if abs(model.last_step) < STEP_LOG_MIN:
            return
        self._unlogged += 1
        mono = time.monotonic()
        if mono - self._logged_at < STEP_LOG_INTERVAL:
            return
        more = f" ({self._unlogged - 1} more since the last line)" if self._unlogged > 1 else ""
        self._logged_at, self._unlogged = mono, 0
        step, ahead = model.last_step, model.ahead()
        if ahead > 0.0:
            log.warning("the system clock stepped %s by %.3f s%s: wall-clock times (event ts, token expiry) do not "
                        "go back; they run %.1f%% slower until they meet it, in %.0f s", "back" if step < 0
                        else "forward", abs(step), more, 100 * model.slew, ahead / model.slew)
        else:
            log.warning("the system clock stepped %s by %.3f s%s: wall-clock times follow it",
                        "back" if step < 0 else "forward", abs(step), more)


def floor_wall(wall: WallClock, last_ts: float, logger: logging.Logger) -> None:
    """Start ``wall`` at or after ``last_ts``, the event log's largest ``ts`` (0: an empty log); say so when that
    puts it ahead of the system's clock (stepped back while the process was down)."""
    if last_ts <= 0.0:
        return
    ahead = wall.floor(last_ts)
    if ahead > 0.0:
        slew = wall.model.slew
        logger.warning("the event log's last ts is %.3f s ahead of the system clock (stepped back, or the log was "
                       "written on a machine whose clock is ahead): event times go on from it, %.1f%% slower until "
                       "they meet the system clock, in %.0f s", ahead, 100 * slew, ahead / slew)
