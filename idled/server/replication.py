"""The active core's side of log shipping: a standby's ``replicate`` request, served from the log on disk.

Theory of operation
-------------------
A standby core (``idled.server.standby``) logs in as an observer and sends ``replicate from=N`` as its
first request; the observer role (``idled.server.observers``) hands the connection to `Replicas.run`, which
sends the standby the log's records from N on as the segments hold them (``idled.log.shipping.RawReader``),
in ``records`` frames (``idled.protocol.replication``), and nothing else:

* **Durable records only.** The feed is a durable subscription on the bus (``EventBus.subscribe(...,
  durable=True)``): it is woken when the writer reports durability (``on_durable``) and sends records
  below ``durable_seq + 1`` -- what the active has synced under its ``--fsync`` policy -- read back from
  disk. So a standby never holds a record the active could lose in a crash, and its seqs are the active's.
* **Bounded.** One batch at a time: at most ``MAX_BATCH_RECORDS`` records / ``MAX_BATCH_BYTES`` bytes read
  (in a worker thread), then written to the socket before the next is read. A standby that reads slowly
  (a slow disk) makes the sender wait in its socket send: nothing accumulates on the active, and the bus
  keeps no per-standby queue (its cursor is a seq). A standby that takes no byte for ``REPLICA_STALL``
  seconds is cut with ``busy``; it reconnects and resumes from its last seq.
* **Heartbeats.** With nothing to send, an empty ``records`` frame every ``HEARTBEAT`` seconds carries the
  active's durable seq and wall clock: the standby's lag, and its proof that the link is alive.
* **Gaps.** Seqs a crash left unused (``idled.server.seqs``) are never on disk: a batch that finds no
  record below the limit moves the cursor to it.
* **Re-sync.** A ``from`` older than the oldest retained segment gets ``resync``: the newest snapshot's
  bytes, then records from the oldest retained seq (the standby moves its old log aside first). A ``from``
  beyond the active's durable end is refused (``not_allowed``): that standby holds records this log never
  had, and must be rebuilt by an operator (docs/ha.md), never silently overwritten.

A clean stop of the active waits for the standby as for any durable observer (every durable record sent)
before it says ``server_shutdown``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import BinaryIO

import trio

from idled.log.eventlog import EventLog
from idled.log.shipping import Gone, RawReader
from idled.log.snapshot import list_snapshots
from idled.protocol import BYE, PING, ErrorCode, FrameDecoder, ProtocolError, Replicate, receive_message
from idled.protocol.replication import (
    HEARTBEAT, MAX_BATCH_BYTES, MAX_BATCH_RECORDS, PART_BYTES, encode_records, encode_resync, encode_snapshot_part,
)
from idled.server.bus import EventBus, Subscription
from idled.server.observers import FrameWriter, Stalled

__all__ = ["REPLICA_STALL", "Replicas"]

log = logging.getLogger("idled.server.replication")

REPLICA_STALL = 30.0  # seconds a standby may take no byte while records wait for it; then busy


def _open_binary(path: str) -> BinaryIO:
    return open(path, "rb")


class Replicas:
    """Serves standbys (``run``, set as ``Observers.replicas``); ``attached`` counts those connected."""

    def __init__(self, bus: EventBus, log: EventLog) -> None:
        self.bus = bus
        self.log = log
        self.attached = 0
        self.sent = 0  # records sent, over all standbys

    async def run(self, stream: trio.abc.Stream, decoder: FrameDecoder, message: Replicate, writer: FrameWriter) -> None:
        reader = await self._start(message.from_seq, writer)
        subscription = Subscription()
        self.bus.subscribe(subscription, reader.next, durable=True)
        self.attached += 1
        failure: ProtocolError | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._listen, stream, decoder, nursery.cancel_scope)
                failure = await self._send(reader, subscription, writer)
                nursery.cancel_scope.cancel()
        finally:
            self.attached -= 1
            self.bus.unsubscribe(subscription)
        if failure is not None:
            raise failure

    async def _start(self, start: int, writer: FrameWriter) -> RawReader:
        """The reader for ``from=start``: refused if beyond this log, after a re-sync if before it."""
        durable = self.bus.durable_seq
        if start > durable + 1:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"this core's log ends at seq {durable}: a standby asking from "
                                f"{start} holds records this log never had; rebuild it (docs/ha.md)")
        oldest = await trio.to_thread.run_sync(self.log.oldest_seq)
        if oldest is not None and start < oldest:
            await self._resync(start, oldest, writer)
            start = oldest
        return RawReader(str(self.log.directory), start)

    async def _resync(self, start: int, oldest: int, writer: FrameWriter) -> None:
        snapshots = await trio.to_thread.run_sync(list_snapshots, self.log.directory)
        log.warning("standby asks from seq %d, retained from %d: re-sync (snapshot %s)", start, oldest,
                    snapshots[-1][0] if snapshots else "none")
        if not snapshots:
            await writer.write([encode_resync(oldest, None, 0)], REPLICA_STALL)
            return
        seq, path = snapshots[-1]
        # Held open: a newer snapshot may replace this one meanwhile.
        file = await trio.to_thread.run_sync(_open_binary, path)
        try:
            size = os.fstat(file.fileno()).st_size
            await writer.write([encode_resync(oldest, seq, size)], REPLICA_STALL)
            while part := await trio.to_thread.run_sync(file.read, PART_BYTES):
                await writer.write([encode_snapshot_part(part)], REPLICA_STALL)
        finally:
            file.close()

    async def _send(self, reader: RawReader, subscription: Subscription, writer: FrameWriter) -> ProtocolError | None:
        """Records as they become durable, heartbeats in between; the error to end with, if any."""
        bus = self.bus
        last_sent = trio.current_time()
        try:
            while True:
                limit = bus.durable_seq + 1
                if reader.next < limit:
                    batch = await trio.to_thread.run_sync(reader.take, limit, MAX_BATCH_RECORDS, MAX_BATCH_BYTES)
                    if not batch:
                        reader.next = limit  # a gap a crash left: those seqs were never written
                    else:
                        await writer.write([encode_records([raw for _, raw in batch], bus.durable_seq, time.time())],
                                           REPLICA_STALL)
                        self.sent += len(batch)
                        last_sent = trio.current_time()
                    subscription.cursor = reader.next
                    continue
                with trio.move_on_at(last_sent + HEARTBEAT) as scope:
                    await subscription.wait()
                if scope.cancelled_caught:
                    await writer.write([encode_records([], bus.durable_seq, time.time())], REPLICA_STALL)
                    last_sent = trio.current_time()
        except Stalled:
            return ProtocolError(ErrorCode.BUSY, f"standby read nothing for {REPLICA_STALL:g} s; reconnect and resume")
        except Gone as exc:
            return ProtocolError(ErrorCode.GONE, f"{exc}; reconnect to re-sync")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None

    async def _listen(self, stream: trio.abc.Stream, decoder: FrameDecoder, done: trio.CancelScope) -> None:
        """The standby sends only pings (and bye): its end of stream ends the feed."""
        try:
            while (message := await receive_message(stream, decoder)) is PING:
                pass
            if message is not None and message is not BYE:
                log.warning("standby sent %s during replication: link closed", type(message).__name__.lower())
        except (ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()
