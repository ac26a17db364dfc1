"""The event bus: presence events, in seq order, to the log writer and to every subscribed observer.

Theory of operation
-------------------
``publish(event)`` is synchronous and never blocks, so the order in which the presence table assigned
``seq`` is the order everything downstream sees: no task switch can slip in between. It

1. queues the record for the log writer (an unbounded trio channel: the bound is enforced *before* state
   changes, by producers awaiting ``room()``; so a full disk slows logins and expiry down -- backpressure --
   and never drops or reorders an event);
2. encodes the observer frame once and stores it in the *window*: a ring of the last ``RECENT_EVENTS``
   frames, indexed by ``seq % RECENT_EVENTS`` (seqs within a run are consecutive, so a seq's place is
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

Replay (``subscribe from=N``) is the same thing: the cursor starts at ``N`` instead of ``next_seq``, and the
sender reads from disk, then the window, then keeps up live. Nothing is lost at a seam and nothing is sent
twice, because there is no seam: one cursor walks one sequence.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from idled.core.presence import PresenceEvent
from idled.protocol import Event, encode

__all__ = ["LOG_BACKLOG_LIMIT", "RECENT_EVENTS", "EventBus", "Subscription", "event_frame"]

log = logging.getLogger("idled.server.bus")

RECENT_EVENTS = 100_000  # frames kept in memory (~100 B a frame: ~10 MB), shared by every observer
LOG_BACKLOG_LIMIT = 50_000  # producers wait in room() while more records than this await the writer


_EXTRA_KEYS = ("timeout", "detector", "device", "grace")


def event_frame(record: dict[str, Any]) -> bytes:
    """The wire frame observers receive for one event record (live and replayed alike)."""
    # "device" and "grace" only on events that have them (idled.core.presence): older records, and every event
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


class Subscription:
    """One observer's place in the stream: ``cursor`` (next seq to send; None until subscribed), whether it
    reads only durable events, and the wake-up its sender task sleeps on."""

    __slots__ = ("cursor", "durable", "_wakeup")

    def __init__(self) -> None:
        self.cursor: int | None = None
        self.durable = False
        self._wakeup = trio.Event()

    def wake(self) -> None:
        """Something new for the sender: events, durability, a reply."""
        self._wakeup.set()

    async def wait(self) -> None:
        """Sleep until the next ``wake``. The caller has just found nothing to do; with no checkpoint between
        that look and this call, no wake-up can fall in between."""
        self._wakeup = trio.Event()
        await self._wakeup.wait()


class EventBus:
    def __init__(self, *, on_event: Callable[[PresenceEvent], None] | None = None) -> None:
        self.log_send, self.log_receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._size = RECENT_EVENTS  # read here, so tests can shrink the module constant before a server starts
        self._ring: list[bytes] = [b""] * self._size
        self._next = 0  # seq of the next event (set by start())
        self._count = 0  # frames in the window: seqs [_next - _count, _next)
        self.durable_seq = 0  # highest seq the writer reported durable
        self._live: set[Subscription] = set()
        self._durable: set[Subscription] = set()
        self._on_event = on_event
        self._closed = False

    def start(self, first_seq: int) -> None:
        """This run's events begin at ``first_seq``; everything before it was recovered from disk, so it is as
        durable as it will ever be (a crash between runs may leave a gap of seqs that never existed)."""
        if not self._count:
            self._next = first_seq
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
        seq = event.seq
        if seq != self._next:  # never within a run; if it happens, the window restarts rather than lie
            self._count = 0
        self._ring[seq % self._size] = event_frame(record)
        self._next = seq + 1
        if self._count < self._size:
            self._count += 1
        for subscription in self._live:
            subscription.wake()

    def durable_to(self, seq: int) -> None:
        """The writer's ``on_durable``: every seq up to ``seq`` is durable under the fsync policy."""
        if seq > self.durable_seq:
            self.durable_seq = seq
            for subscription in self._durable:
                subscription.wake()

    def backlog(self) -> int:
        return self.log_send.statistics().current_buffer_used

    async def room(self) -> None:
        """Wait while the log writer is too far behind (backpressure on whoever changes presence)."""
        while not self._closed and self.backlog() > LOG_BACKLOG_LIMIT:
            await trio.sleep(0.005)

    def close_log(self) -> None:
        """No more records for the writer: it drains what is queued, syncs and returns."""
        self._closed = True
        self.log_send.close()

    # -- observers ----------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._next

    def subscribe(self, subscription: Subscription, from_seq: int | None, *, durable: bool = False) -> None:
        """Start ``subscription`` at ``from_seq`` (None: the next event)."""
        subscription.cursor = self._next if from_seq is None else from_seq
        subscription.durable = durable
        (self._durable if durable else self._live).add(subscription)
        subscription.wake()

    def unsubscribe(self, subscription: Subscription) -> None:
        self._live.discard(subscription)
        self._durable.discard(subscription)

    def is_subscribed(self, subscription: Subscription) -> bool:
        return subscription in self._live or subscription in self._durable

    def limit(self, subscription: Subscription) -> int:
        """One past the last seq ``subscription`` may be sent now."""
        return min(self._next, self.durable_seq + 1) if subscription.durable else self._next

    def oldest_recent(self) -> int | None:
        """The oldest seq in the window (None: empty)."""
        return self._next - self._count if self._count else None

    def frames(self, start: int, below: int, max_bytes: int) -> list[bytes]:
        """Frames for seqs ``[start, below)`` from the window, stopping once ``max_bytes`` are taken (at least
        one frame). ``start`` must be in the window."""
        oldest = self._next - self._count
        if not (self._count and oldest <= start < self._next):
            raise ValueError(f"seq {start} is not in the window [{oldest}, {self._next})")
        ring, size = self._ring, self._size
        out: list[bytes] = []
        taken = 0
        for seq in range(start, min(below, self._next)):
            frame = ring[seq % size]
            out.append(frame)
            taken += len(frame)
            if taken >= max_bytes:
                break
        return out

    def undelivered(self) -> int:
        """Events observers may be sent now and have not been sent yet."""
        total = 0
        for subscription in (*self._live, *self._durable):
            if subscription.cursor is not None:
                total += max(0, self.limit(subscription) - subscription.cursor)
        return total
