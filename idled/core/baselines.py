"""The two designs the timing wheel must beat, behind the same interface (``idled.core.detector.Detector``).

* ``FullScan``: ``key -> entry (last activity)``; every tick walks the whole dict looking for silent keys. What most
  presence services start with: a keepalive is one dict store, but each tick costs O(all keys).
* ``DeadlineHeap``: what a per-connection ``trio.move_on_at`` / asyncio ``call_at`` timeout amounts to. Each
  keepalive pushes a new ``(deadline, seq, entry)`` item and leaves the old one stale (lazy deletion); the heap
  is rebuilt from live entries when stale ones outnumber them, exactly as trio's ``Deadlines`` does
  (``_prune`` when ``len(heap) > 2 * active + 1000``). That rebuild is the periodic stall the wheel avoids.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable

from idled.core.detector import DetectorStats, Entry, EntryMap

# trio's DEADLINE_HEAP_MIN_PRUNE_THRESHOLD: never prune a small heap.
HEAP_MIN_PRUNE = 1000


class FullScan(EntryMap):
    """``key -> entry (last activity)``, scanned in full whenever the clock moves."""

    __slots__ = ("_now", "_due", "_expired_total")
    plain_touch = True

    def __init__(self, *, timeout: int, start: int = 0) -> None:
        super().__init__(timeout)
        self._now = start
        self._due: list[Entry] = []  # found by the last scan, not yet returned (chunked advance)
        self._expired_total = 0

    def add(self, key: Hashable, now: int, timeout: int | None = None, entry: Entry | None = None) -> Entry:
        entry = self._enter(key, now, timeout, entry)
        entry.place = True  # (the scan files nothing, but None means "not held")
        return entry

    def touch(self, key: Hashable, now: int) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.tick = now

    def touch_entry(self, entry: Entry, now: int) -> None:
        entry.tick = now

    def remove(self, key: Hashable) -> bool:
        entry = self.entries.pop(key, None)
        if entry is None:
            return False
        entry.place = None
        return True

    def next_due(self) -> int | None:
        # The scan cannot know the earliest deadline without scanning: it wakes every tick.
        if self._due:
            return self._now
        return self._now + 1 if self.entries else None

    def work_ahead(self, limit: int) -> int:
        return 0  # which keys are due is only known by the scan at the tick itself

    def advance_entries(self, now: int, limit: int | None = None) -> list[Entry]:
        if now < self._now:
            raise ValueError(f"time went backwards: {now} < {self._now}")
        if not self._due and now > self._now:
            self._now = now
            self._due = [entry for entry in self.entries.values() if entry.tick + entry.timeout <= now]
        batch = self._due if limit is None or len(self._due) <= limit else self._due[:limit]
        self._due = [] if batch is self._due else self._due[limit:]
        entries, expired = self.entries, []
        for entry in batch:
            # Re-check: an entry found by the scan may have been touched or removed between chunks.
            if entries.get(entry.key) is entry and entry.tick + entry.timeout <= self._now:
                del entries[entry.key]
                entry.place = None
                expired.append(entry)
        self._expired_total += len(expired)
        return expired

    def stats(self) -> DetectorStats:
        return DetectorStats(len(self.entries), 0, 0, 0, 0, 0, self._expired_total)


class DeadlineHeap(EntryMap):
    """A heap of deadlines with lazy deletion and periodic pruning (trio's ``Deadlines``).

    An entry's ``place`` is its live deadline; heap items whose deadline differs are stale (a removed entry's
    is ``None``)."""

    __slots__ = ("_now", "_heap", "_seq", "_expired_total")
    plain_touch = False

    def __init__(self, *, timeout: int, start: int = 0) -> None:
        super().__init__(timeout)
        self._now = start
        self._heap: list[tuple[int, int, Entry]] = []
        # Tie-breaker so equal deadlines never compare entries (trio uses id(cancel_scope)).
        self._seq = itertools.count()
        self._expired_total = 0

    def add(self, key: Hashable, now: int, timeout: int | None = None, entry: Entry | None = None) -> Entry:
        entry = self._enter(key, now, timeout, entry)
        self._push(entry, now + entry.timeout)
        return entry

    def touch(self, key: Hashable, now: int) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            self.touch_entry(entry, now)

    def touch_entry(self, entry: Entry, now: int) -> None:
        entry.tick = now
        self._push(entry, now + entry.timeout)

    def _push(self, entry: Entry, deadline: int) -> None:
        if entry.place != deadline:  # like trio: an unchanged deadline is not re-registered
            entry.place = deadline
            heapq.heappush(self._heap, (deadline, next(self._seq), entry))

    def remove(self, key: Hashable) -> bool:
        entry = self.entries.pop(key, None)
        if entry is None:
            return False
        entry.place = None
        return True

    def next_due(self) -> int | None:
        heap = self._heap
        while heap:
            deadline, _, entry = heap[0]
            if entry.place == deadline:
                return max(deadline, self._now)
            heapq.heappop(heap)  # stale entry: discard, as trio's next_deadline() does
        return None

    def work_ahead(self, limit: int) -> int:
        return 0  # a heap pops due entries in order: there is nothing to move out of the way early

    def advance_entries(self, now: int, limit: int | None = None) -> list[Entry]:
        if now < self._now:
            raise ValueError(f"time went backwards: {now} < {self._now}")
        self._now = now
        heap, entries = self._heap, self.entries
        expired: list[Entry] = []
        popped = 0
        while heap and heap[0][0] <= now and (limit is None or popped < limit):
            deadline, _, entry = heapq.heappop(heap)
            popped += 1
            if entry.place == deadline:
                del entries[entry.key]
                entry.place = None
                expired.append(entry)
        if len(heap) > 2 * len(entries) + HEAP_MIN_PRUNE:
            self._prune()
        self._expired_total += len(expired)
        return expired

    def _prune(self) -> None:
        self._heap = [item for item in self._heap if item[2].place == item[0]]
        heapq.heapify(self._heap)

    def stats(self) -> DetectorStats:
        return DetectorStats(len(self.entries), 0, 0, 0, 0, 0, self._expired_total)
