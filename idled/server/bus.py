"""The event bus: presence events, in seq order, to the log writer and to every subscribed observer.

Theory of operation
-------------------
``publish(event)`` is synchronous and never blocks, so the order in which the presence table assigned
``seq`` is the order everything downstream sees: no task switch can slip in between. It

1. queues the record for the log writer (an unbounded trio channel: the bound is enforced *before* state
   changes, by producers awaiting ``room()``; so a full disk slows logins and expiry down -- backpressure --
   and never drops or reorders an event);
2. encodes the observer frame once and offers it to each live observer's bounded queue; an observer whose
   queue is full has fallen behind: it is disconnected (``busy``), and can come back with
   ``subscribe from=<last seq + 1>`` to resume without a gap;
3. keeps the frame in a window of recent events, from which a resuming observer is served before the disk.

Replay (``subscribe from=N``): the observer is registered live *first* (so it gets every seq from
``live_from`` on), and the range ``[N, live_from)`` is replayed before its live queue is drained: from the
log on disk for what is older than the window, then from a snapshot of the window. Nothing is lost at the
seam and nothing is sent twice.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from idled.core.presence import PresenceEvent
from idled.protocol import Event, encode

log = logging.getLogger("idled.server.bus")

RECENT_EVENTS = 100_000  # replay window kept in memory (~100 B a frame: ~10 MB)
LOG_BACKLOG_LIMIT = 50_000  # producers wait in room() while more records than this await the writer
OBSERVER_QUEUE = 65_536  # frames an observer may lag behind before it is disconnected


def event_frame(record: dict[str, Any]) -> bytes:
    """The wire frame observers receive for one event record (live and replayed alike)."""
    extra = {key: record[key] for key in ("timeout", "detector") if key in record}
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
    """One observer's place in the stream: a bounded queue of frames, plus what to replay first."""

    __slots__ = ("send", "receive", "live_from", "replay_from", "on_overflow")

    def __init__(self, on_overflow: Callable[[], None], queue: int = OBSERVER_QUEUE) -> None:
        self.send, self.receive = trio.open_memory_channel[bytes](queue)
        self.live_from = 0
        self.replay_from: int | None = None
        self.on_overflow = on_overflow


class EventBus:
    def __init__(self, *, on_event: Callable[[PresenceEvent], None] | None = None) -> None:
        self.log_send, self.log_receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._recent: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=RECENT_EVENTS)
        self._subscriptions: set[Subscription] = set()
        self._on_event = on_event
        self._closed = False

    # -- producing ----------------------------------------------------------------------------------

    def publish(self, event: PresenceEvent) -> None:
        record = event.record()
        if not self._closed:
            self.log_send.send_nowait(record)
        if self._on_event is not None:
            self._on_event(event)
        frame = event_frame(record)
        self._recent.append((event.seq, frame))
        for subscription in list(self._subscriptions):
            try:
                subscription.send.send_nowait(frame)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscriptions.discard(subscription)
                subscription.on_overflow()

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

    def subscribe(self, subscription: Subscription, next_seq: int, from_seq: int | None) -> None:
        """Go live at ``next_seq`` (the seq the next event will get); replay ``[from_seq, next_seq)`` first."""
        subscription.live_from = next_seq
        subscription.replay_from = None if from_seq is None or from_seq >= next_seq else from_seq
        self._subscriptions.add(subscription)

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)

    def recent_from(self, seq: int, below: int) -> tuple[int, list[bytes]]:
        """(first seq held in the window at or after ``seq``, frames for ``[that, below)``)."""
        if not self._recent or self._recent[-1][0] < seq:
            return below, []
        start = max(seq, self._recent[0][0])
        offset = start - self._recent[0][0]
        # Seqs in the window are consecutive, so a seq's offset is arithmetic.
        frames = [frame for s, frame in itertools.islice(self._recent, offset, None) if s < below]
        return start, frames

    def is_subscribed(self, subscription: Subscription) -> bool:
        return subscription in self._subscriptions

    def oldest_recent(self) -> int | None:
        return self._recent[0][0] if self._recent else None

    def undelivered(self) -> int:
        """Frames queued to observers and not yet sent."""
        return sum(s.send.statistics().current_buffer_used for s in self._subscriptions)

