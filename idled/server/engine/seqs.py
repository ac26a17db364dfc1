"""Seq blocks for a running server: reserve before issuing, extend ahead of need, lower the mark at a clean stop.

Theory of operation
-------------------
The durable mark itself is ``idled.log.seqs.SeqReservation`` (why it exists: see there). This module is the
server's side of it, on the event loop, every file operation in a worker thread:

* ``start(next_seq)``: after recovery, the run's first seq is past every record on disk *and* past every seq
  the previous run may have shown an observer (its mark); the first block is reserved before any is issued.
* ``extend_ahead(presence, nursery)``: called by the monitor; once fewer than half a block is left, a task
  records the next block. So producers almost never wait...
* ``headroom(presence)``: ...but they do wait (in ``Sessions.room``) rather than issue a seq within
  ``SEQ_HEADROOM`` of the mark -- and extend the mark themselves when no extension is under way (a burst
  before the monitor runs, such as the restart records at start, reserves as it goes).
* ``finish(last_seq)``: a clean stop, once the log is synced, lowers the mark to the last seq: no gap next run.

*Under an election* (``idled.server.node``) the mark is also kept in etcd (``Election.publish_seq``), fenced by
the leader key, and every block is recorded there before a seq of it is issued: a new leader -- on another
machine, with a copy of the log that may lack the last records -- starts past it (``start`` reads it), so no
seq is ever issued twice, whatever its copy holds. A write etcd refuses (we are no longer the leader) raises
`NotLeader`: the server steps down rather than issue seqs nobody reserved.

*A full disk* (ENOSPC, EDQUOT: ``SeqReservation.record`` leaves the old mark in place) raises nothing: the
block is not ours, so ``reserved`` stays where it was and no seq past it is issued -- producers wait in
``headroom``, and ``Sessions.logout`` leaves a session to its deadline rather than issue one -- the server is
degraded (``degraded``: ``idled.server.engine.degraded``), and the next look, at least ``RETRY`` seconds later, tries
again. At ``start`` the first block may fail so: then no seq is issuable at all until it is recorded (the
server refuses logins meanwhile, so nothing needs one but the offlines of the sessions a crash left open,
which wait). A clean stop that cannot lower the mark leaves it higher: a gap of seqs at the next start,
never a reuse. A failed fsync stays fatal.

*One write at a time, the last one last.* An extension (a monitor hook, any time) and ``finish`` (shutdown,
shielded) both write the mark from worker threads. They take one lock, and ``finish`` closes the blocks:
an extension that was under way is written before the final mark (``finish`` waits for the lock), and one
that comes after it writes nothing. Otherwise an extension landing after ``finish`` would raise the mark
again (a gap after a clean stop), and two threads writing the one file together could corrupt it.
"""

from __future__ import annotations

import logging
import math

import trio

from idled.core.presence import PresenceTable
from idled.log.errors import is_disk_full
from idled.log.seqs import SEQ_BLOCK, SEQ_HEADROOM, SeqReservation
from idled.server.election import Election, ElectionError, EtcdUnavailable
from idled.server.engine.degraded import Degraded

__all__ = ["SeqBlocks"]

log = logging.getLogger("idled.server.engine.seqs")

HEADROOM_POLL = 0.005  # seconds between two looks at the mark while a producer waits for headroom
RETRY = 1.0  # seconds between two attempts to record a block after the disk was found full
SOURCE = "seqs"  # this part's name in Degraded


class SeqBlocks:
    def __init__(self, reservation: SeqReservation, election: Election | None = None,
                 degraded: Degraded | None = None) -> None:
        self.reservation = reservation
        self.election = election  # None: the local mark is the only one
        self.degraded = degraded if degraded is not None else Degraded()
        self._retry_at = -math.inf  # no block is recorded before this (trio time): the disk was full
        self.reserved = 0  # every seq issued is <= this, durably
        self.first = 1  # the first seq of this run
        self.finished = False  # finish() has begun: the mark only comes down from here on
        self._extending = False
        self._writing = trio.Lock()  # held around every write of the mark

    async def start(self, next_seq: int) -> int:
        """The first seq of this run (``next_seq``: the log's, after recovery); reserves the first block."""
        reserved = await trio.to_thread.run_sync(self.reservation.load)
        if self.election is not None:
            reserved = max(reserved, await self.election.last_seq())
        first = max(next_seq, reserved + 1)
        if first > next_seq:
            log.info("seqs %d..%d may have been seen but not logged before the last stop: skipped", next_seq, first - 1)
        self.reserved = first - 1  # nothing issuable until the first block is recorded
        self.first = first
        async with self._writing:
            if await self._try_record(first + SEQ_BLOCK):
                self.reserved = first + SEQ_BLOCK
        return first

    def extend_ahead(self, presence: PresenceTable, nursery: trio.Nursery) -> None:
        """Start recording the next block once less than half of this one is left (one extension at a time)."""
        if (not self._extending and not self.finished and presence.next_seq + SEQ_BLOCK // 2 > self.reserved
                and trio.current_time() >= self._retry_at):
            self._extending = True
            nursery.start_soon(self._extend, presence)

    async def _extend(self, presence: PresenceTable) -> None:
        try:
            async with self._writing:
                if self.finished:
                    return  # the final mark is written (or about to be): raising it now would leave a gap
                upto = presence.next_seq + SEQ_BLOCK
                if await self._try_record(upto):
                    self.reserved = upto
        except EtcdUnavailable as exc:
            # The block is not ours yet: producers wait in headroom() and the next look tries again; the lease
            # fence ends the term if etcd stays away.
            log.warning("seq block up to %d not recorded in etcd: %s", presence.next_seq + SEQ_BLOCK, exc)
        finally:
            self._extending = False

    async def headroom(self, presence: PresenceTable) -> None:
        """Wait until the next seqs are well below the durable mark, extending it if nobody else is."""
        while presence.next_seq + SEQ_HEADROOM > self.reserved:
            if self._extending or self.finished or (wait := self._retry_at - trio.current_time()) > 0:
                await trio.sleep(HEADROOM_POLL if self._extending or self.finished else wait)
            else:
                self._extending = True
                await self._extend(presence)

    async def finish(self, last_seq: int) -> None:
        """A clean stop: every seq up to ``last_seq`` is durably in the log, so the mark comes back down to it.
        Waits for an extension under way; none is written after it."""
        self.finished = True
        async with self._writing:
            try:
                await self._record(last_seq, lower=True)
            except ElectionError as exc:  # etcd keeps the higher mark: the next leader skips to it (a gap)
                log.info("seq mark not lowered in etcd: %s", exc)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                log.info("seq mark not lowered (%s): the next start skips to it (a gap)", exc.strerror or exc)

    def issuable(self, presence: PresenceTable) -> bool:
        """Whether the next seq is reserved durably (a producer that cannot wait checks this)."""
        return presence.next_seq <= self.reserved

    async def _try_record(self, upto: int) -> bool:
        """Record the mark ``upto``; False if the disk is full (degraded until a later attempt succeeds)."""
        try:
            await self._record(upto)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            self._retry_at = trio.current_time() + RETRY
            self.degraded.set(SOURCE, f"seq reservation: {exc.strerror or exc}")
            return False
        self.degraded.clear(SOURCE)
        return True

    async def _record(self, upto: int, *, lower: bool = False) -> None:
        """The mark is ``upto``: on disk, then (under an election) in etcd -- both before any seq below it is issued."""
        await trio.to_thread.run_sync(self.reservation.record, upto)
        if self.election is not None:
            await self.election.publish_seq(upto, lower=lower)
