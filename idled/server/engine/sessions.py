"""Sessions: the presence table as the connection roles (users, gateways) and the tick task change it.

Theory of operation
-------------------
Every change of presence follows the same steps, and this is the one object that knows them:

1. ``await room()`` before a burst of changes: the log writer is not too far behind (the bus's backpressure)
   and the seq reservation has headroom; a producer waits here, never after it has changed state. Observers
   never hold a producer up: each reads the bus's shared window (or the log) at its own pace;
2. ``refuse_if_stopping()`` (after the wait): once shutdown began no session may start -- ``end_all`` has run
   or is running, so nothing would end it and its online event would miss the closed log; and
   ``refuse_if_unavailable(key)`` (before the wait, and after it): while the server is degraded (a full disk:
   ``idled.server.engine.degraded``) no user may come online either, with ``unavailable`` -- but a login of a user
   online already (another connection of the same key, another device, a user within its offline grace) adds
   no event, and is taken, without the wait (*A login that adds nothing*, below). ``admit(key)`` is steps 1
   and 2 in their order, for a login or an API kick; a gateway's frame waits with ``room_unless_degraded``;
3. the change itself on ``presence``, at ``clock.now()`` (read once per burst; per packet for a user);
4. ``publish`` the event it returned (in seq order: no checkpoint between the change and the publish), tell a
   replaced owner (``take_over``: ``kicked``), and ``wake_ticker`` if a new deadline may come sooner.

The bursts that are nobody's connection go through the same steps, a chunk (``DEFAULT_CHUNK``) at a time:
``end_recovered`` (at start, one ``restart`` offline for every session a killed run left online) and
``end_all`` (shutdown). Each chunk waits for ``room()`` and reads the time afresh, so a million sessions
never put a million records in the writer's queue, never run the seqs past the reserved block, never hold
the loop for seconds, and never log a ``ts`` older than an event published by someone else meanwhile.
``close_recovered`` runs ``end_recovered`` before the server listens -- unless the server is degraded
meanwhile (started on a full disk: the restart records cannot be written, or not even given seqs), when the
rest goes on in the background and logins are refused (``unavailable``) until it is done.

*A change that cannot wait.* A user's logout or closed connection is published at once (its task is ending:
``logout`` is synchronous), whatever the backlog. While degraded, though, the records it adds would only
wait in memory: once the backlog is over its limit (``EventBus.full``) -- or, degraded or not, if the next seq
is not reserved durably (``SeqBlocks.issuable``) -- ``logout`` leaves the session where it is instead -- its connection is gone,
so its deadline comes, and the tick task (which waits for room) ends it then: late, with reason ``idle``,
never lost and never early. So what a full disk holds in memory is bounded by the bus's backlog limit (plus one chunk
per waiting producer and the writer's batch), and no seq is ever issued past the durable mark.

*A login that adds nothing.* A degraded server refuses new work because what it would write can only wait in
memory. A login of a user who is online already writes nothing: newest wins without an offline/online pair,
events are per user, a login within the grace continues it -- ``presence.login`` returns no event, takes no
seq. Refusing it would be worse than useless: a user who reconnects (a phone changing networks: a new
connection, a new login of the same uid) would be refused, and when its old connection closes, or goes
silent to its deadline, it would go offline -- a false offline, written later, for a user who kept trying. So
only a login that brings its user online (``brings_online``: ``PresenceTable.is_online``, user-level) is
refused, and the others are taken at once, with no wait for ``room()`` (which may wait long while degraded;
it has nothing to make room for). The bound on what is held stands: such a login adds no event now, and its
user remains one user online, with at most the one offline it would have had anyway.

The roles get this object, not the server: an edge that terminates user connections and relays them to the
core as a gateway would give its user role a ``Sessions`` of its own kind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

import trio

from idled.core.detector import DEFAULT_CHUNK
from idled.core.presence import Owner, PresenceEvent, PresenceTable, SessionKey, uid_of
from idled.ops.logs import plural
from idled.protocol import ErrorCode, ProtocolError
from idled.server.engine.bus import EventBus
from idled.server.engine.seqs import SeqBlocks
from idled.server.runtime.clock import Clock

__all__ = ["Sessions"]

log = logging.getLogger("idled.server.engine.sessions")

RECOVERY_SOURCE = "restart"  # close_recovered's name in Degraded
RECOVERY_POLL = 0.05  # seconds between two looks at the degraded state while the start waits for the restarts


def _no_ticker() -> None:
    pass


class Sessions:
    __slots__ = ("presence", "bus", "clock", "seqs", "stopping", "wake_ticker", "degraded", "drain")

    def __init__(self, presence: PresenceTable, bus: EventBus, clock: Clock, seqs: SeqBlocks) -> None:
        self.presence = presence
        self.bus = bus
        self.clock = clock
        self.seqs = seqs
        self.degraded = seqs.degraded  # one owner: the seq blocks and the writer report to the same one
        self.stopping = False
        # Reads what the user plane let gather (its coalescing): the tick task calls it before it judges silence
        # (``idled.server.engine.ticker``'s horizon). The server sets it to the plane's ``drain``.
        self.drain: Callable[[], object] = lambda: None
        # Set by whoever runs the tick task (Ticker.wake): a new session may be due before its wake-up.
        self.wake_ticker: Callable[[], None] = _no_ticker

    async def room(self) -> None:
        """Wait until a burst of presence changes may be made: the log writer is not too far behind, and
        the seq reservation has headroom (it is extended ahead of need, so this rarely waits)."""
        await self.bus.room()
        await self.seqs.headroom(self.presence)

    async def room_unless_degraded(self) -> None:
        """``room()``, but not while degraded: what may still come then (a login of a user online already, a
        gateway's touches and detaches) adds no event that must wait, and a degraded server's room may wait
        long -- a gateway's task waiting there would stop reading its touches."""
        if not self.degraded.reasons:
            await self.room()

    async def admit(self, key: SessionKey | None = None) -> None:
        """The steps before new work (a login of ``key``, an API kick: ``key`` None), in their one order: refused
        at once while degraded (``refuse_if_unavailable``), the log's room, refused once shutdown began, and
        degraded again after the wait."""
        self.refuse_if_unavailable(key)
        await self.room_unless_degraded()
        self.refuse_if_stopping()
        self.refuse_if_unavailable(key)

    def refuse_if_stopping(self) -> None:
        """No session may start once shutdown began: end_all() has run (or is running), so it would never be
        ended, and its online event would miss the log."""
        if self.stopping:
            raise ProtocolError(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")

    def brings_online(self, key: SessionKey) -> bool:
        """Would a login of ``key`` bring its user online -- an ``online`` event? Not while the user is online
        already: by this key (newest wins), by another (events are per user), or in its grace (continued)."""
        return not self.presence.is_online(uid_of(key))

    def refuse_if_unavailable(self, key: SessionKey | None = None) -> None:
        """While the server is degraded, refuse (``unavailable``) what would add to the log: a login of ``key``
        that brings its user online, or (no ``key``) any other new work -- an API kick (module docstring)."""
        if self.degraded.reasons and (key is None or self.brings_online(key)):
            self.degraded.refuse()

    def publish(self, event: PresenceEvent | None) -> None:
        if event is not None:
            self.bus.publish(event)

    def logout(self, key: SessionKey, owner: Owner, now: float, wall: float, reason: str) -> None:
        """End ``key``'s session if ``owner`` still owns it, publishing the user's offline -- unless another key
        of the user lives, or a ``closed`` end starts the grace: then the tick task is woken, since that
        offline may come due before the tick task's own wake-up (a grace shorter than the next deadline)."""
        presence = self.presence
        if not self.seqs.issuable(presence) or self.degraded.reasons and self.bus.full():
            return  # left to its deadline: nothing more may wait in memory (see "A change that cannot wait")
        event = presence.logout(key, owner, now, wall, reason)
        if event is not None:
            self.bus.publish(event)
        elif reason == "closed" and presence.offline_grace and presence.in_grace(uid_of(key)):
            self.wake_ticker()

    def take_over(self, key: SessionKey, replaced: tuple[SessionKey, Owner] | None, owner: Owner) -> None:
        """``owner`` logged ``key`` in, ending ``replaced`` (``PresenceTable.login``): its owner is told
        ``kicked`` -- the same key's previous owner unless it is ``owner`` itself (newest wins), or the owner of
        the user's oldest key, whoever it is, when the login went past ``max_devices``."""
        if replaced is None:
            return
        old_key, previous = replaced
        if old_key == key:
            if previous is not owner:
                previous.release(key, ErrorCode.KICKED, "logged in elsewhere")
        else:
            previous.release(old_key, ErrorCode.KICKED,
                             f"too many devices: a login of another one ended the oldest "
                             f"(max_devices {self.presence.max_devices})")

    async def end_all(self, reason: str, code: str, message: str) -> int:
        """Shutdown: end every session (``reason``), telling each owner ``code``; returns how many."""
        presence, bus, clock = self.presence, self.bus, self.clock
        ended = 0
        while True:
            await self.room()
            chunk = presence.end_all(clock.now(), clock.wall(), reason, DEFAULT_CHUNK)
            if not chunk:
                return ended
            for key, owner, event in chunk:
                if event is not None:
                    bus.publish(event)
                if owner is not None:
                    owner.release(key, code, message)
            ended += len(chunk)
            await trio.lowlevel.checkpoint()

    async def close_recovered(self, records: Collection[dict[str, Any]], nursery: trio.Nursery) -> None:
        """At start: ``end_recovered(records)``, waited for -- unless the server is or becomes degraded first:
        then it goes on in ``nursery``, and new sessions are refused until it is done (see the module docstring)."""
        if not records:
            return
        done = trio.Event()

        async def close() -> None:
            ended = await self.end_recovered(records)
            log.info("closed %s left online by the previous run (reason restart)", plural(ended, "session"))
            self.degraded.clear(RECOVERY_SOURCE)
            done.set()

        nursery.start_soon(close)
        while not done.is_set():
            if self.degraded.reasons:  # (no checkpoint until set: close() cannot finish in between)
                self.degraded.set(RECOVERY_SOURCE, f"{plural(len(records), 'session')} left online by the previous "
                                                   "run not closed yet")
                return
            with trio.move_on_after(RECOVERY_POLL):
                await done.wait()

    async def end_recovered(self, records: Iterable[dict[str, Any]]) -> int:
        """At start: the offline (``restart``) closing each session a killed run left online (``records``: its
        last online record, from recovery); returns how many. Nobody can log in yet."""
        ended = 0
        chunk: list[dict[str, Any]] = []
        for record in records:
            chunk.append(record)
            if len(chunk) == DEFAULT_CHUNK:
                ended += await self._restart(chunk)
        ended += await self._restart(chunk)
        return ended

    async def _restart(self, chunk: list[dict[str, Any]]) -> int:
        await self.room()
        if self.bus.log_closed:
            chunk.clear()
            return 0  # shut down before the log had room for them: the next start closes them
        wall = self.clock.wall()
        for record in chunk:
            self.bus.publish(self.presence.restart_event(record, wall))
        n = len(chunk)
        chunk.clear()
        await trio.lowlevel.checkpoint()
        # The monitor, which beats the clock, starts once the server listens: this burst comes before. Its
        # checkpoints are the loop running, so they beat as the monitor does, or the burst's length would read
        # as a pause of the loop and move every deadline.
        self.clock.heartbeat()
        return n
