"""The event bus: presence events, in seq order, to the log writer and to every subscribed observer.

Theory of operation
-------------------
``publish(event)`` is synchronous and never blocks, so the order in which the presence table assigned
``seq`` is the order everything downstream sees: no task switch can slip in between. It

1. queues the record for the log writer (an unbounded trio channel: the bound, ``max_backlog``, is enforced
   *before* state changes, by producers awaiting ``room()``; so a slow disk slows logins and expiry down --
   backpressure -- and never drops or reorders an event; on a full disk the writer stops taking records and
   they wait here, in seq order, until it can write again: ``idled.server.engine.degraded``);
2. encodes the observer frame once and stores it in the *window*: the last ``RECENT_EVENTS`` frames, packed
   in pages (``idled.server.engine.window``; seqs within a run are consecutive, so a seq's place is
   arithmetic and taking a batch from any position costs only the batch);
3. wakes the live subscribers.

Observers pull; the bus pushes nothing into per-observer queues. A ``Subscription`` is a *cursor* (the next
seq to send that observer) plus a wake-up; each observer's sender task takes frames ``[cursor, limit)`` from
the window, or from the log on disk once the cursor is older than the window, and moves the cursor when the
write is done. So an observer costs no memory per event however far behind it is, a burst of any size
(80k attaches in one gateway frame, 100k offlines in one tick) cuts no observer that keeps reading --
it just reads further back -- and no observer can slow down a producer. ``limit`` is ``next_seq`` (every
published event), or ``durable_seq + 1`` for a *durable* subscription: only events the writer has reported
durable under the fsync policy (``durable_to``, the writer's ``on_durable``), like a Kafka consumer reading
up to the high watermark.

Synchronous standbys (``--sync-standby``)
-----------------------------------------
The bus keeps two watermarks. ``log_durable_seq`` is what the writer reported (``durable_to``): the log
replication feed (``idled.server.ha.feed``, a *feed* subscription: ``subscribe(..., feed=True)``) reads
up to it. ``durable_seq`` is what durable subscribers are told, and what anything else calling an event
durable means: the same, unless a synchronous standby is attached (``sync_to(acked)``), in which case it is
``min(log_durable_seq, acked)`` -- an event is durable once it is on this disk *and* on the standby's. The
feed cannot wait for the standby's acknowledgement of what the feed has yet to send it (a deadlock), hence
two. ``sync_to(None)`` (no sync standby) lets ``durable_seq`` catch up with the log at once. It never moves
back: a standby attaching with an older ack holds the watermark where it is until its acks pass it.

Replay (``subscribe from=N``) is the same thing: the cursor starts at ``N`` instead of ``next_seq``, and the
sender reads from disk, then the window, then keeps up live. Nothing is lost at a seam and nothing is sent
twice, because there is no seam: one cursor walks one sequence.

Watchlists
----------
A *watchlist* subscription (``subscribe uids=[...]``) wants only the events of its uids. Walking the shared
window would cost it every published event; instead the bus keeps an index ``uid -> (subscriptions,)`` and,
while any watchlist subscription exists (one truth test per publish, the only cost full-stream observers
see), ``publish`` looks the event's uid up once and appends ``(seq, frame)`` to each matching subscription's
own *queue*. So a watchlist observer costs work in proportion to its matches, not to the event rate.

The queue is bounded in bytes (``WATCH_QUEUE_BYTES``). Its contents are defined by two seqs: it holds every
match published from ``live_from`` on, up to ``stop_at`` if it overflowed (None: still filling). An event
that would overflow it sets ``stop_at`` to its seq and stops the filling: nothing is dropped silently --
the sender drains the queue, then *replays* from ``stop_at``, reading the shared window (or the disk)
filtered by uid, exactly like a ``subscribe from=N``; once the replay reaches the window it starts the
queue again with ``live_from = next_seq`` and replays the rest up to there. At subscribe, ``live_from`` is
``next_seq`` and the replay covers ``[from, live_from)``. Publish is synchronous and the switches happen
between publishes, so every match is either below ``live_from`` (replayed) or in the queue (never both):
no gap, no duplicate. The seqs an observer skips are not gaps; it still receives its events in seq order.

While watchlist subscriptions exist the bus also keeps each event's uid in a ring beside the window's
(``uids_from`` on), so a filtered replay from the window tests membership without decoding frames; older
frames (published before the first watchlist observer came) are decoded to read their uid.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack
import trio

from idled.core.presence import PresenceEvent
from idled.protocol import Event, Uid, encode
from idled.server.engine.window import FrameWindow

__all__ = ["LOG_BACKLOG_LIMIT", "RECENT_EVENTS", "WATCH_QUEUE_BYTES", "EventBus", "Subscription", "event_frame"]

log = logging.getLogger("idled.server.engine.bus")

RECENT_EVENTS = 100_000  # frames kept in memory (~150 B a frame, packed: ~15 MB), shared by every observer
LOG_BACKLOG_LIMIT = 50_000  # producers wait in room() while more records than this await the writer (the default)
WATCH_QUEUE_BYTES = 1 << 20  # frame bytes a watchlist subscription's own queue holds before it replays instead


_EXTRA_KEYS = ("timeout", "detector", "device", "grace", "note")


def event_frame(record: dict[str, Any]) -> bytes:
    """The wire frame observers receive for one event record (live and replayed alike)."""
    # "device", "grace" and "note" only on events that have them (idled.core.presence): older records, and every event
    # of a client that sends no device, encode to the very frames they did before.
    extra: dict[str, Any] = {key: record[key] for key in _EXTRA_KEYS if key in record}
    return encode(
        Event(
            record["seq"],
            record["kind"],
            record["uid"],
            record["ts"],
            record["reason"],
            record["last_seen"],
            record["deadline"],
            extra or None,
        )
    )


def frame_uid(frame: bytes) -> Uid:
    """The uid of an event frame (a filtered replay of frames older than the uid ring)."""
    uid: Uid = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)["uid"]
    return uid


class Subscription:
    """One observer's place in the stream: ``cursor`` (next seq to send; None until subscribed), whether it
    reads only durable events, and the wake-up its sender task sleeps on.

    A watchlist subscription also has ``watching`` (its uids, as its requests left them: None for a
    full-stream one) and its queue: ``queue`` of ``(seq, frame)``, ``queue_bytes``, and the seqs it covers,
    ``live_from`` (None: not filling; the sender replays) and ``stop_at`` (the seq that overflowed it)."""

    __slots__ = ("cursor", "durable", "feed", "_wakeup", "watching", "queue", "queue_bytes", "live_from", "stop_at")

    def __init__(self) -> None:
        self.cursor: int | None = None
        self.durable = False
        self.feed = False  # the replication feed: up to the log's durable seq (see the module docstring)
        self._wakeup = trio.Event()
        self.watching: set[Uid] | None = None
        self.queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self.queue_bytes = 0
        self.live_from: int | None = None
        self.stop_at: int | None = None

    def push(self, seq: int, frame: bytes) -> None:
        """A match, at publish time (see the module docstring)."""
        if self.stop_at is None and self.live_from is not None:
            size = self.queue_bytes + len(frame)
            if size > WATCH_QUEUE_BYTES and self.queue:
                self.stop_at = seq  # from here on the sender replays: nothing is dropped
            else:
                self.queue.append((seq, frame))
                self.queue_bytes = size
            self._wakeup.set()

    def pending(self, limit: int) -> int:
        """A watchlist subscription's undelivered events below ``limit``: its queued ones, and the seqs it has
        yet to replay (an upper bound: those are filtered when read)."""
        cursor = self.cursor
        if cursor is None:
            return 0
        live_from, stop_at = self.live_from, self.stop_at
        queued = sum(1 for seq, _ in self.queue if seq < limit)
        replay = max(0, min(limit, live_from) - cursor) if live_from is not None else max(0, limit - cursor)
        if stop_at is not None and not self.queue:
            replay += max(0, limit - max(cursor, stop_at))
        return queued + replay

    def wake(self) -> None:
        """Something new for the sender: events, durability, a reply."""
        self._wakeup.set()

    async def wait(self) -> None:
        """Sleep until the next ``wake``. The caller has just found nothing to do; with no checkpoint between
        that look and this call, no wake-up can fall in between."""
        self._wakeup = trio.Event()
        await self._wakeup.wait()


class EventBus:
    """``max_backlog`` (``LOG_BACKLOG_LIMIT``, read when the bus is made, so tests can shrink it): records
    awaiting the writer beyond which producers wait in ``room()``. It stays below what the window holds
    (``RECENT_EVENTS`` less at most one page), so an observer behind the window reads what is already
    written."""

    def __init__(self, *, on_event: Callable[[PresenceEvent], None] | None = None) -> None:
        self.max_backlog = LOG_BACKLOG_LIMIT
        self.log_stalled = False  # the writer cannot write now (a full disk): nothing waits for it to catch up
        self.log_send, self.log_receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._size = RECENT_EVENTS  # read here, so tests can shrink the module constant before a server starts
        self._recent = FrameWindow(self._size)  # its ``next``: the seq of the next event (set by start())
        self.durable_seq = 0  # highest seq durable subscribers may be sent (see "Synchronous standbys")
        self.log_durable_seq = 0  # highest seq the writer reported durable
        self.sync_acked: int | None = None  # a synchronous standby's acknowledged seq; None: none attached
        self._live: set[Subscription] = set()
        self._durable: set[Subscription] = set()
        self._feeds: set[Subscription] = set()
        self._on_event = on_event
        self._closed = False
        # Watchlists (see the module docstring): the subscriptions, the index, and the uid ring.
        self._watchers: set[Subscription] = set()
        self._index: dict[Any, tuple[Subscription, ...]] = {}  # Uid -> watching subscriptions
        self._uids: list[Any] = []  # Uid, or None where not yet written
        self.uids_from: int | None = None  # the uid ring holds the uid of every seq from here on

    def start(self, first_seq: int) -> None:
        """This run's events begin at ``first_seq``; everything before it was recovered from disk, so it is as
        durable as it will ever be (a crash between runs may leave a gap of seqs that never existed)."""
        if not self._recent:
            self._recent.next = first_seq
        self.log_durable_seq = max(self.log_durable_seq, first_seq - 1)
        self.durable_seq = max(self.durable_seq, first_seq - 1)

    # -- producing ----------------------------------------------------------------------------------

    def publish(self, event: PresenceEvent) -> None:
        record = event.record()
        if not self._closed:
            try:
                self.log_send.send_nowait(record)
            except trio.BrokenResourceError:
                # The writer has stopped on a fatal log error, which is ending the daemon. Nothing more is
                # recorded (the next start closes what stays open with `restart`); the producer -- a user's
                # bye in the user plane, say -- is not at fault and goes on, and so do live observers.
                self._closed = True
        if self._on_event is not None:
            self._on_event(event)
        self._window(event.seq, record["uid"], record)

    def relay(self, record: dict[str, Any]) -> None:
        """A standby's record, already in its log (``idled.server.ha.follow``): to the observers only."""
        self._window(record["seq"], record["uid"], record)

    def _window(self, seq: int, uid: Uid, record: dict[str, Any]) -> None:
        frame = event_frame(record)
        self._recent.append(seq, frame)  # (a seq out of turn -- a standby's gap -- restarts the window: never lies)
        for subscription in self._live:
            subscription.wake()
        if self._watchers:
            self._uids[seq % self._size] = uid
            watching = self._index.get(uid)
            if watching is not None:
                for subscription in watching:
                    subscription.push(seq, frame)

    def durable_to(self, seq: int) -> None:
        """The writer's ``on_durable``: every seq up to ``seq`` is durable under the fsync policy."""
        if seq > self.log_durable_seq:
            self.log_durable_seq = seq
            for subscription in self._feeds:
                subscription.wake()
            self._advance()

    def sync_to(self, acked: int | None) -> None:
        """The synchronous standby's acknowledged seq, or None: none is attached (see the module docstring)."""
        self.sync_acked = acked
        self._advance()

    def _advance(self) -> None:
        acked = self.sync_acked
        seq = self.log_durable_seq if acked is None else min(self.log_durable_seq, acked)
        if seq > self.durable_seq:
            self.durable_seq = seq
            for subscription in self._durable:
                subscription.wake()

    @property
    def log_closed(self) -> bool:
        """No more records reach the writer (shutdown, or the writer stopped on a fatal log error)."""
        return self._closed

    def backlog(self) -> int:
        """Records queued for the writer, not taken yet."""
        return self.log_send.statistics().current_buffer_used

    def full(self) -> bool:
        """The backlog is over its limit (``room()`` would wait)."""
        return self.backlog() > self.max_backlog

    async def room(self) -> None:
        """Wait while the log writer is too far behind (backpressure on whoever changes presence)."""
        while not self._closed and self.full():
            await trio.sleep(0.005)

    def close_log(self) -> None:
        """No more records for the writer: it drains what is queued, syncs and returns."""
        self._closed = True
        self.log_send.close()

    # -- observers ----------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._recent.next

    def subscribe(self, subscription: Subscription, from_seq: int | None, *, durable: bool = False,
                  feed: bool = False) -> None:
        """Start ``subscription`` at ``from_seq`` (None: the next event). A subscription whose ``watching`` is
        set (by ``watch``, before this call) is a watchlist one: its queue fills from the next event on.
        ``feed``: the replication feed, woken as the log's durability advances (not the sync standby's)."""
        subscription.cursor = self._recent.next if from_seq is None else from_seq
        subscription.durable = durable or feed
        subscription.feed = feed
        if feed:
            self._feeds.add(subscription)
        elif subscription.watching is not None:
            subscription.live_from = self._recent.next
            if durable:
                self._durable.add(subscription)  # woken as durability advances, not per event
        else:
            (self._durable if durable else self._live).add(subscription)
        subscription.wake()

    def unsubscribe(self, subscription: Subscription) -> None:
        self._live.discard(subscription)
        self._durable.discard(subscription)
        self._feeds.discard(subscription)
        if subscription.watching is not None:
            self.unwatch(subscription, list(subscription.watching))
            self._watchers.discard(subscription)
            subscription.watching = None
            subscription.queue.clear()
            subscription.queue_bytes = 0
            if not self._watchers:
                self.uids_from = None
                self._uids = []

    def is_subscribed(self, subscription: Subscription) -> bool:
        return subscription.cursor is not None and (
            subscription in self._live or subscription in self._durable or subscription in self._watchers
            or subscription in self._feeds)

    # -- watchlists ---------------------------------------------------------------------------------

    def watch(self, subscription: Subscription, uids: Iterable[Uid]) -> list[Uid]:
        """Add ``uids`` to ``subscription``'s watchlist (making it a watchlist subscription); the index has them
        from the next event on. Returns the uids that were not watched yet, in order."""
        if subscription.watching is None:
            subscription.watching = set()
            if not self._watchers:
                self._uids = [None] * self._size
                self.uids_from = self._recent.next
            self._watchers.add(subscription)
        watching, index = subscription.watching, self._index
        added = []
        for uid in uids:
            if uid not in watching:
                watching.add(uid)
                index[uid] = index.get(uid, ()) + (subscription,)
                added.append(uid)
        return added

    def unwatch(self, subscription: Subscription, uids: Iterable[Uid]) -> list[Uid]:
        """Remove ``uids`` from the watchlist; returns those that were watched, in order."""
        watching, index = subscription.watching, self._index
        if watching is None:
            return []
        removed = []
        for uid in uids:
            if uid in watching:
                watching.discard(uid)
                rest = tuple(s for s in index[uid] if s is not subscription)
                if rest:
                    index[uid] = rest
                else:
                    del index[uid]
                removed.append(uid)
        return removed

    def watched_frames(self, start: int, below: int, max_bytes: int, max_scan: int, watching: set[Uid],
                       override: Mapping[Uid, bool] | None = None) -> tuple[list[bytes], int]:
        """The frames of seqs ``[start, below)`` in the window whose uid is watched -- in ``watching``, unless
        ``override`` says otherwise for that uid -- stopping once ``max_bytes`` are taken or ``max_scan`` seqs
        were looked at; and the seq to go on from. ``start`` must be in the window."""
        self._check_held(start)
        recent, uids, size = self._recent, self._uids, self._size
        uids_from = self.uids_from if self.uids_from is not None else self._recent.next
        stop = min(below, self._recent.next, start + max_scan)
        out: list[bytes] = []
        taken = 0
        for seq in range(start, stop):
            frame = recent.get(seq) if seq < uids_from else None  # (its uid is in no ring: read from the frame)
            uid = uids[seq % size] if frame is None else frame_uid(frame)
            if (uid in watching) if override is None or uid not in override else override[uid]:
                frame = frame if frame is not None else recent.get(seq)
                out.append(frame)
                taken += len(frame)
                if taken >= max_bytes:
                    return out, seq + 1
        return out, stop

    def limit(self, subscription: Subscription) -> int:
        """One past the last seq ``subscription`` may be sent now."""
        if subscription.durable:
            return min(self._recent.next, (self.log_durable_seq if subscription.feed else self.durable_seq) + 1)
        return self._recent.next

    def oldest_recent(self) -> int | None:
        """The oldest seq in the window (None: empty)."""
        return self._recent.oldest()

    def _check_held(self, start: int) -> None:
        if not self._recent.holds(start):
            raise ValueError(f"seq {start} is not in the window [{self._recent.oldest()}, {self._recent.next})")

    def frames(self, start: int, below: int, max_bytes: int) -> list[bytes]:
        """Frames for seqs ``[start, below)`` from the window, stopping once ``max_bytes`` are taken (at least
        one frame). ``start`` must be in the window."""
        self._check_held(start)
        recent = self._recent
        out: list[bytes] = []
        taken = 0
        for seq in range(start, min(below, recent.next)):
            frame = recent.get(seq)
            out.append(frame)
            taken += len(frame)
            if taken >= max_bytes:
                break
        return out

    def undelivered(self) -> int:
        """Events observers may be sent now and have not been sent yet (for watchlist subscriptions, an upper
        bound: the seqs they have yet to replay count, matching or not). Durable subscribers count up to the
        log's durable seq: what a sync standby has yet to acknowledge is on its way to them too (a clean stop
        waits for it)."""
        total = 0
        for subscription in (*self._live, *self._durable, *self._feeds):
            if subscription.cursor is not None and subscription.watching is None:
                total += max(0, self._pending_limit(subscription) - subscription.cursor)
        for subscription in self._watchers:
            total += subscription.pending(self._pending_limit(subscription))
        return total

    def _pending_limit(self, subscription: Subscription) -> int:
        return min(self._recent.next, self.log_durable_seq + 1) if subscription.durable else self._recent.next
