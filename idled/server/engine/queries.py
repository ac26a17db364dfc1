"""An observer's ``query``: who of these uids is online, and with ``last_seen: true`` since when.

Theory of operation
-------------------
A plain query reads the presence table. Last seen (``query`` with ``last_seen: true``): an online user's
answer is its latest activity (``PresenceTable.last_activity``: the latest over its sessions, on the server
clock, turned into wall time as events are: ``wall - (now - seen)``); an offline user's is the event log's
last-seen map (`idled.log.lastseen`, ``EventLog.last_seen``), which the log writer updates as it appends each
record. So such a query is answered once the writer has appended every event published before it
(``written``: usually at once; else a few ms, bounded by ``LAST_SEEN_WAIT``): a user who has just gone
offline is answered with that offline's ``last_seen``, not an older one -- unless the log cannot be written
now (a full disk: ``EventBus.log_stalled``), when the answer comes at once, from what the log has.

The observer role (``idled.server.roles.observers``) queues the answer among its replies, to go out once every
event published before the query has been sent.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from idled.core.presence import PresenceTable
from idled.log.eventlog import EventLog
from idled.protocol import Query, Status, Uid, encode
from idled.server.engine.bus import EventBus
from idled.server.runtime.clock import WallClock

__all__ = ["LAST_SEEN_WAIT", "Queries"]

LAST_SEEN_WAIT = 5.0  # seconds a last_seen query waits at most for the writer (then answers from what it has)
WRITTEN_POLL = 0.002  # seconds between two looks at the log while a last_seen query waits for the writer


class Queries:
    """Answers queries. ``first_seq``: this run's first seq; ``clock``: the presence table's clock (the
    server's pause-adjusted one); ``wall``: the server's wall clock (``Clock.wall``; None: one of its own)."""

    def __init__(self, presence: PresenceTable, bus: EventBus, log: EventLog, *, first_seq: int,
                 clock: Callable[[], float], wall: Callable[[], float] | None = None) -> None:
        self.presence = presence
        self.bus = bus
        self.log = log
        self.first_seq = first_seq
        self.clock = clock
        self.wall = WallClock() if wall is None else wall

    async def answer(self, query: Query) -> bytes:
        """The reply frame to ``query``."""
        if query.last_seen:
            await self.written(self.bus.next_seq)
            return encode(self.status_with_last_seen(query.uids))
        presence = self.presence
        return encode(Status({uid: presence.is_online(uid) for uid in query.uids}))

    def status_with_last_seen(self, uids: tuple[Uid, ...]) -> Status:
        """The reply to a query with ``last_seen`` (see the module docstring)."""
        presence, log = self.presence, self.log
        wall, now = self.wall(), self.clock()
        online: dict[Uid, bool] = {}
        last_seen: dict[Uid, float | None] = {}
        devices: dict[Uid, tuple[str, ...]] = {}
        for uid in uids:
            seen = presence.last_activity(uid)
            if seen is not None:
                online[uid] = True
                last_seen[uid] = wall - (now - seen)
                if names := presence.devices_of(uid):
                    devices[uid] = names
            elif (graced := presence.grace_last_seen(uid)) is not None:
                online[uid] = True  # its offline waits out the grace: online, last seen when its session ended
                last_seen[uid] = graced
            else:
                online[uid] = False
                last_seen[uid] = log.last_seen(uid, wall)
        return Status(online, last_seen, devices)

    async def written(self, below: int) -> None:
        """Wait (at most LAST_SEEN_WAIT) until the log has appended every event of this run with a seq below
        ``below``. (The previous runs' are on disk; after a crash this run's first seq may lie past a gap of
        seqs nobody will ever write: see idled.server.engine.seqs.)"""
        log = self.log
        if below <= self.first_seq or log.last_seq + 1 >= below or self.bus.log_stalled:
            return
        with trio.move_on_after(LAST_SEEN_WAIT):
            while log.last_seq + 1 < below and not self.bus.log_closed and not self.bus.log_stalled:
                await trio.sleep(WRITTEN_POLL)
