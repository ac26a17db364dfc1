"""The active core's side of log shipping: a standby's ``replicate`` request, served from the log on disk.

Theory of operation
-------------------
A standby core (``idled.server.ha.follow``) logs in with the role of its own, ``standby`` (a ``standby`` token,
letter ``s``, or a client certificate naming ``idled:standby:<name>``), and sends ``replicate from=N`` as its
first and only request. The doorway hands the login to `Replicas.serve`: a welcome, then that request within
``FIRST_REQUEST_TIMEOUT`` -- anything else is ``not_allowed`` -- and `Replicas.run`, which sends the standby the
log's records from N on as the segments hold them (``idled.log.shipping.RawReader``), in ``records`` frames
(``idled.protocol.replication``), and nothing else. Only such links are standbys: they alone are listed in
``/status``, counted by ``idled_standbys_attached`` and may hold the durable watermark under ``sync_standby``.
An observer's ``replicate`` is refused (``idled.server.roles.observers``): an observer token never reads the log as
a standby, nor acknowledges records in one's place. The edges of ``--workers`` relay a standby login to the
core like a gateway's or an observer's.

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
* **Gaps.** Seqs a crash left unused (``idled.server.engine.seqs``) are never on disk: a batch that finds no
  record below the limit moves the cursor to it.
* **Re-sync.** A ``from`` older than the oldest retained segment gets ``resync``: the newest snapshot's
  bytes, then records from the oldest retained seq (the standby moves its old log aside first). A ``from``
  beyond the active's durable end is refused (``not_allowed``): that standby holds records this log never
  had, and must be rebuilt by an operator (docs/ha.md), never silently overwritten.
* **Divergence.** A ``replicate`` with ``last`` (seq, crc of the standby's last record) is checked against
  this log's record at that seq: missing (a gap, beyond the durable end, not retained) or different, the
  standby went its own way -- an old leader back as a standby, holding records it wrote and nobody
  acknowledged -- and gets ``resync`` (with ``diverged``) like a standby behind retention: it moves its
  whole log aside and copies ours. One warning line here, one there, both naming the seq.
* **Acknowledgements, synchronous standbys.** Reading the standby is concurrent with sending to it: its
  ``ack`` frames (``seq``: the last seq it has synced) are read by ``_listen`` with their own small decoder
  (``MAX_STANDBY_FRAME``); a bad frame, or any request but ``ack``, ``ping`` and ``bye``, ends that link with
  an error frame, nobody else's. With
  ``sync_standby``, a standby that has acknowledged every record there was when it attached (so a standby
  still copying a backlog does not stall anyone: Postgres's ``catchup`` before ``streaming``) is a
  *synchronous* one, and the bus's ``durable_seq`` -- what durable observers are sent, what the rest of the
  server calls durable -- becomes min(the log's durable seq, the highest ack of a synchronous standby):
  ``EventBus.sync_to``. The feed itself reads up to the log's durable seq (``feed=True``), or it would wait
  for acks of what it has not sent. A synchronous standby that acknowledges nothing for ``SYNC_TIMEOUT``
  (stopped, its disk hung) stops being one, and so does one whose link ends; with none left, ``durable_seq``
  falls back to the log's at once (Patroni's non-strict ``synchronous_mode``): one log line at each change
  (``sync standby attached`` / ``sync standby lost``), the gauge ``idled_sync_standby``, ``/status``'s
  ``replication``. Meanwhile durable observers wait: that is what they asked for (their lag grows by the
  standby's, at most ``SYNC_TIMEOUT``); live observers, users and the writer never wait for a standby.

A clean stop of the active waits for the standby as for any durable observer (every durable record sent)
before it says ``server_shutdown``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import trio
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from idled.log.eventlog import EventLog
from idled.log.shipping import Gone, RawReader, read_record
from idled.log.snapshot import list_snapshots
from idled.protocol import (
    BYE, PING, ErrorCode, FrameDecoder, Login, ProtocolError, Replicate, Welcome, encode, receive_message,
)
from idled.protocol.replication import (
    HEARTBEAT, LINK_TIMEOUT, MAX_BATCH_BYTES, MAX_BATCH_RECORDS, MAX_STANDBY_FRAME, PART_BYTES, Ack,
    ReplicateChecked, encode_records, encode_resync, encode_snapshot_part, parse_standby_message, record_crc,
)
from idled.server.engine.bus import EventBus, Subscription
from idled.server.roles.doorway import Connection, close_with
from idled.server.roles.observers import FrameWriter, Stalled
from idled.server.runtime.clock import WallClock

__all__ = ["FIRST_REQUEST_TIMEOUT", "REPLICA_STALL", "SYNC_TIMEOUT", "Replicas", "ReplicationCollector"]

log = logging.getLogger("idled.server.ha.feed")

REPLICA_STALL = 30.0  # seconds a standby may take no byte while records wait for it; then busy
SYNC_TIMEOUT = LINK_TIMEOUT  # seconds a synchronous standby may acknowledge nothing before it stops being one
FIRST_REQUEST_TIMEOUT = LINK_TIMEOUT  # seconds a standby login may take to send its replicate (sent with the login)


def _open_binary(path: str) -> BinaryIO:
    return open(path, "rb")


class _Link:
    """One attached standby, as the sync bookkeeping sees it."""

    __slots__ = ("name", "acked", "sent", "last_record", "sync_from", "needed", "sync", "failure")

    def __init__(self, name: str, sync_from: int) -> None:
        self.name = name
        self.acked = -1  # the last seq it said it has synced (-1: no ack yet: an older standby never sends one)
        self.sent = 0  # the feed's position: every seq up to here was sent or never existed (acks beyond: refused)
        # Synchronous once the feed has passed `sync_from` (the log's durable seq when it attached, or fell
        # silent) and it has acknowledged `needed`, the last record sent up to there. Not `sync_from` itself:
        # that seq may not exist (the gap a crash leaves before a new run's first seq).
        self.sync_from = sync_from
        self.needed = 0
        self.last_record = 0  # the last record sent
        self.sync = False
        self.failure: ProtocolError | None = None  # a bad frame from the standby: the link ends with it


class Replicas:
    """Serves standbys (``serve``: the doorway's handler for the ``standby`` role); ``attached`` counts those
    connected. ``sync``: ``sync_standby`` (see the module docstring); ``registry``: where ``idled_sync_standby``
    goes; ``peers``: the server's live peers, which its shutdown closes (a standby's link among them)."""

    def __init__(self, bus: EventBus, log: EventLog, *, sync: bool = False,
                 registry: CollectorRegistry | None = None, peers: set[Connection] | None = None,
                 wall: Callable[[], float] | None = None) -> None:
        self.bus = bus
        self.log = log
        self.wall = WallClock() if wall is None else wall  # heartbeats' time: the server's wall (Clock.wall)
        self.sync = sync
        self.peers: set[Connection] = set() if peers is None else peers
        self.attached = 0
        self.sent = 0  # records sent, over all standbys
        self.links: set[_Link] = set()
        self.sync_attached = False  # a synchronous standby holds the durable watermark
        if registry is not None:
            registry.register(ReplicationCollector(self))

    def status(self) -> dict[str, Any]:
        """``/status``'s ``replication`` part (read on the event loop)."""
        return {"sync_standby": self.sync, "sync_attached": self.sync_attached, "durable_seq": self.bus.durable_seq,
                "log_durable_seq": self.bus.log_durable_seq, "records_sent": self.sent,
                "standbys": [{"name": link.name, "acked": link.acked, "sent": link.sent, "sync": link.sync}
                             for link in sorted(self.links, key=lambda link: link.name)]}

    async def serve(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        """The ``standby`` role: a welcome, then its one request, ``replicate`` (see the module docstring)."""
        peer, writer = Connection(), FrameWriter(stream)
        self.peers.add(peer)
        try:
            with peer.scope:
                await stream.send_all(encode(Welcome("standby", login.name)))
                with trio.move_on_after(FIRST_REQUEST_TIMEOUT) as wait:
                    message = await receive_message(stream, decoder)
                if wait.cancelled_caught:
                    raise ProtocolError(ErrorCode.IDLE_TIMEOUT,
                                        f"no replicate within {FIRST_REQUEST_TIMEOUT:g} s of the standby's login")
                if message is None:
                    return  # it went away before asking
                if not isinstance(message, Replicate):  # (or its subclass with the check)
                    raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for standbys: "
                                        "a standby login's one request is replicate")
                await self.run(stream, decoder, message, writer, str(login.name))
        finally:
            self.peers.discard(peer)
        if peer.end is not None and await writer.finish():  # closed by the server (shutdown): say why
            await close_with(stream, *peer.end)

    async def run(self, stream: trio.abc.Stream, decoder: FrameDecoder, message: Replicate, writer: FrameWriter,
                  name: str) -> None:
        reader = await self._start(message, writer, name)
        subscription = Subscription()
        self.bus.subscribe(subscription, reader.next, feed=True)
        link = _Link(name, self.bus.log_durable_seq)
        link.sent = reader.next - 1
        self.links.add(link)
        self.attached += 1
        failure: ProtocolError | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._listen, stream, decoder, link, reader, nursery.cancel_scope)
                failure = await self._send(reader, subscription, writer, link)
                nursery.cancel_scope.cancel()
        finally:
            self.attached -= 1
            self.links.discard(link)
            self.bus.unsubscribe(subscription)
            self._update(f"{name}: its link ended")
        failure = link.failure or failure  # the standby's bad frame comes first: it is why the feed stopped
        if failure is not None:
            raise failure

    async def _start(self, message: Replicate, writer: FrameWriter, name: str) -> RawReader:
        """The reader for ``from=start``: refused if beyond this log, after a re-sync if before it or if the
        standby's last record is not ours (``last``)."""
        start = message.from_seq
        durable = self.bus.log_durable_seq
        last = message.last if isinstance(message, ReplicateChecked) else None
        if last is None and start > durable + 1:
            raise ProtocolError(ErrorCode.NOT_ALLOWED, f"this core's log ends at seq {durable}: a standby asking from "
                                f"{start} holds records this log never had; rebuild it (docs/ha.md)")
        oldest = await trio.to_thread.run_sync(self.log.oldest_seq)
        if last is not None and not (oldest is not None and start < oldest):  # (else a re-sync anyway, below)
            differs = await self._differs(last, durable)
            if differs is not None:
                first = oldest if oldest is not None else durable + 1
                log.warning("standby %s diverged: its last record, seq %d, %s; it holds records this core never "
                            "had: re-sync from seq %d (it moves its log aside)", name, last[0], differs, first)
                await self._resync(first, writer, diverged=last[0])
                return RawReader(str(self.log.directory), first)
        if oldest is not None and start < oldest:
            log.warning("standby %s asks from seq %d, retained from %d: re-sync", name, start, oldest)
            await self._resync(oldest, writer)
            start = oldest
        return RawReader(str(self.log.directory), start)

    async def _differs(self, last: tuple[int, int], durable: int) -> str | None:
        """How this log's record at ``last``'s seq differs from the standby's (None: it is the same)."""
        seq, crc = last
        if seq > durable:
            return f"is beyond this core's durable end (seq {durable})"
        raw = await trio.to_thread.run_sync(read_record, str(self.log.directory), seq)
        if raw is None:
            return "is not in this core's log (a gap, or no longer retained)"
        if record_crc(raw) != crc:
            return f"differs from this core's (crc {crc:08x}, ours {record_crc(raw):08x})"
        return None

    async def _resync(self, oldest: int, writer: FrameWriter, diverged: int | None = None) -> None:
        snapshots = await trio.to_thread.run_sync(list_snapshots, self.log.directory)
        if not snapshots:
            await writer.write([encode_resync(oldest, None, 0, diverged)], REPLICA_STALL)
            return
        seq, path = snapshots[-1]
        # Held open: a newer snapshot may replace this one meanwhile.
        file = await trio.to_thread.run_sync(_open_binary, path)
        try:
            size = os.fstat(file.fileno()).st_size
            await writer.write([encode_resync(oldest, seq, size, diverged)], REPLICA_STALL)
            while part := await trio.to_thread.run_sync(file.read, PART_BYTES):
                await writer.write([encode_snapshot_part(part)], REPLICA_STALL)
        finally:
            file.close()

    async def _send(self, reader: RawReader, subscription: Subscription, writer: FrameWriter,
                    link: _Link) -> ProtocolError | None:
        """Records as they become durable (on this disk), heartbeats in between; the error to end with, if any."""
        bus = self.bus
        last_sent = trio.current_time()
        try:
            while True:
                limit = bus.log_durable_seq + 1
                if reader.next < limit:
                    batch = await trio.to_thread.run_sync(reader.take, limit, MAX_BATCH_RECORDS, MAX_BATCH_BYTES)
                    if not batch:
                        reader.next = limit  # a gap a crash left: those seqs were never written
                    else:
                        await writer.write([encode_records([raw for _, raw in batch], bus.log_durable_seq,
                                                           self.wall())], REPLICA_STALL)
                        self.sent += len(batch)
                        last_sent = trio.current_time()
                        link.last_record = batch[-1][0]
                        if not link.sync and batch[0][0] <= link.sync_from:
                            link.needed = max(seq for seq, _ in batch if seq <= link.sync_from)
                    link.sent = reader.next - 1
                    self._maybe_sync(link)
                    subscription.cursor = reader.next
                    continue
                with trio.move_on_at(last_sent + HEARTBEAT) as scope:
                    await subscription.wait()
                if scope.cancelled_caught:
                    await writer.write([encode_records([], bus.log_durable_seq, self.wall())], REPLICA_STALL)
                    last_sent = trio.current_time()
        except Stalled:
            return ProtocolError(ErrorCode.BUSY, f"standby read nothing for {REPLICA_STALL:g} s; reconnect and resume")
        except Gone as exc:
            return ProtocolError(ErrorCode.GONE, f"{exc}; reconnect to re-sync")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None

    async def _listen(self, stream: trio.abc.Stream, decoder: FrameDecoder, link: _Link, reader: RawReader,
                      done: trio.CancelScope) -> None:
        """The standby's acks (and pings, bye); its end of stream ends the feed, a bad frame the link."""
        # Its own decoder: the standby's frames after replicate are acks, small; what the login's decoder
        # still holds is carried over.
        acks = FrameDecoder(MAX_STANDBY_FRAME, parse=parse_standby_message)
        acks.receive_data(decoder.unconsumed())
        try:
            while True:
                with trio.move_on_after(SYNC_TIMEOUT) as scope:
                    message = await receive_message(stream, acks)
                if scope.cancelled_caught:
                    if link.sync:  # still connected, but silent: stopped, or its disk hangs
                        link.sync, link.sync_from, link.needed = False, self.bus.log_durable_seq, link.last_record
                        self._update(f"{link.name} acknowledged nothing for {SYNC_TIMEOUT:g} s")
                    continue
                if type(message) is Ack:
                    self._ack(link, message.seq, reader)  # a bad one raises ProtocolError
                elif message is not PING:
                    if message is not None and message is not BYE:
                        op = type(message).__name__.lower()
                        log.warning("standby %s sent %s during replication: link closed", link.name, op)
                        link.failure = ProtocolError(ErrorCode.NOT_ALLOWED, f"{op} is not for standbys: after "
                                                     "replicate a standby sends only ack, ping and bye")
                    break
        except ProtocolError as exc:  # not raised: out of the nursery it would come wrapped in an ExceptionGroup
            link.failure = exc
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    def _ack(self, link: _Link, seq: int, reader: RawReader) -> None:
        if seq > max(link.sent, reader.next - 1):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"ack of seq {seq}: beyond the last seq sent ({link.sent})")
        if seq <= link.acked:
            return
        link.acked = seq
        if link.sync:
            self._update(None)
        else:
            self._maybe_sync(link)

    def _maybe_sync(self, link: _Link) -> None:
        if not link.sync and link.acked >= link.needed and link.sent >= link.sync_from:
            link.sync = True  # it holds everything there was when it attached (or fell silent): caught up
            self._update(f"{link.name} caught up")

    def _update(self, why: str | None) -> None:
        """Hand the bus the synchronous standbys' best ack; log a change of whether there is one."""
        if not self.sync:
            return
        acks = [link.acked for link in self.links if link.sync]
        attached = bool(acks)
        self.bus.sync_to(max(acks) if acks else None)
        if attached != self.sync_attached:
            self.sync_attached = attached
            if attached:
                log.info("sync standby attached (%s): durable observers now wait for its acknowledgement", why)
            else:
                log.warning("sync standby lost (%s): durable observers fall back to this core's own durable seq %d",
                            why, self.bus.log_durable_seq)


class ReplicationCollector(Collector):
    """``idled_sync_standby``: 1 while a synchronous standby holds the durable watermark, else 0."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("idled_sync_standby", "1 while a synchronous standby acknowledges what durable "
                                "observers are sent (sync_standby), else 0", value=int(self.replicas.sync_attached))
        yield GaugeMetricFamily("idled_standbys_attached", "standbys connected to this core", value=self.replicas.attached)
