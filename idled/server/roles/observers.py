"""The observer role: ``subscribe`` to presence events (live, durable, or resumed from a seq), ``query`` who
is online.

Theory of operation
-------------------
Two tasks per observer. The *requests* task reads frames: ``subscribe`` places the observer's cursor on the
bus (``bus.Subscription``); ``query`` and ``ping`` queue a reply. The *sender* is the only task writing to
the socket: replies, and events from the cursor on -- taken from the bus's window of recent frames, or from
the log on disk once the cursor is older than the window -- in writes of up to ``OBSERVER_WRITE_BYTES``.

Memory per observer is bounded in bytes, whatever the peer does:

* events: none are queued per observer. The cursor points into the shared window or into the log; in flight
  is one write (``OBSERVER_WRITE_BYTES``) or one disk batch (``REPLAY_BATCH`` records).
* replies: at most ``REPLY_BYTES`` plus one reply. A reply goes out once every event published before its
  request has been sent (a ``status`` is never older than the events before it). While more than
  ``REPLY_BYTES`` of replies wait, the requests task stops reading: an observer's *requests are
  back-pressured* (its socket fills, its own sends block), never queued without bound.
* the socket: the kernel's buffers (``net.ipv4.tcp_wmem``/``tcp_rmem``) and the decoder's one frame.

An observer that stops reading is cut: if it takes no byte for ``OBSERVER_STALL`` seconds while data waits
for it (so the kernel's buffers are full), it is disconnected with ``busy`` and may come back with
``subscribe from=<last seq + 1>``. Reading slowly is not stalling: an observer that keeps taking bytes is
never cut, whatever the burst (it just reads further back, from the window or the log), and no observer
slows a producer down. Over a socket the sender tracks how far the kernel took each write, so a cut never
leaves a frame half-sent: the rest of the frame in flight goes out, then the ``busy`` frame (each within
``SEND_ERROR_TIMEOUT``), and nothing of the backlog -- ``busy`` comes *instead of* it. (Streams that are not
sockets, the tests' memory streams, are written whole with ``send_all`` and never cut.)

Durable subscriptions (``subscribe durable=true``): the cursor stops at the writer's ``durable_seq``
(``EventBus.durable_to``), so the observer never sees an event the log could lose in a crash: a power cut
under ``fsync=always``, a process crash under ``never``; under ``interval`` events arrive up to
``fsync_interval`` later. Its replies wait for the events before them, too.

Watchlists (``subscribe uids=[...]``, ``watch``, ``unwatch``): the sender sends only the observer's uids'
events, from its own queue or replayed filtered; the requests and that replay are ``idled.server.roles.watchlists``.

Resuming: ``subscribe from=N`` starts the cursor at N. Seqs below this run's ``first_seq`` come from the
previous runs' log (a gap a crash left is skipped: those seqs never existed); this run's events come from
the window, or from disk once the writer has written them if they have left the window. A ``from`` older
than anything retained is refused (``gone``); an observer that falls behind retention while connected is
cut with ``gone``.

Queries (``query``, with ``last_seen`` or not) are answered by ``idled.server.engine.queries`` and queued among the
replies like any other.

``replicate`` is not an observer's request: it belongs to the ``standby`` login (``idled.server.ha.feed``),
so that no observer token can read the log as a standby or acknowledge records for ``--sync-standby``. An
observer that sends it -- a standby older than this core did, logging in as an observer -- is refused with
``not_allowed`` and a reason that says to upgrade it.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import trio

from idled.core.presence import PresenceTable
from idled.log.eventlog import EventLog, iter_records
from idled.protocol import (
    BYE,
    PING,
    PONG_FRAME,
    ErrorCode,
    FrameDecoder,
    Login,
    ProtocolError,
    Query,
    Replicate,
    Subscribe,
    Uid,
    Unwatch,
    Watch,
    Welcome,
    encode,
    receive_message,
)
from idled.protocol.replication import REPLICATE_NEEDS_STANDBY
from idled.server.engine.bus import EventBus, Subscription, event_frame
from idled.server.engine.queries import Queries
from idled.server.roles import watchlists
from idled.server.roles.doorway import SEND_ERROR_TIMEOUT, Connection, close_with
from idled.server.roles.watchlists import DEFAULT_MAX_WATCH, Change

__all__ = [
    "OBSERVER_STALL", "OBSERVER_WRITE_BYTES", "DiskCursor", "Gone", "REPLAY_BATCH", "REPLICATE_REFUSED", "REPLY_BYTES", "FrameWriter",
    "Observers", "Stalled",
]

log = logging.getLogger("idled.server.roles.observers")

OBSERVER_WRITE_BYTES = 256 * 1024  # one write to an observer carries up to this much
REPLY_BYTES = 256 * 1024  # replies waiting beyond this: stop reading the observer's requests
OBSERVER_STALL = 5.0  # seconds an observer may take no byte while data waits for it; then busy
REPLAY_BATCH = 1000  # records per disk read
DISK_CATCH_UP_POLL = 0.01  # seconds between two looks at the log while waiting for the writer
# What an observer's ``replicate`` is told: an older standby (it logged in as an observer) against this core.
REPLICATE_REFUSED = (REPLICATE_NEEDS_STANDBY + ' ({"op":"login","standby":NAME}), not an observer\'s: '
                     "this standby is older than this core; upgrade it (docs/ha.md#upgrades)")


class Stalled(Exception):
    """The peer took no byte for the stall limit while data waited for it."""


class Gone(Exception):
    """Events the observer still needs were deleted by retention."""


class FrameWriter:
    """Writes whole frames to one stream. Over a socket it knows how many bytes the kernel took, so a write
    stopped half-way (a stall, a cancellation) leaves ``partial``: the unsent end of the frame the peer has
    begun to receive, which ``finish`` completes before anything else may be framed after it."""

    __slots__ = ("stream", "socket", "partial")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self.partial = b""

    async def write(self, frames: list[bytes], stall: float) -> None:
        """Send ``frames``; raise ``Stalled`` if the peer takes no byte for ``stall`` seconds."""
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        if self.socket is None:
            await self.stream.send_all(data)
            return
        view = memoryview(data)
        sent = 0
        try:
            while sent < len(data):
                # A trio socket send that is cancelled has sent nothing, so `sent` is exact.
                with trio.move_on_after(stall) as scope:
                    sent += await self.socket.send(view[sent:])
                if scope.cancelled_caught:
                    raise Stalled
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc
        finally:
            if 0 < sent < len(data):
                self.partial = _rest_of_frame(frames, data, sent)

    async def finish(self) -> bool:
        """Complete a frame cut in two (within ``SEND_ERROR_TIMEOUT``, even while cancelled). False: it could
        not be, so no frame may follow."""
        if self.partial:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + SEND_ERROR_TIMEOUT
                try:
                    await self.stream.send_all(self.partial)
                    self.partial = b""
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                    pass
        return not self.partial


def _rest_of_frame(frames: list[bytes], data: bytes, sent: int) -> bytes:
    end = 0
    for frame in frames:
        start, end = end, end + len(frame)
        if sent < end:
            return data[sent:end] if sent > start else b""
    return b""


class DiskReader:
    """A position in the log on disk, kept between batches (opening one scans its segment from the start)."""

    __slots__ = ("records", "held", "next", "exhausted")

    def __init__(self, directory: str | os.PathLike[str], start: int) -> None:
        self.records: Iterator[dict[str, Any]] = iter_records(directory, start)
        self.held: dict[str, Any] | None = None  # read, but at or beyond the last batch's bound
        self.next = start
        self.exhausted = False  # the segments listed at opening are read to their end

    def take(self, count: int, below: int) -> list[dict[str, Any]]:
        """Up to ``count`` records with seq < ``below`` (blocking file I/O: runs in a worker thread)."""
        out: list[dict[str, Any]] = []
        while len(out) < count:
            record, self.held = self.held, None
            if record is None:
                record = next(self.records, None)
                if record is None:
                    self.exhausted = True
                    break
            if record["seq"] >= below:
                self.held = record
                break
            out.append(record)
        if out:
            self.next = out[-1]["seq"] + 1
        return out


class DiskCursor(Protocol):
    """Whoever reads events through ``Observers.events``/``from_disk`` (an observer; an HTTP event stream,
    ``idled.server.api.events``): where its last disk read stopped, kept between batches."""

    disk: DiskReader | None


class _Peer:
    """One observer connection's state, shared by its two tasks."""

    __slots__ = ("name", "subscription", "writer", "replies", "reply_bytes", "_room", "disk", "changes")

    def __init__(self, stream: trio.abc.Stream, name: str) -> None:
        self.name = name
        self.subscription = Subscription()
        self.writer = FrameWriter(stream)
        # (events before it, frame or watchlist change)
        self.replies: collections.deque[tuple[int, bytes | Change]] = collections.deque()
        self.reply_bytes = 0
        self._room = trio.Event()
        self.disk: DiskReader | None = None
        self.changes = 0  # watchlist changes in `replies`

    def change(self, horizon: int, entry: Change) -> None:
        """Queue a watchlist change: the replay filter takes it in once every event below ``horizon`` is sent."""
        self.replies.append((horizon, entry))
        self.reply_bytes += entry.size
        self.changes += 1
        self.subscription.wake()

    def reply(self, horizon: int, frame: bytes) -> None:
        """Queue ``frame`` to go out once every event below ``horizon`` has been sent."""
        self.replies.append((horizon, frame))
        self.reply_bytes += len(frame)
        self.subscription.wake()

    async def room(self) -> None:
        """Back-pressure: wait while too many reply bytes wait to be sent."""
        while self.reply_bytes > REPLY_BYTES:
            self._room = trio.Event()
            await self._room.wait()

    def ready_replies(self) -> list[bytes]:
        cursor = self.subscription.cursor
        out: list[bytes] = []
        size = 0
        while self.replies and (cursor is None or self.replies[0][0] <= cursor) and size < OBSERVER_WRITE_BYTES:
            frame = self.replies.popleft()[1]
            if type(frame) is Change:  # the replay filter has passed it: nothing to send
                self.changes -= 1
                self.reply_bytes -= frame.size
                self._room.set()
                continue
            assert type(frame) is bytes
            out.append(frame)
            size += len(frame)
        return out

    def sent(self, replies: list[bytes]) -> None:
        self.reply_bytes -= sum(map(len, replies))
        self._room.set()


class Observers:
    """The observer role (``run``). ``first_seq``: this run's first seq (the oldest one when nothing is on
    disk yet); ``peers`` holds the live observers for shutdown to close."""

    def __init__(
        self, presence: PresenceTable | None, bus: EventBus, log: EventLog, *, first_seq: int, peers: set[Connection],
        clock: Callable[[], float] = trio.current_time,
        max_watch: int = DEFAULT_MAX_WATCH, queries: Queries | None = None, replica: bool = False,
    ) -> None:
        if queries is None:
            assert presence is not None
            queries = Queries(presence, bus, log, first_seq=first_seq, clock=clock)
        self.queries = queries  # a standby's answers from its replicated log (idled.server.ha.follow)
        self.bus = bus
        self.log = log
        self.first_seq = first_seq
        self.peers = peers
        self.max_watch = max_watch
        self.replica = replica  # a standby's copy of the log: a `from` beyond it is "not yet", not a mistake
        self._connected: set[_Peer] = set()
        bus.start(first_seq)

    def queued_bytes(self) -> int:
        """Bytes held for observers right now beyond the shared window: replies waiting to be sent, the rest
        of frames cut in two, and watchlist queues (for metrics and tests; read on the event loop)."""
        return sum(peer.reply_bytes + len(peer.writer.partial) + peer.subscription.queue_bytes
                   for peer in self._connected)

    async def run(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        observer = Connection()
        peer = _Peer(stream, str(login.name))
        self.peers.add(observer)
        self._connected.add(peer)
        error: ProtocolError | None = None
        try:
            with observer.scope:
                await stream.send_all(encode(Welcome("observer", login.name)))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._sender, peer, observer, nursery.cancel_scope)
                    # Caught here, not outside: out of a nursery it would come wrapped in an ExceptionGroup,
                    # which the doorway's `except ProtocolError` does not catch (no error frame, a logged "bug").
                    try:
                        await self._requests(stream, decoder, peer)
                    except ProtocolError as exc:
                        error = exc
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    nursery.cancel_scope.cancel()
        finally:
            self.peers.discard(observer)
            self.bus.unsubscribe(peer.subscription)
        try:
            if not await peer.writer.finish():
                return  # a frame cut in two the peer would not take: no error frame can follow it
        finally:
            self._connected.discard(peer)
        if error is not None:
            raise error
        if observer.end is not None:
            await close_with(stream, *observer.end)

    async def _requests(self, stream: trio.abc.Stream, decoder: FrameDecoder, peer: _Peer) -> None:
        bus, subscription = self.bus, peer.subscription
        while True:
            await peer.room()
            message = await receive_message(stream, decoder)
            if message is None or message is BYE:
                return
            if type(message) is Subscribe:
                if bus.is_subscribed(subscription):
                    raise ProtocolError(ErrorCode.NOT_ALLOWED, "already subscribed")
                watchlists.subscribing(bus, subscription, message.uids, self.max_watch)
                await self.check_retained(message.from_seq)
                bus.subscribe(subscription, message.from_seq, durable=message.durable)
            elif type(message) is Watch or type(message) is Unwatch:
                change = watchlists.request(bus, subscription, message, self.max_watch)
                if change is not None:
                    peer.change(bus.next_seq, change)
            elif type(message) is Query:
                frame = await self.queries.answer(message)
                peer.reply(bus.next_seq, frame)
            elif message is PING:
                peer.reply(bus.next_seq, PONG_FRAME)
            elif isinstance(message, Replicate):  # or its subclass with the check (protocol.replication)
                raise ProtocolError(ErrorCode.NOT_ALLOWED, REPLICATE_REFUSED)
            else:
                raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for observers")

    async def check_retained(self, start: int | None) -> None:
        """Refuse a ``from`` beyond the next seq (``bad_message``; on a standby ``unavailable``: an observer that
        read further on the leader, come here on a failover or a lag, retries) or older than anything retained
        (``gone``)."""
        next_seq = self.bus.next_seq
        if start is not None and start > next_seq and self.replica:
            raise ProtocolError(ErrorCode.UNAVAILABLE, f"from={start}: this standby's copy ends at seq {next_seq - 1} "
                                "(the rest is not replicated yet); retry, or subscribe at the leader")
        if start is not None and start > next_seq:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"from={start} is beyond the next seq {next_seq}")
        if start is not None and start < next_seq:
            oldest = await trio.to_thread.run_sync(self.log.oldest_seq)
            if oldest is None:  # nothing on disk yet: this run's events are all written or queued to be
                oldest = self.first_seq
            available = min(x for x in (oldest, self.bus.oldest_recent(), next_seq) if x is not None)
            # Seq 1 is the first ever: asking for anything before it misses nothing.
            if start < available and available > 1:
                raise ProtocolError(ErrorCode.GONE, f"seq {start} is no longer retained; oldest available is {available}")

    async def _sender(self, peer: _Peer, observer: Connection, done: trio.CancelScope) -> None:
        """The only task writing to an observer's socket: replies, then events from the cursor on."""
        bus, subscription, writer = self.bus, peer.subscription, peer.writer
        from_disk = functools.partial(self.from_disk, peer)
        try:
            while True:
                watchlist = subscription.watching is not None and subscription.cursor is not None
                if watchlist:
                    watchlists.skip_quiet(bus, subscription)
                replies = peer.ready_replies()
                if replies:
                    await writer.write(replies, OBSERVER_STALL)
                    peer.sent(replies)
                    continue
                cursor = subscription.cursor
                if cursor is not None:
                    limit = bus.limit(subscription)
                    if peer.replies:  # the next reply goes out right after the events before it
                        limit = min(limit, peer.replies[0][0])
                    if watchlist:
                        step = await watchlists.next_frames(bus, subscription, cursor, limit, OBSERVER_WRITE_BYTES,
                                                            peer.replies if peer.changes else None, from_disk)
                        if step is not None:
                            frames, cursor = step
                            if frames:
                                await writer.write(frames, OBSERVER_STALL)
                            else:
                                await trio.lowlevel.checkpoint()  # a long filtered replay lets others run
                            subscription.cursor = cursor
                            continue
                    elif cursor < limit:
                        frames, cursor = await self.events(peer, cursor, limit)
                        if frames:
                            await writer.write(frames, OBSERVER_STALL)
                        subscription.cursor = cursor
                        continue
                await subscription.wait()
        except Stalled:
            log.warning("observer %s took nothing for %g s: disconnected (busy)", peer.name, OBSERVER_STALL)
            observer.close(
                ErrorCode.BUSY, f"observer read nothing for {OBSERVER_STALL:g} s; subscribe again with from=<last seq + 1>"
            )
        except Gone as exc:
            observer.close(ErrorCode.GONE, str(exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            done.cancel()  # the observer went away: end the connection (its reader may be blocked)

    async def events(self, peer: DiskCursor, cursor: int, limit: int) -> tuple[list[bytes], int]:
        """Frames from ``cursor`` on (below ``limit``), and the cursor after them."""
        oldest = self.bus.oldest_recent()
        if oldest is not None and cursor >= oldest:
            frames = self.bus.frames(cursor, limit, OBSERVER_WRITE_BYTES)
            return frames, cursor + len(frames)
        return await self.from_disk(peer, cursor, limit if oldest is None else min(limit, oldest))

    async def from_disk(self, peer: DiskCursor, cursor: int, below: int,
                         watched: Callable[[Uid], bool] | None = None) -> tuple[list[bytes], int]:
        first = self.first_seq
        if cursor < first:
            below = min(below, first)  # the previous runs' log: all of it is on disk
        else:
            # Published in this run, no longer in the window: it has reached the writer; wait until it is
            # written (the writer is at most LOG_BACKLOG_LIMIT behind, the window holds more than that).
            while self.log.last_seq < cursor:
                await trio.sleep(DISK_CATCH_UP_POLL)
            below = min(below, self.log.last_seq + 1)
        reader = peer.disk
        fresh = reader is None or reader.next != cursor
        if fresh:
            reader = DiskReader(self.log.directory, cursor)
        assert reader is not None
        records = await trio.to_thread.run_sync(reader.take, REPLAY_BATCH, below)
        peer.disk = None if reader.exhausted else reader  # re-list the segments next time
        if cursor < first:
            if not records:
                return [], first  # nothing more from the previous runs: the rest is a gap
        elif not records or records[0]["seq"] != cursor:
            if records or fresh or reader.held is not None:
                raise Gone(f"seq {cursor} was deleted by retention before this observer read it")
            return [], cursor  # the reader's segment list ended: look again with a fresh one
        if watched is not None:
            return [event_frame(record) for record in records if watched(record["uid"])], records[-1]["seq"] + 1
        return [event_frame(record) for record in records], records[-1]["seq"] + 1

