"""The user engine's clockwork: a timing wheel of integer slots, and the keepalive schedule.

Theory of operation
-------------------
`TimerWheel` files integer entries (the engine packs a session's local index and a timer kind into one int)
under slot ``floor((t - origin) / width)``: a dict from slot number to a list of entries, and a heap of the slot
numbers that hold a list. `due(now)` pops every slot that starts at or before now and returns their
entries in slot order, so a timer runs up to one slot *early* and never late by construction: any lateness
is the loop's own, which is what the engine measures. (`origin` shifts every slot boundary: the engine gives
each worker process its own, so their turns -- and the bursts of keepalives they send -- interleave
instead of coinciding.) Worked by hand with width 0.01 s and origin 0:

    add(7, 1.234)   -> slot 123 = [7], heap [123]
    add(9, 1.239)   -> slot 123 = [7, 9]            (same slot: a list append, no heap push)
    add(4, 1.301)   -> slot 130 = [4], heap [123, 130]
    next_time()     -> 1.23                          (the engine sleeps until then, or until a socket is ready)
    due(1.2299)     -> []                            (slot 123 starts at 1.23)
    due(1.2300)     -> [7, 9]                        (slot 123 popped; 130 stays)

An entry added while a `due` result is being processed, for a slot at or before now, lands in a fresh list
and comes back from the next call: one turn of the engine never loops on its own output. Cost: one dict
lookup and one list append per `add` (a heap push only when a slot opens); one heap pop and one dict pop per
due slot. With 40 ms slots a 20 s keepalive spans 500 slots: 16,000 sessions fill ~32 per slot.

`Schedule` is the keepalive rule of the load test, unchanged from the task-per-connection generator: the
first ping a random phase in (0.05 K, K] after the welcome, then every ``K * U(1 - jitter, 1 + jitter)``,
each due time computed from the previous *due* time (not from when it was sent: a late loop does not
drift the schedule); with ``ping_every`` S, from `fast_from` (the ramp's planned end) on every S seconds
instead, a session joining that schedule at a random phase. Times are plain floats on any clock, the
random source is injected: both are pure and tested with plain numbers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

__all__ = ["TimerWheel", "Schedule"]


class TimerWheel:
    """Integer entries filed under slots of `width` seconds; `due(now)` returns those whose slot has come."""

    __slots__ = ("width", "origin", "_buckets", "_heap", "size")

    def __init__(self, width: float, origin: float = 0.0) -> None:
        if not width > 0:
            raise ValueError(f"slot width must be > 0, got {width!r}")
        self.width = width
        self.origin = origin  # slot s starts at origin + s * width
        self._buckets: dict[int, list[int]] = {}
        self._heap: list[int] = []  # slot numbers that have a bucket, each once
        self.size = 0  # entries filed (stale ones included: the engine skips them when they come due)

    def add(self, entry: int, t: float) -> None:
        slot = int((t - self.origin) // self.width)
        bucket = self._buckets.get(slot)
        if bucket is None:
            self._buckets[slot] = [entry]
            heapq.heappush(self._heap, slot)
        else:
            bucket.append(entry)
        self.size += 1

    def next_time(self) -> float | None:
        """Start of the earliest slot holding an entry (None: empty): when `due` will next return any."""
        return self._heap[0] * self.width + self.origin if self._heap else None

    def due(self, now: float) -> list[int]:
        """Every entry filed at or before now's slot, in slot order (within a slot: in order of adding)."""
        heap = self._heap
        width, origin = self.width, self.origin
        # (compared as next_time() computes it, not by floor(now / width): 1.23 // 0.01 is 122.0 in floats,
        # and a loop woken at next_time() must find the slot due)
        if not heap or heap[0] * width + origin > now:
            return []
        buckets = self._buckets
        out = buckets.pop(heapq.heappop(heap))
        while heap and heap[0] * width + origin <= now:
            out += buckets.pop(heapq.heappop(heap))
        self.size -= len(out)
        return out


class Schedule:
    """When each keepalive is due: the load test's rule (see the module docstring)."""

    __slots__ = ("keepalive", "jitter", "ping_every", "fast_from", "_rand")

    def __init__(self, keepalive: float, jitter: float, ping_every: float | None, fast_from: float,
                 rand: Callable[[], float]) -> None:
        self.keepalive = keepalive
        self.jitter = jitter
        self.ping_every = ping_every
        self.fast_from = fast_from
        self._rand = rand

    def first(self, welcomed: float) -> float:
        """The first keepalive of a session welcomed at `welcomed`."""
        return self._due(welcomed, True)

    def next(self, last_due: float) -> float:
        """The keepalive after the one due at `last_due`."""
        return self._due(last_due, False)

    def _due(self, last: float, first: bool) -> float:
        every = self.ping_every
        fast = every is not None and last >= self.fast_from
        interval = every if fast else self.keepalive
        r = self._rand()
        j = self.jitter
        due = last + interval * ((0.05 + 0.95 * r) if first else (1.0 - j + 2.0 * j * r))  # type: ignore[operator]
        if every is not None and not fast and due > self.fast_from:
            due = self.fast_from + every * (0.05 + 0.95 * self._rand())  # join the fast schedule
        return due
