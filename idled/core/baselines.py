"""The two designs the timing wheel must beat, behind the same interface (``idled.core.detector.Detector``).

* ``FullScan``: ``key -> last_seen``; every tick walks the whole dict looking for silent keys. What most
  presence services start with: a keepalive is one dict store, but each tick costs O(all keys).
* ``DeadlineHeap``: what a per-connection ``trio.move_on_at`` / asyncio ``call_at`` timeout amounts to. Each
  keepalive pushes a new ``(deadline, seq, key)`` entry and leaves the old one stale (lazy deletion); the heap
  is rebuilt from live entries when stale ones outnumber them, exactly as trio's ``Deadlines`` does
  (``_prune`` when ``len(heap) > 2 * active + 1000``). That rebuild is the periodic stall the wheel avoids.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable

from idled.core.detector import DetectorStats, check_timeout

# trio's DEADLINE_HEAP_MIN_PRUNE_THRESHOLD: never prune a small heap.
HEAP_MIN_PRUNE = 1000


class FullScan:
    """``key -> last_seen``, scanned in full whenever the clock moves."""

    __slots__ = ("_timeout", "_now", "_last_seen", "_timeouts", "_due", "_expired_total")

    def __init__(self, *, timeout: int, start: int = 0) -> None:
        self._timeout = check_timeout(timeout)
        self._now = start
        self._last_seen: dict[Hashable, int] = {}
        self._timeouts: dict[Hashable, int] = {}  # sparse: only keys whose timeout isn't the default
        self._due: list[Hashable] = []  # found by the last scan, not yet returned (chunked advance)
        self._expired_total = 0

    def add(self, key: Hashable, now: int, timeout: int | None = None) -> None:
        self._timeouts.pop(key, None)
        if timeout is not None and check_timeout(timeout) != self._timeout:
            self._timeouts[key] = timeout
        self._last_seen[key] = now

    def touch(self, key: Hashable, now: int) -> None:
        last_seen = self._last_seen
        if key in last_seen:
            last_seen[key] = now

    def remove(self, key: Hashable) -> bool:
        self._timeouts.pop(key, None)
        return self._last_seen.pop(key, None) is not None

    def __len__(self) -> int:
        return len(self._last_seen)

    def __contains__(self, key: object) -> bool:
        return key in self._last_seen

    def next_due(self) -> int | None:
        # The scan cannot know the earliest deadline without scanning: it wakes every tick.
        if self._due:
            return self._now
        return self._now + 1 if self._last_seen else None

    def work_ahead(self, limit: int) -> int:
        return 0  # which keys are due is only known by the scan at the tick itself

    def advance(self, now: int, limit: int | None = None) -> list[Hashable]:
        if now < self._now:
            raise ValueError(f"time went backwards: {now} < {self._now}")
        if not self._due and now > self._now:
            self._now = now
            self._due = self._scan(now)
        batch = self._due if limit is None or len(self._due) <= limit else self._due[:limit]
        self._due = [] if batch is self._due else self._due[limit:]
        expired = []
        for key in batch:
            # Re-check: a key found by the scan may have been touched or removed between chunks.
            last = self._last_seen.get(key)
            if last is not None and last + self._timeouts.get(key, self._timeout) <= self._now:
                del self._last_seen[key]
                self._timeouts.pop(key, None)
                expired.append(key)
        self._expired_total += len(expired)
        return expired

    def _scan(self, now: int) -> list[Hashable]:
        threshold = now - self._timeout
        due = [key for key, last in self._last_seen.items() if last <= threshold]
        if self._timeouts:  # keys with their own timeout: judge them by it instead
            due = [key for key in due if key not in self._timeouts]
            due += [key for key, t in self._timeouts.items() if self._last_seen[key] + t <= now]
        return due

    def stats(self) -> DetectorStats:
        return DetectorStats(len(self._last_seen), 0, 0, 0, 0, 0, self._expired_total)


class DeadlineHeap:
    """A heap of deadlines with lazy deletion and periodic pruning (trio's ``Deadlines``)."""

    __slots__ = ("_timeout", "_now", "_heap", "_deadline_of", "_timeouts", "_seq", "_expired_total")

    def __init__(self, *, timeout: int, start: int = 0) -> None:
        self._timeout = check_timeout(timeout)
        self._now = start
        self._heap: list[tuple[int, int, Hashable]] = []
        self._deadline_of: dict[Hashable, int] = {}  # the live deadline; heap entries that differ are stale
        self._timeouts: dict[Hashable, int] = {}
        # Tie-breaker so equal deadlines never compare keys (trio uses id(cancel_scope)).
        self._seq = itertools.count()
        self._expired_total = 0

    def add(self, key: Hashable, now: int, timeout: int | None = None) -> None:
        self._timeouts.pop(key, None)
        if timeout is not None and check_timeout(timeout) != self._timeout:
            self._timeouts[key] = timeout
        else:
            timeout = self._timeout
        self._push(key, now + timeout)

    def touch(self, key: Hashable, now: int) -> None:
        if key in self._deadline_of:
            self._push(key, now + self._timeouts.get(key, self._timeout))

    def _push(self, key: Hashable, deadline: int) -> None:
        if self._deadline_of.get(key) != deadline:  # like trio: an unchanged deadline is not re-registered
            self._deadline_of[key] = deadline
            heapq.heappush(self._heap, (deadline, next(self._seq), key))

    def remove(self, key: Hashable) -> bool:
        self._timeouts.pop(key, None)
        return self._deadline_of.pop(key, None) is not None

    def __len__(self) -> int:
        return len(self._deadline_of)

    def __contains__(self, key: object) -> bool:
        return key in self._deadline_of

    def next_due(self) -> int | None:
        heap, deadline_of = self._heap, self._deadline_of
        while heap:
            deadline, _, key = heap[0]
            if deadline_of.get(key) == deadline:
                return max(deadline, self._now)
            heapq.heappop(heap)  # stale entry: discard, as trio's next_deadline() does
        return None

    def work_ahead(self, limit: int) -> int:
        return 0  # a heap pops due entries in order: there is nothing to move out of the way early

    def advance(self, now: int, limit: int | None = None) -> list[Hashable]:
        if now < self._now:
            raise ValueError(f"time went backwards: {now} < {self._now}")
        self._now = now
        heap, deadline_of = self._heap, self._deadline_of
        expired: list[Hashable] = []
        popped = 0
        while heap and heap[0][0] <= now and (limit is None or popped < limit):
            deadline, _, key = heapq.heappop(heap)
            popped += 1
            if deadline_of.get(key) == deadline:
                del deadline_of[key]
                self._timeouts.pop(key, None)
                expired.append(key)
        if len(heap) > 2 * len(deadline_of) + HEAP_MIN_PRUNE:
            self._prune()
        self._expired_total += len(expired)
        return expired

    def _prune(self) -> None:
        deadline_of = self._deadline_of
        self._heap = [entry for entry in self._heap if deadline_of.get(entry[2]) == entry[0]]
        heapq.heapify(self._heap)

    def stats(self) -> DetectorStats:
        return DetectorStats(len(self._deadline_of), 0, 0, 0, 0, 0, self._expired_total)
