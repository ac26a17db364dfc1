"""The observer role: ``subscribe`` to presence events (live, or resumed from a seq), ``query`` who is online.

Theory of operation
-------------------
Two tasks per observer: the *requests* task reads frames and queues every reply; the *sender* is the only
task writing to the socket, draining the subscription's bounded queue (``bus.Subscription``) in writes of up
to ``OBSERVER_WRITE_BYTES``. An observer that lets its queue fill is disconnected (``busy``) and may come back
with ``subscribe from=<last seq + 1>``.

Resuming: ``subscribe from=N`` registers the observer live at the next seq and queues ``REPLAY_MARKER`` in the
same step (no checkpoint between, so the marker precedes every live frame). When the sender reaches the
marker it replays ``[N, live_from)`` first: from the log on disk for what is older than the bus's window of
recent events (after waiting for the writer to have put it there), in ``REPLAY_BATCH`` records per write,
then from a snapshot of the window. A ``from`` older than anything retained is refused (``gone``).
"""

from __future__ import annotations

from typing import Any

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
    Status,
    Subscribe,
    Welcome,
    encode,
    receive_message,
)
from idled.server.bus import EventBus, Subscription, event_frame
from idled.server.conn import Connection, close_with

__all__ = ["OBSERVER_WRITE_BYTES", "REPLAY_BATCH", "REPLAY_MARKER", "Observers"]

REPLAY_BATCH = 1000  # records (or window frames) per write while replaying
OBSERVER_WRITE_BYTES = 64 * 1024  # one write to an observer carries up to this much of its backlog
REPLAY_MARKER = b""  # queued at subscribe: "replay the requested range here, before the live frames"
DISK_CATCH_UP_POLL = 0.01  # seconds between two looks at the log while waiting for the writer


class Observers:
    """The observer role (``run``). ``first_seq``: this run's first seq (the oldest one when nothing is on
    disk yet); ``peers`` holds the live observers for shutdown to close."""

    def __init__(
        self, presence: PresenceTable, bus: EventBus, log: EventLog, *, first_seq: int, peers: set[Connection]
    ) -> None:
        self.presence = presence
        self.bus = bus
        self.log = log
        self.first_seq = first_seq
        self.peers = peers

    async def run(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        observer = Connection()
        subscription = Subscription(
            lambda: observer.close(ErrorCode.BUSY, "observer fell behind; subscribe again with from=<last seq + 1>")
        )
        self.peers.add(observer)
        try:
            error: ProtocolError | None = None
            with observer.scope:
                await stream.send_all(encode(Welcome("observer", login.name)))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._sender, stream, subscription, nursery.cancel_scope)
                    # Caught here, not outside: out of a nursery it would come wrapped in an ExceptionGroup,
                    # which the doorway's `except ProtocolError` does not catch (no error frame, a logged "bug").
                    try:
                        await self._requests(stream, decoder, subscription)
                    except ProtocolError as exc:
                        error = exc
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    nursery.cancel_scope.cancel()
        finally:
            self.peers.discard(observer)
            self.bus.unsubscribe(subscription)
        if error is not None:
            raise error
        if observer.end is not None:
            await close_with(stream, *observer.end)

    async def _requests(self, stream: trio.abc.Stream, decoder: FrameDecoder, subscription: Subscription) -> None:
        presence, bus = self.presence, self.bus
        while True:
            message = await receive_message(stream, decoder)
            if message is None or message is BYE:
                return
            if type(message) is Subscribe:
                if bus.is_subscribed(subscription):
                    raise ProtocolError(ErrorCode.NOT_ALLOWED, "already subscribed")
                await self._check_retained(message.from_seq)
                # No checkpoint between these two lines: the replay marker precedes every live frame.
                bus.subscribe(subscription, presence.next_seq, message.from_seq)
                _queue(subscription, REPLAY_MARKER)
            elif type(message) is Query:
                _queue(subscription, encode(Status({uid: presence.is_online(uid) for uid in message.uids})))
            elif message is PING:
                _queue(subscription, PONG_FRAME)
            else:
                raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for observers")

    async def _check_retained(self, start: int | None) -> None:
        """Refuse a ``from`` beyond the next seq (``bad_message``) or older than anything retained (``gone``)."""
        next_seq = self.presence.next_seq
        if start is not None and start > next_seq:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"from={start} is beyond the next seq {next_seq}")
        if start is not None and start < next_seq:
            oldest = await trio.to_thread.run_sync(self.log.oldest_seq)
            if oldest is None:  # nothing on disk yet: this run's events are all written or queued to be
                oldest = self.first_seq
            available = min(x for x in (oldest, self.bus.oldest_recent(), self.presence.next_seq) if x is not None)
            # Seq 1 is the first ever: asking for anything before it misses nothing.
            if start < available and available > 1:
                raise ProtocolError(ErrorCode.GONE, f"seq {start} is no longer retained; oldest available is {available}")

    async def _sender(self, stream: trio.abc.Stream, subscription: Subscription, done: trio.CancelScope) -> None:
        """The only task writing to an observer's socket: replies, replay (at the marker), live events."""
        try:
            async for frame in subscription.receive:
                # Whatever else is already queued goes out in the same write: one send per burst, not
                # per event, or a mass expiry outruns the observer (~3k sends/s against ~10k events/s).
                batch: list[bytes] = []
                size = 0
                while True:
                    if frame is REPLAY_MARKER:
                        if batch:
                            await stream.send_all(b"".join(batch))
                            batch, size = [], 0
                        if subscription.replay_from is not None:
                            await self._replay(stream, subscription.replay_from, subscription.live_from)
                    else:
                        batch.append(frame)
                        size += len(frame)
                    if size >= OBSERVER_WRITE_BYTES:
                        break
                    try:
                        frame = subscription.receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                if batch:
                    await stream.send_all(b"".join(batch))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            done.cancel()  # the observer went away: end the connection (its reader may be blocked)

    async def _replay(self, stream: trio.abc.Stream, start: int, below: int) -> None:
        """Send events ``[start, below)``: older ones from the log on disk, the rest from the recent window."""
        window_start, frames = self.bus.recent_from(start, below)
        if start < window_start:
            # Everything before the window has reached the writer; wait until it is on disk too.
            while self.log.last_seq < window_start - 1:
                await trio.sleep(DISK_CATCH_UP_POLL)
            records = iter_records(self.log.directory, start)
            while batch := await trio.to_thread.run_sync(_take, records, REPLAY_BATCH, window_start):
                await stream.send_all(b"".join(event_frame(record) for record in batch))
        for i in range(0, len(frames), REPLAY_BATCH):  # batched like the disk part: up to 100k frames
            await stream.send_all(b"".join(frames[i : i + REPLAY_BATCH]))


def _queue(subscription: Subscription, frame: bytes) -> None:
    try:
        subscription.send.send_nowait(frame)
    except trio.WouldBlock:
        subscription.on_overflow()


def _take(records: Any, count: int, below: int) -> list[dict[str, Any]]:
    out = []
    for record in records:
        if record["seq"] >= below:
            break
        out.append(record)
        if len(out) >= count:
            break
    return out
