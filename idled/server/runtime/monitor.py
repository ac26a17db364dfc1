"""The monitor task: event-loop lag, the stall guard's beat, the systemd watchdog and status line.

Theory of operation
-------------------
One task sleeps ``interval`` (a quarter tick, at most 0.25 s) in a loop. How late each wake-up comes is the
event loop's lag: exported as a histogram and kept as ``largest_stall``. Each wake-up is also the clock's
beat (``Clock.beat``), after ``Clock.now()`` has applied the stall guard if the wake-up came after a pause.
It pings the systemd watchdog at the interval the manager asked for and sends a status line every 5 s, and
runs the periodic hooks the server gives it (extend the seq reservation ahead of need, thaw the GC): cheap
checks, each at most four times a tick -- but the GC policy's hourly full walk runs inside its hook, so a hook's
time counts as lag too (and, past the stall limit, as a pause).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import trio

from idled.ops import systemd
from idled.ops.nullmetrics import NullMetrics
from idled.server.runtime.clock import Clock

if TYPE_CHECKING:  # (exporters only: a process without metrics never imports prometheus_client)
    from idled.ops.metrics import Metrics

__all__ = ["Monitor", "STATUS_EVERY"]

STATUS_EVERY = 5.0  # seconds between two systemd STATUS= lines


class Monitor:
    def __init__(self, clock: Clock, *, tick: float, env: Mapping[str, str], metrics: Metrics | NullMetrics) -> None:
        self.clock = clock
        self.interval = min(0.25, tick / 4)
        self.env = env
        self.metrics = metrics
        self.largest_stall = 0.0  # seconds the event loop was late, at worst

    async def run(self, status: Callable[[], str], hooks: Sequence[Callable[[], object]] = ()) -> None:
        """Until cancelled. Start it after READY=1, so the manager never sees WATCHDOG=1 (or STATUS=) first."""
        clock, interval, metrics = self.clock, self.interval, self.metrics
        watchdog = systemd.watchdog_interval(self.env)
        notifier = systemd.Notifier(self.env)
        next_ping = next_status = before = trio.current_time()
        with notifier:
            while True:
                await trio.sleep(interval)
                t = clock.heartbeat()  # applies the stall guard first if the loop was held up
                lag = max(0.0, t - before - interval)
                self.largest_stall = max(self.largest_stall, lag)
                metrics.observe_loop_lag(lag)
                if watchdog is not None and t >= next_ping:
                    notifier.send(systemd.WATCHDOG)
                    next_ping = t + watchdog
                if notifier.enabled and t >= next_status:
                    notifier.send(systemd.status(status()))
                    next_status = t + STATUS_EVERY
                for hook in hooks:
                    hook()
                before = t  # the hooks' own time (the GC policy's full walk) is the next lag's too
