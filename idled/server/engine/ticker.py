"""The tick task: expire idle sessions when the detector says something is due, in bounded slices.

Theory of operation
-------------------
The task sleeps until the detector's ``next_due()`` -- not every tick regardless -- under a cancel scope
whose deadline is the wake-up; a login that brings the next deadline forward moves that deadline
(``wake``), so nothing polls. Awake, it expires in chunks of ``DEFAULT_CHUNK`` keys, with a checkpoint after
every ``TICK_SLICE`` of them, so even 100k simultaneous expiries never hold the loop for more than a few
milliseconds. Each expiry is published, its owner told (``idle_timeout``) and its lateness (offline time
minus deadline) observed. Before it sleeps again it lets the detector work ahead (the lazy wheel re-files the
next tick's active keys now, in ``AHEAD_SLICE`` slices), so the next tick itself is only the expiries and they
are reported without waiting.

*Never ahead of what was read.* A keepalive that reached a socket before a deadline must win against the
tick, even when the loop is busy. trio runs tasks in batches, each after one poll of the sockets; a task
woken by its socket reads it in that batch, and one that found data without waiting returns it one batch
later. So the tick task expires only up to the clock it read *two* checkpoints earlier (``_Horizon``): by
then every connection task has read, and touched, whatever its socket held at that reading. The user plane
lets readiness gather for a few ms between its polls (``idled.server.roles.plane``, *Coalescing*), so the
horizon also drains it (``Sessions.drain``) at each turn, before the clock it read becomes the one judged. An edge's
sessions are the edge's watermark's business (``idled.core.watermarks``): the tick task asks an edge for a
mark at once (``want_mark``) when it holds one of its sessions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio

from idled.core.detector import DEFAULT_CHUNK
from idled.ops.metrics import Metrics
from idled.ops.nullmetrics import NullMetrics
from idled.protocol import ErrorCode
from idled.server.engine.sessions import Sessions

__all__ = ["AHEAD_SLICE", "CATCH_UP_SLICE", "TICK_SLICE", "Ticker"]

# Seconds of expiry work the tick task does between two checkpoints. Each checkpoint lets every runnable
# task (20 gateways' touch frames, observers) run before the next chunk, so an expiry in the last chunk of a
# tick waits for all of them: 2 ms slices gave a ~40 ms mean tick at 1M gateway sessions (~600 expiries).
TICK_SLICE = 0.005
CATCH_UP_SLICE = 0.010  # ... once it has fallen a whole tick behind
AHEAD_SLICE = 0.002  # work ahead of the next tick: nobody waits for it, so it yields more often


class Ticker:
    def __init__(self, sessions: Sessions, *, tick: float, metrics: Metrics | NullMetrics) -> None:
        self.sessions = sessions
        self.tick = tick
        self.metrics = metrics
        self._scope: trio.CancelScope | None = None  # while asleep: its deadline is the wake-up

    async def run(self) -> None:
        """Until cancelled."""
        presence, clock, metrics = self.sessions.presence, self.sessions.clock, self.metrics
        while True:
            due = presence.next_due()
            with trio.CancelScope() as self._scope:
                self._scope.deadline = math.inf if due is None else clock.wake_time(due)
                await trio.sleep_forever()
            self._scope = None
            started = time.perf_counter()
            await self._expire_due()
            metrics.detector_ticks.inc()
            metrics.tick_duration.observe(time.perf_counter() - started)
            await self._work_ahead()

    async def _expire_due(self) -> None:
        sessions, lateness = self.sessions, self.metrics.offline_lateness
        presence, bus, clock = sessions.presence, sessions.bus, sessions.clock
        horizon = _Horizon(clock.now, sessions.drain)
        await horizon.turn()
        await horizon.turn()
        slice_end = time.perf_counter() + TICK_SLICE
        while True:
            now = horizon.read
            due = presence.next_due()
            if due is None or due > now:
                return
            await sessions.room()
            wall = clock.wall()
            for key, owner, event in presence.expire(now, wall, DEFAULT_CHUNK):
                if event is not None:  # (None: another device of the user is still online)
                    bus.publish(event)
                if owner is not None:  # (None: a grace offline -- its connection is long gone, its ts when it left)
                    owner.release(key, ErrorCode.IDLE_TIMEOUT, "no activity within the timeout")
                    if event is not None:
                        lateness.observe(event.ts - event.deadline)
            for owner, deadline in presence.holds.take_wanted().items():
                owner.want_mark(deadline)
            # Chunks until the slice is used up, then a checkpoint: nobody waits behind a mass expiry for
            # more than ~TICK_SLICE. Between two slices every other runnable task gets a turn, so on a busy
            # loop the tick gets TICK_SLICE per loop turn; once it has fallen a tick behind it takes
            # CATCH_UP_SLICE turns instead (measured at 1M gateway sessions, 20 busy gateway tasks: one
            # checkpoint per chunk made offlines up to 4 s late, 2 ms slices up to 3 s).
            if time.perf_counter() >= slice_end:
                await horizon.turn()
                behind = clock.now() - due >= self.tick
                slice_end = time.perf_counter() + (CATCH_UP_SLICE if behind else TICK_SLICE)

    async def _work_ahead(self) -> None:
        """The detector's work for the next tick that need not wait for it, in AHEAD_SLICE slices; stops as
        soon as a tick is due (its expiries come first)."""
        presence, clock = self.sessions.presence, self.sessions.clock
        slice_end = time.perf_counter() + AHEAD_SLICE
        while presence.work_ahead(DEFAULT_CHUNK):
            if time.perf_counter() >= slice_end:
                await trio.lowlevel.checkpoint()
                due = presence.next_due()
                if due is not None and due <= clock.now():
                    return
                slice_end = time.perf_counter() + AHEAD_SLICE

    def wake(self) -> None:
        """A new session may be due before the tick task's wake-up: bring the wake-up forward."""
        scope = self._scope
        if scope is None:
            return  # the tick task is awake: it asks next_due() itself before it sleeps again
        due = self.sessions.presence.next_due()
        if due is not None and (wake := self.sessions.clock.wake_time(due)) < scope.deadline:
            scope.deadline = wake


class _Horizon:
    """The server clock as read two checkpoints ago: every socket readable then has been read by now (see the
    module docstring). ``turn()`` is the checkpoint, then the drain."""

    __slots__ = ("_now", "_drain", "read", "_next")

    def __init__(self, now: Callable[[], float], drain: Callable[[], object]) -> None:
        self._now = now
        self._drain = drain
        self.read = -math.inf
        self._next = now()

    async def turn(self) -> None:
        await trio.lowlevel.checkpoint()
        self._drain()
        self.read, self._next = self._next, self._now()
