"""TimingWheel: a ring of one-tick buckets plus a hierarchical overflow wheel (Kafka's TimingWheel).

Theory of operation
-------------------
Time is integer ticks. Every watched key has an entry (``idled.core.detector.Entry``: activity tick, timeout,
``place``) in the one map ``entries`` and a *deadline* (activity tick + timeout); its entry sits in exactly
one bucket (a dict keyed by key), and ``entry.place`` is that bucket, so moving or removing a key is O(1).

**The ring** (level 0) has ``slots + 1`` buckets; bucket ``d % (slots + 1)`` holds the keys whose deadline
is ``d``, for every ``d`` in ``(now, now + slots + 1]``. One bucket more than ``slots`` because activity is
rounded *up* to the next tick (see ``idled.core.detector``): a key touched during tick ``now`` with a timeout of
``slots`` ticks is due at ``now + slots + 1``, and that must not share a bucket with the keys due at
``now + 1``. Advancing the clock to ``t`` detaches bucket ``t % (slots + 1)``: everything in it is due.

Worked example (``slots=3``, so 4 buckets; all timeouts 3; eager policy)::

    now=0   add a@0 -> deadline 3 -> bucket 3      ring: [ -, -, -, {a} ]
    now=0   add b@1 -> deadline 4 -> bucket 0      ring: [ {b}, -, -, {a} ]
    advance(2): buckets 1, 2 empty -> []           now=2
    touch a@2 -> deadline 5 -> bucket 1            ring: [ {b}, {a}, -, - ]
    advance(4): bucket 3 (t=3) empty; bucket 0 (t=4) -> [b]
    advance(5): bucket 1 (t=5) -> [a]

**The overflow wheel.** A deadline beyond the ring goes to level 1, whose buckets are each as wide as the
whole ring (``slots + 1`` ticks), then level 2 (as wide as all of level 1), and so on; levels are created on
demand. A level-k bucket covers deadlines ``[v*w, (v+1)*w)`` (``w`` its width) and is detached when the clock
reaches ``v*w``: its keys *cascade*, each re-filed by its deadline, which now fits a finer level (or is due).
Example, ``slots=3`` (ring span 4, level-1 width 4): a key due at 10 waits in level-1 bucket ``v=2`` (covering
8..11); at ``now=8`` that bucket is detached and the key moves to ring bucket ``10 % 4``; ``advance(10)``
returns it.

**Parking: one extra revolution in the ring.** A deadline up to one revolution beyond the ring
(``n0 < deadline - now <= 2 * n0``, ``n0 = slots + 1``) is not sent to level 1: it goes in the *parking* bucket
beside the ring bucket of its own deadline -- the slot that comes due at ``deadline - n0`` -- with the
deadline as the value (Netty's HashedWheelTimer keeps such a "remaining rounds" count). When that slot comes
due the key is re-filed by its deadline, which then fits the ring. A parked key cannot be due then (its
deadline is a revolution later), so the slot's parking bucket is drained *after* its ring bucket: the tick's
expiries are never queued behind re-filing. The work is the same as through level 1 (one extra
filing) but spread tick by tick: a level-1 bucket is as wide as the ring, so it holds a whole revolution of
such keys and cascades them *all at once* -- at 1M sessions with a 45 s timeout on 30 slots, ~300k keys in
one tick, which delayed that tick's expiries by ~2 s (measured with ``idled loadtest``). Longer deadlines
still use the overflow levels, where one cascade per revolution is the cheaper choice.

**Two refile policies** decide what a keepalive costs:

* ``eager``: ``touch`` moves the key to the bucket of its new deadline at once. Buckets are exact, so a due
  ring bucket is pure expiry.
* ``lazy`` (Netty's IdleStateHandler trick): ``touch`` only stores ``entry.tick = now`` (one lookup, one store);
  the key stays where it was filed, at a deadline that is now too early. When that bucket comes due, each key
  is checked: still silent -> expired; seen since -> re-filed at its real deadline. A chatty client costs
  one lookup and one store per packet and one re-file per timeout.

**Working ahead (lazy).** A due lazy bucket is mostly keys that were active since they were filed: at 1M
sessions each tick re-files ~33k keys to find the ~0.1% that expire, and an expiry found late in that
drain is reported late (~100 ms at the p99 with 1M gateway sessions). ``work_ahead(limit)``, called by
the server while it waits for the next tick, re-files now the keys of the next due ring bucket whose
deadline is already past that tick; the keys left are those that will expire unless they speak before the
tick (they are checked then as usual). The work and the per-packet cost are unchanged, only moved off the
deadline's path, so the tick itself is as short as an eager one. It walks a snapshot of the bucket's keys
in chunks, skipping any key that left the bucket meanwhile.

**Bounded work.** ``advance(now, limit)`` examines at most ``limit`` keys per call. Due buckets are first
*detached* (replaced by a fresh empty dict, so new arrivals for the next revolution don't mix in) and queued in
``_pending``; draining pops from them and can stop and resume at any key. A key touched or removed while its
detached bucket waits is found there through ``entry.place`` as usual.

**Bounded buckets.** A Python dict grows in one go: the insertion that fills its table copies every item
into one twice the size. At 1M keys a ring bucket holds ~33k keys, and the insertion that took it past
21,845 copied 21,845 items inside one chunk of a lazy drain (0.8-1.5 ms on a quiet host, 3.1 ms on a busy
one: the chunk's own work is ~0.2 ms). So a ring or parking bucket takes at most ``bucket_cap`` keys
(10,922: a 16,384-slot table, whose last growth copies 5,461 items); the next key of that slot starts a
fresh bucket and the full one is kept aside in ``_full``, to be detached with its slot. A slot is then a
few buckets, each key still in exactly one of them (``entry.place``). The overflow levels are not capped:
keys enter them on login or an eager touch, outside the tick's drain.

Memory: per key one ``entries`` item, the entry (a slotted object: key, tick, timeout, place) and one bucket
item; values shared (``None`` in the ring, tick ints shared by all keys touched in the same tick, the
default timeout). The caller may keep its own fields in the same entry (see ``idled.core.detector``): the
presence table does, so the server keeps one uid-keyed map, not one per field.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Literal
from collections.abc import Callable

from idled.core.detector import DetectorStats, Entry, EntryMap

# Buckets are keyed by key, not by entry: a dict of strings (or ints) and ints is never tracked by the garbage
# collector, so young collections don't walk a fresh bucket's 33k references (a 12 ms young collection at 1M
# keys when they were entries), nor full ones its items.
Bucket = dict[Hashable, "int | None"]  # key -> deadline (overflow levels, parking) or None (ring)

# A ring bucket whose table is over this size but which holds at most this many keys is rebuilt
# (one per advance: ~0.3 ms of re-pointing at 1M keys, where every dict access is a cache miss).
_COMPACT_MIN_BYTES = 64 * 1024
_COMPACT_MAX_KEYS = 256

# Ring and parking buckets grow to at most this many keys (see "Bounded buckets"): 2/3 of a 16,384-slot table,
# the most it holds before its next growth.
BUCKET_CAP = 10_922

# Kinds of detached bucket waiting in _pending.
_RING = 0  # a due ring bucket (or the overdue bucket): eager expires all, lazy checks the activity tick
_CASCADE = 1  # a due overflow bucket: every key re-filed by its deadline (or expired if due)


class _Level:
    """One overflow level: ``n`` buckets each ``width`` ticks wide."""

    __slots__ = ("width", "n", "buckets")

    def __init__(self, width: int, n: int) -> None:
        self.width = width
        self.n = n
        self.buckets: list[Bucket] = [{} for _ in range(n)]


class TimingWheel(EntryMap):
    """Idle detector built on a timing wheel; see the module docstring."""

    __slots__ = (
        "touch",
        "touch_entry",
        "plain_touch",
        "policy",
        "_slots",
        "_n0",
        "_overflow_slots",
        "_now",
        "_ring",
        "_parked",
        "_full",
        "_cap",
        "_levels",
        "_pending",
        "_expired_total",
        "_ahead",
    )

    touch: Callable[[Hashable, int], None]
    touch_entry: Callable[[Entry, int], None]

    def __init__(
        self,
        *,
        timeout: int,
        slots: int = 30,
        overflow_slots: int | None = None,
        policy: Literal["eager", "lazy"] = "lazy",
        start: int = 0,
        bucket_cap: int = BUCKET_CAP,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        if bucket_cap < 1:
            raise ValueError("bucket_cap must be at least 1")
        if policy not in ("eager", "lazy"):
            raise ValueError(f"policy must be 'eager' or 'lazy', got {policy!r}")
        super().__init__(timeout)
        self.policy = policy
        self._slots = slots
        self._n0 = slots + 1
        self._overflow_slots = max(2, overflow_slots or slots)
        self._now = start
        self._ring: list[Bucket] = [{} for _ in range(self._n0)]
        self._parked: list[Bucket] = [{} for _ in range(self._n0)]
        # Full buckets set aside, per slot: ring slot i at i, parking slot i at n0 + i (see "Bounded buckets").
        self._full: list[list[Bucket]] = [[] for _ in range(2 * self._n0)]
        self._cap = bucket_cap
        self._levels: list[_Level] = []
        self._pending: list[tuple[Bucket, int]] = []
        self._expired_total = 0
        self._ahead: tuple[int, Bucket, list[Hashable], int] | None = None  # (tick, bucket, snapshot, position)
        # Chosen once here, not tested on every packet.
        self.plain_touch = policy == "lazy"
        if policy == "eager":
            self.touch, self.touch_entry = self._touch_eager, self._move
        else:
            self.touch, self.touch_entry = self._touch_lazy, self._store

    # -- the per-packet path ------------------------------------------------------------------------

    def _touch_eager(self, key: Hashable, now: int) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            self._move(entry, now)

    def _move(self, entry: Entry, now: int) -> None:
        """Eager: file the entry by its new deadline at once."""
        entry.tick = now
        old = entry.place
        deadline = now + entry.timeout
        if 0 < deadline - self._now <= self._n0:
            index = deadline % self._n0
            new = self._ring[index]
            if new is not old:  # touched twice in one tick: already in place
                if len(new) >= self._cap:
                    new = self._spill(self._ring, index, index)
                del old[entry.key]  # type: ignore[attr-defined]  # place is the bucket filed in
                new[entry.key] = None
                entry.place = new
        else:
            del old[entry.key]  # type: ignore[attr-defined]  # place is the bucket filed in
            if deadline - now <= 2 * self._n0:  # catching up can only help a deadline the ring can hold
                self._catch_up(now - 1)
            self._file(entry, deadline)

    def _touch_lazy(self, key: Hashable, now: int) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.tick = now

    @staticmethod
    def _store(entry: Entry, now: int) -> None:
        """Lazy: the deadline is re-checked when the entry's bucket comes due."""
        entry.tick = now

    # -- membership ---------------------------------------------------------------------------------

    def add(self, key: Hashable, now: int, timeout: int | None = None, entry: Entry | None = None) -> Entry:
        entry = self._enter(key, now, timeout, entry)
        timeout = entry.timeout
        if now + timeout - self._now > self._n0 and timeout < 2 * self._n0:  # (longer ones overflow anyway)
            self._catch_up(now - 1)
        self._file(entry, now + timeout)
        return entry

    def remove(self, key: Hashable) -> bool:
        entry = self.entries.pop(key, None)
        if entry is None:
            return False
        del entry.place[key]  # type: ignore[attr-defined]
        entry.place = None  # a snapshot of its old bucket (work_ahead) must see it gone
        return True

    # -- filing ---------------------------------------------------------------------------------------

    def _catch_up(self, target: int) -> None:
        """Move the clock to ``target`` (no later than the caller's real time) across buckets that are all
        empty, so a deadline measured from now fits the ring again.

        A caller that advances only when ``next_due()`` says so leaves the clock behind real time: with
        chatty clients every deadline sits near ``now + timeout`` and nothing is due for most of a
        revolution. Filing relative to that stale clock would push every touch into the overflow wheel and
        bring it back as a cascade. Only empty ticks are skipped: nothing due is passed over.
        """
        if target <= self._now or self._pending:
            return
        due = self._next_bucket_due()
        if due is not None and due <= target:
            target = due - 1
        if target > self._now:
            self._now = target

    def _file(self, entry: Entry, deadline: int) -> None:
        """Put ``entry`` in the bucket for ``deadline``, relative to the current tick."""
        delta = deadline - self._now
        if 0 < delta <= self._n0:
            index = deadline % self._n0
            bucket = self._ring[index]
            if len(bucket) >= self._cap:
                bucket = self._spill(self._ring, index, index)
            bucket[entry.key] = None
        elif delta <= 0:
            # Already due (time was passed in from behind the wheel's clock): expire at the next advance.
            bucket = self._overdue_bucket()
            bucket[entry.key] = None
        elif delta <= 2 * self._n0:
            # Parked (see the module doc): re-filed when this bucket comes due, one revolution early.
            index = deadline % self._n0
            bucket = self._parked[index]
            if len(bucket) >= self._cap:
                bucket = self._spill(self._parked, index, self._n0 + index)
            bucket[entry.key] = deadline
        else:
            bucket = self._overflow_bucket(deadline)
            bucket[entry.key] = deadline
        entry.place = bucket

    def _spill(self, buckets: list[Bucket], index: int, full: int) -> Bucket:
        """``buckets[index]`` is full: set it aside (in ``_full[full]``) and return a fresh one in its place."""
        self._full[full].append(buckets[index])
        fresh: Bucket = {}
        buckets[index] = fresh
        return fresh

    def _overdue_bucket(self) -> Bucket:
        for bucket, kind in self._pending:
            if kind == _RING:
                return bucket
        bucket = {}
        self._pending.append((bucket, _RING))
        return bucket

    def _overflow_bucket(self, deadline: int) -> Bucket:
        width = self._n0
        for depth in range(64):
            if depth == len(self._levels):
                self._levels.append(_Level(width, self._overflow_slots))
            level = self._levels[depth]
            virtual = deadline // width
            # Virtual buckets now//width + 1 .. now//width + n are distinct modulo n; the current one
            # (now//width) never receives keys: a deadline inside it fits a finer level.
            if virtual - self._now // width <= level.n:
                return level.buckets[virtual % level.n]
            width *= level.n
        raise ValueError(f"deadline {deadline} is beyond every overflow level")

    # -- the clock ------------------------------------------------------------------------------------

    def next_due(self) -> int | None:
        if self._pending:
            return self._now
        return self._next_bucket_due()

    def _next_bucket_due(self) -> int | None:
        now, n0, ring, parked, full = self._now, self._n0, self._ring, self._parked, self._full
        best = None
        for offset in range(1, n0 + 1):
            index = (now + offset) % n0
            if ring[index] or parked[index] or any(full[index]) or any(full[n0 + index]):
                best = now + offset
                break
        for level in self._levels:
            base = now // level.width
            limit = level.n if best is None else min(level.n, (best - 1) // level.width - base)
            for offset in range(1, limit + 1):
                if level.buckets[(base + offset) % level.n]:
                    best = (base + offset) * level.width
                    break
        return best

    def work_ahead(self, limit: int) -> int:
        if self.policy != "lazy" or self._pending:
            return 0
        t = self._next_bucket_due()
        if t is None or t - self._now > self._n0:
            return 0  # the next due bucket is an overflow one: its cascade must happen at its tick
        index = t % self._n0
        bucket = self._ring[index]
        full = self._full[index]
        ahead = self._ahead
        if ahead is None or ahead[0] != t or ahead[1] is not bucket:
            ahead = (t, bucket, [key for b in (bucket, *full) for key in b], 0)
        _, _, keys, position = ahead
        end = min(position + limit, len(keys))
        slot = {id(b) for b in (bucket, *full)}  # the buckets of the slot (alive: ids are theirs)
        now, n0, ring, entries, cap = self._now, self._n0, self._ring, self.entries, self._cap
        for key in keys[position:end]:
            entry = entries.get(key)
            place = None if entry is None else entry.place
            if place is None or id(place) not in slot:
                continue  # removed, or moved, since the snapshot
            deadline = entry.tick + entry.timeout  # type: ignore[union-attr]
            if deadline > t:
                del place[key]  # type: ignore[attr-defined]
                if deadline - now <= n0:
                    target = ring[deadline % n0]
                    if len(target) >= cap:
                        target = self._spill(ring, deadline % n0, deadline % n0)
                    target[key] = None
                    entry.place = target  # type: ignore[union-attr]
                else:
                    self._file(entry, deadline)  # type: ignore[arg-type]
        # A finished pass keeps its marker (so the bucket is not walked again) but drops the snapshot.
        self._ahead = (t, bucket, keys if end < len(keys) else [], end if end < len(keys) else 0)
        return end - position

    def advance_entries(self, now: int, limit: int | None = None) -> list[Entry]:
        if now < self._now:
            raise ValueError(f"time went backwards: {now} < {self._now}")
        budget = -1 if limit is None else limit
        if budget == 0:
            raise ValueError("limit must be positive or None")
        expired: list[Entry] = []
        while True:
            while self._pending:
                bucket, kind = self._pending[-1]
                budget = self._drain(bucket, kind, expired, budget)
                if budget == 0:
                    return expired
                self._pending.pop()
            due = self._next_bucket_due()
            if due is None or due > now:
                self._now = now
                self._compact_ring()
                return expired
            self._now = due
            self._detach(due)

    def _compact_ring(self) -> None:
        """Give back the memory of a ring bucket that keys have moved out of.

        A dict never shrinks when keys are deleted. Under the eager policy every keepalive moves its key out
        of a bucket, so a bucket's table stays sized for every key that passed through it until the bucket
        comes due. Once per advance, one bucket left holding few keys in a big table is rebuilt: the work is
        bounded (``_COMPACT_MAX_KEYS`` re-pointed keys), so it never becomes a stall of its own.
        """
        # The ring's buckets, then the full ones set aside in its slots (not the parking ones: their values
        # are deadlines, which a rebuild with fromkeys would lose).
        for buckets in (self._ring, *self._full[:self._n0]):
            for index, bucket in enumerate(buckets):
                if len(bucket) <= _COMPACT_MAX_KEYS and sys.getsizeof(bucket) > _COMPACT_MIN_BYTES:
                    fresh: Bucket = dict.fromkeys(bucket)
                    for key in fresh:
                        self.entries[key].place = fresh
                    buckets[index] = fresh
                    return

    def _detach(self, t: int) -> None:
        """Queue every bucket that comes due at tick ``t`` (the clock is already at ``t``)."""
        index = t % self._n0
        full, pending = self._full, self._pending
        # _pending is a stack: the parking buckets go under the ring buckets, so they are drained after them.
        if self._parked[index]:
            pending.append((self._parked[index], _CASCADE))
            self._parked[index] = {}
        if full[self._n0 + index]:
            pending.extend((bucket, _CASCADE) for bucket in full[self._n0 + index] if bucket)
            full[self._n0 + index] = []
        if self._ring[index]:
            pending.append((self._ring[index], _RING))
            self._ring[index] = {}
        if full[index]:
            pending.extend((bucket, _RING) for bucket in full[index] if bucket)
            full[index] = []
        for level in self._levels:
            if t % level.width:
                break  # widths nest: not a boundary here means not one at any coarser level
            index = (t // level.width) % level.n
            if level.buckets[index]:
                self._pending.append((level.buckets[index], _CASCADE))
                level.buckets[index] = {}

    def _drain(self, bucket: Bucket, kind: int, expired: list[Entry], budget: int) -> int:
        """Process keys of one detached bucket until it is empty or ``budget`` keys were examined."""
        now, entries, n0, ring, cap = self._now, self.entries, self._n0, self._ring, self._cap
        lazy = self.policy == "lazy"
        before = len(expired)
        while bucket and budget:
            budget -= 1
            key, filed = bucket.popitem()
            entry = entries[key]
            if lazy:
                deadline = entry.tick + entry.timeout
            elif kind == _RING:
                deadline = now  # eager ring buckets are exact: everything in a due one is due
            else:
                deadline = filed  # type: ignore[assignment]  # parking and overflow buckets hold the deadline
            if deadline <= now:
                del entries[key]
                entry.place = None
                expired.append(entry)
            elif deadline - now <= n0:  # inline ring filing: the common lazy re-file
                target = ring[deadline % n0]
                if len(target) >= cap:
                    target = self._spill(ring, deadline % n0, deadline % n0)
                target[key] = None
                entry.place = target
            else:
                self._file(entry, deadline)
        self._expired_total += len(expired) - before
        return budget

    # -- observation ------------------------------------------------------------------------------------

    def stats(self) -> DetectorStats:
        full = self._full
        sizes = [len(bucket) + sum(map(len, full[index])) for index, bucket in enumerate(self._ring)]
        overflow = sum(len(bucket) for level in self._levels for bucket in level.buckets)
        return DetectorStats(
            keys=len(self.entries),
            slots=self._n0,
            occupied_slots=sum(1 for size in sizes if size),
            largest_slot=max(sizes),
            overflow_keys=overflow,
            overflow_levels=len(self._levels),
            expired_total=self._expired_total,
        )
