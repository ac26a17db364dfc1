"""The monitor task: a hook that holds the loop (the GC policy's full walk runs in one) shows as lag."""

from __future__ import annotations

import trio
import trio.testing

from idled.ops.nullmetrics import NullMetrics
from idled.server.runtime.clock import Clock
from idled.server.runtime.monitor import Monitor


async def test_the_time_a_hook_holds_the_loop_is_lag_and_a_long_one_a_pause(
        autojump_clock: trio.testing.MockClock) -> None:
    clock = Clock(stall_limit=2.0)
    clock.start()
    monitor = Monitor(clock, tick=1.0, env={}, metrics=NullMetrics())
    walks = [0.5, 3.0]  # seconds the loop is held, as by a full GC walk in the thaw hook

    def walk() -> None:
        if walks:
            autojump_clock.jump(walks.pop(0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.run, lambda: "", [walk])
        await trio.sleep(10.0)  # (both walks, and wake-ups after them)
        nursery.cancel_scope.cancel()
    assert monitor.largest_stall >= 3.0
    assert clock.paused >= 3.0  # past the stall limit: deadlines move by the pause (none could be kept)
