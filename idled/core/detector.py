"""The interface every idle detector keeps, and the shared snapshot type.

Time here is integer ticks. The caller turns real time into ticks so that "activity tick + timeout ticks" is
the first tick at or after the real deadline, and advances with the last tick boundary already passed: never
early, at most one tick late (``idled.core.presence`` holds the rounding rule).

Detectors are pure: no clock, no I/O. ``advance`` *returns* the expired keys; the caller logs and closes.

One record per key. A detector keeps everything it knows about a key in one ``Entry`` (activity tick,
timeout, and where the detector filed it), held in one map, ``entries`` (key -> entry). A caller that keeps
its own per-key fields -- the presence table: owner, last activity in seconds -- subclasses ``Entry`` and
passes its record to ``add``: then one uid-keyed map serves both, and a growing population resizes one
dict per login instead of one per parallel map (a 1M-entry dict takes ~30-50 ms to grow here, and maps that
hold the same keys all grow at the same insertion).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

# Largest number of keys a server examines per ``advance`` call before yielding to the event loop.
# From `idled bench` at 1M keys: a lazy re-file costs ~2-5 us (every dict access a cache miss), so 1024
# keys took 3.6-5.6 ms per call and 256 up to ~2 ms when a ring bucket's dict resizes (~1 ms by itself)
# inside the call; 128 leave room for that resize, for ~30 us of checkpoint per chunk in the server.
DEFAULT_CHUNK = 128

MAX_TIMEOUT_TICKS = 10 * 24 * 3600  # ten days at 1 s ticks: "at least 24 h" with room to spare


@dataclass(frozen=True, slots=True)
class DetectorStats:
    """A point-in-time snapshot, cheap enough to take at every metrics scrape."""

    keys: int
    slots: int  # ring buckets (0 for detectors without a ring)
    occupied_slots: int
    largest_slot: int
    overflow_keys: int  # keys in the overflow wheel's levels
    overflow_levels: int
    expired_total: int  # keys returned by advance() since creation


class Entry:
    """One watched key. ``tick`` and ``timeout`` are the detector's (activity tick, timeout in ticks); ``place``
    is private to the detector that holds the entry (the wheel: the bucket it is filed in), and None exactly while
    none does -- replaced, removed or expired (and so while the presence table holds it out of the detector): a
    caller that kept the entry itself checks that before touching it.

    Subclass it (with ``__slots__``) to keep more per-key fields in the same record."""

    __slots__ = ("key", "tick", "timeout", "place")

    key: Hashable
    tick: int
    timeout: int
    place: object


class Detector(Protocol):
    """What the presence table needs from an idle detector.

    Contract, in ticks: a key added or touched at ``now`` with timeout ``T`` has deadline ``now + T``;
    ``advance(m)`` returns it once, at the first call with ``m >= deadline``, never earlier; a removed key is
    never returned; re-adding a key replaces it. Activity at tick ``n`` tells the detector that real time
    has reached ``n - 1`` (activity ticks are rounded up), so the caller never advances below that.

    ``entries`` is the detector's one key -> entry map; callers read it, never change it.
    """

    entries: dict[Hashable, Entry]
    # True when touching an entry is exactly ``entry.tick = now`` (the deadline is re-checked when due): a
    # caller holding the entry may then store the tick itself instead of calling ``touch_entry``.
    plain_touch: bool

    def add(self, key: Hashable, now: int, timeout: int | None = None, entry: Entry | None = None) -> Entry:
        """Start watching ``key`` (replacing any previous entry); ``None`` means the default timeout.
        ``entry``: the record to keep it in (a fresh ``Entry`` by default); returns the record."""
        ...

    def touch(self, key: Hashable, now: int) -> None:
        """Record activity: the deadline moves to ``now + timeout``. Unknown keys are ignored."""
        ...

    def touch_entry(self, entry: Entry, now: int) -> None:
        """``touch`` for a caller that already holds the (watched) entry."""
        ...

    def remove(self, key: Hashable) -> bool:
        """Stop watching ``key``; returns whether it was watched."""
        ...

    def advance(self, now: int, limit: int | None = None) -> list[Hashable]:
        """Move the clock to ``now`` and return keys whose deadline is ``<= now``.

        With ``limit`` at most that many keys are examined per call (bounding the time one call holds the
        caller); call again while ``next_due() <= now``.
        """
        ...

    def advance_entries(self, now: int, limit: int | None = None) -> list[Entry]:
        """``advance``, returning the expired entries (out of ``entries`` already) rather than their keys."""
        ...

    def next_due(self) -> int | None:
        """No key is due before this tick; ``None`` when nothing is watched. Sleep until then."""
        ...

    def work_ahead(self, limit: int) -> int:
        """Do up to ``limit`` keys of the next tick's work that need not wait for it, so that tick is
        mostly expiries; returns the keys examined, 0 when nothing is left. Optional to call: results never
        depend on it."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def stats(self) -> DetectorStats: ...


def check_timeout(timeout: int) -> int:
    """Validate a timeout in ticks (typed error at the one entry point, not deep in a bucket)."""
    if type(timeout) is not int or not 1 <= timeout <= MAX_TIMEOUT_TICKS:
        raise ValueError(f"timeout must be an int from 1 to {MAX_TIMEOUT_TICKS} ticks, got {timeout!r}")
    return timeout


class EntryMap:
    """What every detector shares: the key -> entry map, filling an entry in ``add``, and the key views."""

    __slots__ = ("entries", "_timeout")

    def __init__(self, timeout: int) -> None:
        self._timeout = check_timeout(timeout)
        self.entries: dict[Hashable, Entry] = {}

    def _enter(self, key: Hashable, now: int, timeout: int | None, entry: Entry | None) -> Entry:
        """Validate, replace any previous entry of ``key``, fill in and map the record (not yet filed)."""
        timeout = self._timeout if timeout is None else check_timeout(timeout)
        if key in self.entries:
            self.remove(key)
        if entry is None:
            entry = Entry()
        entry.key, entry.tick, entry.timeout, entry.place = key, now, timeout, None
        self.entries[key] = entry
        return entry

    def remove(self, key: Hashable) -> bool:
        raise NotImplementedError

    def advance_entries(self, now: int, limit: int | None = None) -> list[Entry]:
        raise NotImplementedError

    def advance(self, now: int, limit: int | None = None) -> list[Hashable]:
        return [entry.key for entry in self.advance_entries(now, limit)]

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: object) -> bool:
        return key in self.entries
