"""Watchlist observers: the requests (``subscribe uids=[...]``, ``watch``, ``unwatch``) and what an observer's
sender sends for a watchlist subscription. The observer role (``idled.server.roles.observers``) calls them.

Theory of operation
-------------------
The bus fills the observer's own bounded queue with its matches at publish time (``idled.server.engine.bus``: the
index, the queue's ``live_from`` and ``stop_at``); ``next_frames`` takes the sender's next frames from that
queue, or -- for the seqs before the queue's ``live_from``, and after an overflow -- replays the window or the
disk filtered by uid (``WATCH_SCAN`` seqs of the window at a time, so a long replay lets other tasks run).
``skip_quiet`` moves the cursor within the queue's part over the seqs that are not its own.

A ``watch``/``unwatch`` changes the index at once (it applies to every event published after it was read) and
is queued among the replies as a ``Change`` with the same horizon as a reply to a request read then: the
replay filter sees the change only once the cursor has passed it (``before_changes``), so the events before a
``watch`` follow the old list and a ``ping`` after it is answered once it applies. ``watch`` before
``subscribe`` builds the list the subscribe starts with (a list too big for one frame is sent as watch
frames, then ``subscribe``), which then must carry ``uids``. At most ``max_watch`` uids per observer
(``DEFAULT_MAX_WATCH``; ``not_allowed`` beyond it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from idled.protocol import ErrorCode, ProtocolError, Uid, Unwatch, Watch
from idled.server.engine.bus import EventBus, Subscription

__all__ = ["DEFAULT_MAX_WATCH", "WATCH_SCAN", "Change", "before_changes", "next_frames", "request", "skip_quiet",
           "subscribing"]

DEFAULT_MAX_WATCH = 100_000  # uids in one observer's watchlist (the max_watch setting)
WATCH_SCAN = 4096  # seqs of the window a filtered replay looks at before it lets other tasks run


class Change:
    """A watchlist change among the replies: ``added`` (watch) or not (unwatch) ``uids``, each of which it
    really changed. Until the cursor passes it, the replay filter sees the list as it was before it."""

    __slots__ = ("added", "uids")

    def __init__(self, added: bool, uids: list[Uid]) -> None:
        self.added = added
        self.uids = uids

    @property
    def size(self) -> int:
        """What it counts against the observer's reply bytes: about what its frame took."""
        return 64 + 16 * len(self.uids)


class FromDisk(Protocol):
    """The observer's disk replay: frames of the records from ``cursor`` (below ``below``) whose uid passes
    ``watched``, and the cursor after them."""

    def __call__(self, cursor: int, below: int, watched: Callable[[Uid], bool]) -> Awaitable[tuple[list[bytes], int]]:
        ...


# -- requests -----------------------------------------------------------------------------------------------


def subscribing(bus: EventBus, subscription: Subscription, uids: tuple[Uid, ...] | None, max_watch: int) -> None:
    """A ``subscribe``'s watchlist: ``uids`` join the list (which ``watch`` frames may have begun); without
    ``uids`` there must be no list."""
    if uids is not None:
        _add(bus, subscription, uids, max_watch)
    elif subscription.watching is not None:
        raise ProtocolError(ErrorCode.NOT_ALLOWED, "this observer has a watchlist (watch came first): "
                            "subscribe with uids (an empty array keeps the list as it is)")


def request(bus: EventBus, subscription: Subscription, message: Watch | Unwatch, max_watch: int) -> Change | None:
    """Apply a ``watch`` or ``unwatch`` to the index at once. Once subscribed, the ``Change`` to queue among
    the replies (None: nothing changed, or not subscribed yet, so no replay can cross it)."""
    subscribed = bus.is_subscribed(subscription)
    if subscribed and subscription.watching is None:
        raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} needs a watchlist: "
                            "this observer subscribed to every event (subscribe with uids for one)")
    if type(message) is Watch:
        changed = _add(bus, subscription, message.uids, max_watch)
    else:
        changed = bus.unwatch(subscription, message.uids) if subscription.watching is not None else []
        if subscription.watching is None:
            bus.watch(subscription, ())  # an unwatch first makes a watchlist observer too
    return Change(type(message) is Watch, changed) if changed and subscribed else None


def _add(bus: EventBus, subscription: Subscription, uids: Iterable[Uid], max_watch: int) -> list[Uid]:
    """Add to the watchlist, within ``max_watch``; the uids it added."""
    watching = subscription.watching or ()
    new = {uid for uid in uids if uid not in watching}
    if len(watching) + len(new) > max_watch:
        raise ProtocolError(ErrorCode.NOT_ALLOWED, f"a watchlist of {len(watching) + len(new)} uids is beyond "
                            f"the limit max_watch={max_watch}")
    return bus.watch(subscription, uids)


# -- the sender's side --------------------------------------------------------------------------------------


def before_changes(replies: Iterable[tuple[int, object]]) -> dict[Uid, bool]:
    """uid -> watched before the changes queued among ``replies``, for each uid they touch (the earliest one
    tells)."""
    before: dict[Uid, bool] = {}
    for _, entry in replies:
        if type(entry) is Change:
            for uid in entry.uids:
                before.setdefault(uid, not entry.added)
    return before


def skip_quiet(bus: EventBus, subscription: Subscription) -> None:
    """Move a watchlist cursor within its queue's part over the seqs that are not its own: up to the next
    queued match, or to where the queue's coverage ends. At the end of an overflowed queue, leave it: the
    sender replays from ``stop_at`` on."""
    live_from, cursor = subscription.live_from, subscription.cursor
    if live_from is None or cursor is None or cursor < live_from:
        return
    queue, stop_at = subscription.queue, subscription.stop_at
    target = queue[0][0] if queue else bus.next_seq if stop_at is None else stop_at
    target = min(target, bus.limit(subscription))
    if target > cursor:
        subscription.cursor = cursor = target
    if not queue and stop_at is not None and cursor >= stop_at:
        subscription.live_from = subscription.stop_at = None


async def next_frames(
    bus: EventBus, subscription: Subscription, cursor: int, limit: int, max_bytes: int,
    changes: Iterable[tuple[int, object]] | None, from_disk: FromDisk,
) -> tuple[list[bytes], int] | None:
    """A watchlist observer's next frames below ``limit`` (up to about ``max_bytes``) and the cursor after them
    (None: nothing to do now): from its queue, or replayed filtered from the window or the disk.
    ``changes``: the replies, while watchlist changes wait among them (else None)."""
    live_from = subscription.live_from
    if live_from is not None and cursor >= live_from:  # the queue's part; skip_quiet is at its head
        queue = subscription.queue
        if not queue or queue[0][0] >= limit:
            return None
        frames: list[bytes] = []
        size = seq = 0
        while queue and queue[0][0] < limit and size < max_bytes:
            seq, frame = queue.popleft()
            frames.append(frame)
            size += len(frame)
        subscription.queue_bytes -= size
        return frames, seq + 1
    oldest = bus.oldest_recent()
    if live_from is None and (oldest is None or cursor >= oldest):
        # The replay after an overflow has reached the window: fill the queue again from the next event,
        # and replay up to there (what is left is in the window, or reaches the writer).
        subscription.live_from = live_from = bus.next_seq
    end = limit if live_from is None else min(limit, live_from)
    if cursor >= end:
        return None
    watching = subscription.watching
    assert watching is not None
    before = before_changes(changes) if changes is not None else None
    if oldest is not None and cursor >= oldest:
        return bus.watched_frames(cursor, end, max_bytes, WATCH_SCAN, watching, before)
    watched: Callable[[Uid], bool]
    if before is None:
        watched = watching.__contains__
    else:
        watched = lambda uid: before[uid] if uid in before else uid in watching  # noqa: E731
    return await from_disk(cursor, end if oldest is None else min(end, oldest), watched)
