"""``GET /v1/events``: the presence event stream as Server-Sent Events, on the API's listener.

Theory of operation
-------------------
A follower is an observer that speaks HTTP. It reads the same sequence through the same machinery as an
observer (``idled.server.roles.observers``): a ``bus.Subscription`` whose *cursor* walks the bus's shared
window of recent frames, or the log on disk (``Observers.events``) once it is older than the window; a
watchlist follower is a watchlist subscription (the bus's uid index and bounded queue, replayed filtered on
overflow: ``idled.server.roles.watchlists.next_frames``); a durable follower stops at the bus's
``durable_seq``. So there is one event path, and a follower costs no memory per event however far behind it
is: in flight is one write of about ``WRITE_BYTES``.

**Resuming.** Each event goes out as ``id: <seq>`` / ``event: <kind>`` / ``data: <the event as JSON>``. A
client that reconnects with ``Last-Event-ID: N`` (what every SSE client, a browser's ``EventSource``
included, sends by itself) resumes at ``N + 1``; ``?from=N`` starts at ``N`` (an observer's ``subscribe
from=N``); the header wins, because a client's reconnection repeats the URL it first asked for. The first
event sent is the first one at or after the start, the cursor walks seqs one by one: no gap, no duplicate,
whatever the reconnection's timing. A start beyond the next seq is ``400``; one older than anything retained
is ``410 gone`` (the observer's ``gone``). Without either, the stream starts at the next event.

**What a follower costs.** Every observer's sender is a task woken per event; a thousand followers so
would be a thousand wake-ups per event, a task switch and a write each. The full-stream live followers
instead form a *group* at one shared cursor, ``group_cursor``, served by one *fan-out* task
(``Events.run``): the bus wakes one subscription for all of them (``_Hub``), and each round the fan-out takes
the new events from the window, makes each event's text once (``Texts``), frames the batch once (an HTTP/1.1
chunk), and writes it to every member with a non-blocking ``os.write`` -- no task switch per follower. A
member whose socket does not take the whole chunk leaves the group (``leave``) with the rest of that chunk
as ``pending``: its own task sends it first, under the stall rule, then catches up alone (from the window or
the disk) to ``group_cursor`` and joins again. A new follower, or one resumed from an older seq, does the
same. Watchlist and durable followers are never grouped: the bus wakes them as it wakes observers (by their
matches, by durability), and HTTP/1.0 followers (no chunks) catch up alone each round.

**Heartbeats and stalls.** After ``api_heartbeat`` seconds with nothing written by its own task, a comment
line (``: heartbeat``) goes out (a grouped follower's task writes nothing itself: it leaves the group for the
heartbeat, every ``api_heartbeat`` seconds, and joins again): a proxy sees traffic and keeps the
connection, and a dead client is found by the failing write. A follower that takes no byte for ``OBSERVER_STALL`` seconds while data waits for it is cut
like an observer: the rest of the write in flight is completed, then an ``event: end`` with
``{"code": "busy", ...}`` (no ``id``: the client's last event id stays the last event it got), each within
``SEND_ERROR_TIMEOUT``, and the connection closes; it comes back with ``Last-Event-ID`` and misses nothing.
When the server stops, ``stop()`` ends every stream the same way, with ``server_shutdown``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import msgpack
import trio

from idled.protocol import ErrorCode, ProtocolError, Uid, check_uid
from idled.server.api.errors import ApiError
from idled.server.api.request import query_parameters
from idled.server.engine.bus import EventBus, Subscription
from idled.server.roles import watchlists
from idled.server.roles.doorway import SEND_ERROR_TIMEOUT
from idled.server.roles.observers import OBSERVER_STALL, FrameWriter, Gone, Observers, Stalled, DiskReader

__all__ = ["EVENTS_PATH", "TEXTS", "WRITE_BYTES", "EventStream", "Events", "Follow", "follow_request", "sse_text"]

log = logging.getLogger("idled.server.api")

EVENTS_PATH: Final = "/v1/events"
WRITE_BYTES: Final = 64 * 1024  # msgpack bytes of events taken for one write (about twice that as SSE text)
TEXTS: Final = 16384  # SSE texts of recent seqs kept, shared by every follower
RETRY_MS: Final = 1000  # the reconnection delay suggested to clients (the SSE `retry:` field)
HEARTBEAT: Final = b": heartbeat\n\n"
MAX_SEQ: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Follow:
    """What a ``GET /v1/events`` asks: where to start (None: the next event), which uids (None: all), and
    whether only durable events."""

    from_seq: int | None
    uids: tuple[Uid, ...] | None
    durable: bool


def _seq(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > MAX_SEQ:
        raise ApiError("bad_request", f"{what} must be a seq (a decimal integer 0..{MAX_SEQ}), got {text[:40]!r}")
    return int(text)


def follow_request(query: str, last_event_ids: Sequence[str], max_watch: int) -> Follow:
    """The parameters of ``GET /v1/events`` (``uid`` repeated, ``from``, ``durable``) and its ``Last-Event-ID``
    headers (pure; ``ApiError`` on anything else)."""
    pairs = query_parameters(query, ("uid", "from", "durable"), max_watch + 8, "GET /v1/events")
    uids: list[Uid] = []
    start: int | None = None
    durable = False
    for name, value in pairs:
        if name == "uid":
            uids.extend(_query_uid(value))
        elif name == "from" and start is None:
            start = _seq(value, "from")
        elif name == "durable" and value in ("true", "false"):
            durable = value == "true"
        else:
            raise ApiError("bad_request", f"{name} given twice" if name == "from" else "durable must be true or false")
    if len(last_event_ids) > 1:
        raise ApiError("bad_request", "more than one Last-Event-ID header")
    if last_event_ids and last_event_ids[0].strip():  # (an empty one means none: the SSE specification)
        start = _seq(last_event_ids[0].strip(), "Last-Event-ID") + 1
    if len(set(uids)) > max_watch:
        raise ApiError("too_large", f"at most {max_watch} uids per stream (max_watch)")
    return Follow(start, tuple(uids) if uids else None, durable)


def _query_uid(value: str) -> tuple[Uid, ...]:
    """A uid from a query string: the string, and the integer uid it spells if it is one (``uid=42`` follows
    both ``"42"`` and ``42``: a query string cannot tell them apart)."""
    try:
        uid = check_uid(value)
        str(uid).encode()
    except (ProtocolError, UnicodeError) as exc:
        raise ApiError("bad_request", str(exc)) from None
    if value.isascii() and value.isdigit() and value == str(int(value)) and int(value) <= MAX_SEQ:
        return uid, int(value)
    return (uid,)


def sse_text(frame: bytes) -> bytes:
    """One event frame (as observers receive it) as an SSE event: ``id`` its seq, ``event`` its kind,
    ``data`` the event record as JSON (the fields webhooks carry). JSON escapes every line break in strings,
    so ``data`` is one line."""
    record = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
    record.pop("op", None)
    data = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=repr)
    return f"id: {record['seq']}\nevent: {record['kind']}\ndata: {data}\n\n".encode()


def end_text(code: str, message: str) -> bytes:
    """The last event of a stream the server ends: why (no ``id``, so the client's last event id stays)."""
    data = json.dumps({"code": code, "message": message}, separators=(",", ":"))
    return f"event: end\ndata: {data}\n\n".encode()


class Texts:
    """The SSE text of each recent event, made once for every follower (see the module docstring)."""

    def __init__(self, size: int = TEXTS) -> None:
        self._size = size
        self._seqs = [-1] * size
        self._texts = [b""] * size
        self._batch: tuple[int, int, bytes] = (-1, 0, b"")  # (first seq, count, joined text)

    def consecutive(self, start: int, frames: list[bytes]) -> bytes:
        """The text of ``frames``, the events of seqs ``start, start + 1, ...``."""
        first, count, joined = self._batch
        if first == start and count == len(frames):
            return joined
        seqs, texts, size = self._seqs, self._texts, self._size
        parts = []
        for seq, frame in enumerate(frames, start):
            slot = seq % size
            if seqs[slot] != seq:
                texts[slot] = sse_text(frame)
                seqs[slot] = seq
            parts.append(texts[slot])
        joined = b"".join(parts)
        self._batch = (start, len(frames), joined)
        return joined


class _Hub(Subscription):
    """The one subscription the full-stream live followers share: the bus wakes it per event, and it sets
    ``published``, which every such follower with nothing to send waits on. Its cursor is None (it sends
    nothing itself: the bus counts nothing undelivered for it)."""

    __slots__ = ("published",)

    def __init__(self) -> None:
        super().__init__()
        self.published = trio.Event()

    def wake(self) -> None:
        self.cursor = None
        self.published.set()

    async def next_publish(self) -> None:
        """Sleep until the next event is published (the caller has just found nothing to send: with no
        checkpoint between that look and this call, no event can fall in between)."""
        if self.published.is_set():
            self.published = trio.Event()
        await self.published.wait()


class Events:
    """The route's shared state: the hub, the texts, the group and its fan-out (``run``, a task of the API's);
    ``stream`` makes one follower."""

    def __init__(self, observers: Observers, *, heartbeat: float, max_watch: int) -> None:
        self.observers = observers
        self.bus: EventBus = observers.bus
        self.heartbeat = heartbeat
        self.max_watch = max_watch
        self.texts = Texts()
        self.hub = _Hub()
        self.bus.subscribe(self.hub, None)
        self.followers = 0
        self.group: set[EventStream] = set()  # followers at group_cursor, written to by the fan-out
        self.group_cursor = self.bus.next_seq
        self._round = trio.Event()  # set after each fan-out round

    def stream(self, query: str) -> EventStream:
        return EventStream(self, query)

    async def run(self) -> None:
        """The fan-out: each round, the events published since the last one to every grouped follower."""
        while True:
            await self.hub.next_publish()
            self.fan_out()
            self._round.set()
            self._round = trio.Event()

    async def next_round(self) -> None:
        await self._round.wait()

    def fan_out(self) -> None:
        """Write ``[group_cursor, next_seq)`` to every grouped follower, as one chunk per batch, with a
        non-blocking write each: a follower whose socket does not take a whole chunk leaves the group, with
        the rest of that chunk to send first (its own task then sends it, and catches up, under the stall
        rule)."""
        bus, group = self.bus, self.group
        start, limit = self.group_cursor, bus.next_seq
        oldest = bus.oldest_recent()
        if group and (oldest is None or start < oldest):  # (the fan-out starved past the window: each alone)
            for member in list(group):
                member.leave(b"", start)
            group.clear()
        while group and start < limit:
            frames = bus.frames(start, limit, WRITE_BYTES)
            end = start + len(frames)
            data = _chunk(self.texts.consecutive(start, frames))
            for member in list(group):
                fd = member.fd
                try:
                    sent = os.write(fd, data)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    member.leave(b"", start, broken=True)
                    continue
                if sent < len(data):
                    member.leave(data[sent:], end) if sent else member.leave(b"", start)
            start = end
        self.group_cursor = limit


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (RFC 9112 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class EventStream:
    """One follower: the document a handler returns; the HTTP loop calls ``open`` with the request's
    headers (ApiError: refused, nothing sent yet), then ``run`` until the stream ends, ``stop`` to end it."""

    def __init__(self, events: Events, query: str) -> None:
        self.events = events
        self.query = query
        self.subscription = Subscription()
        self.disk: DiskReader | None = None  # (observers.DiskCursor)
        self.shared = False  # a full-stream live follower: may join the group
        self.subscribed = False
        self.ending: tuple[str, str] | None = None
        self.fd = -1  # the socket's descriptor (a socket stream, chunked framing: may join the group)
        self.pending = b""  # the rest of a chunk the fan-out began: sent before anything else
        self.broken = False  # a fan-out write failed: the client is gone
        self.frame: Callable[[bytes], bytes] = _chunk
        self._solo = trio.Event()
        self._scope = trio.CancelScope()
    async def open(self, headers: Sequence[tuple[bytes, bytes]]) -> None:
        events = self.events
        last = [value.decode("latin-1") for name, value in headers if name == b"last-event-id"]
        follow = follow_request(self.query, last, events.max_watch)
        try:
            await events.observers.check_retained(follow.from_seq)
        except ProtocolError as exc:
            raise ApiError("gone" if exc.code == ErrorCode.GONE else "bad_request", exc.reason) from None
        bus, subscription = events.bus, self.subscription
        if follow.uids is not None:
            bus.watch(subscription, follow.uids)
            bus.subscribe(subscription, follow.from_seq, durable=follow.durable)
        elif follow.durable:
            bus.subscribe(subscription, follow.from_seq, durable=True)
        else:  # the hub wakes it; the bus does not know it (see the module docstring)
            subscription.cursor = bus.next_seq if follow.from_seq is None else follow.from_seq
            self.shared = True
        self.subscribed = True
        events.followers += 1

    def stop(self) -> None:
        """End the stream (the server stops): what is being written completes, then the ``end`` event."""
        if self.ending is None:
            self.ending = (ErrorCode.SERVER_SHUTDOWN.value, "the server is shutting down; reconnect with "
                           "Last-Event-ID to resume")
        self._scope.cancel()

    async def run(self, stream: trio.abc.Stream, head: bytes, chunked: bool, last: Callable[[], bytes], *,
                  once: bool = False) -> None:
        """Stream events after ``head`` (the response head), in HTTP/1.1 chunks if ``chunked`` (else as they
        are: an HTTP/1.0 client, the connection's end ends the response); ``last``: the bytes that end the
        response. ``once``: the head alone (a HEAD request; the server is stopping)."""
        if once:
            self._close()
            with trio.move_on_after(SEND_ERROR_TIMEOUT):
                await stream.send_all(head + last())
            return
        if not chunked:
            self.frame = bytes
        elif isinstance(stream, trio.SocketStream):
            self.fd = stream.socket.fileno()
        writer = FrameWriter(stream)
        try:
            with self._scope:
                preamble = self.frame(f"retry: {RETRY_MS}\n: idled events\n\n".encode())
                await writer.write([head + preamble], OBSERVER_STALL)
                while True:
                    data: bytes | None = None
                    with trio.move_on_after(self.events.heartbeat):
                        data = await self._next()
                    await writer.write([data or self.frame(HEARTBEAT)], OBSERVER_STALL)
        except Stalled:
            log.warning("event stream took nothing for %g s: disconnected (busy)", OBSERVER_STALL)
            self.ending = (ErrorCode.BUSY.value, f"the stream read nothing for {OBSERVER_STALL:g} s; reconnect "
                           "with Last-Event-ID to resume")
        except Gone as exc:
            self.ending = (ErrorCode.GONE.value, str(exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self._close()
        if self.ending is not None and await writer.finish():
            with trio.CancelScope(shield=True) as scope, trio.move_on_after(SEND_ERROR_TIMEOUT):
                scope.deadline = trio.current_time() + SEND_ERROR_TIMEOUT
                try:
                    await stream.send_all(self.pending + self.frame(end_text(*self.ending)) + last())
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                    pass

    def leave(self, pending: bytes, cursor: int, *, broken: bool = False) -> None:
        """Out of the group (the fan-out): ``pending`` (the rest of a chunk) goes first, then from ``cursor``."""
        self.events.group.discard(self)
        self.pending, self.subscription.cursor, self.broken = pending, cursor, broken
        self._solo.set()

    def _close(self) -> None:
        if self in self.events.group:
            self.leave(b"", self.events.group_cursor)
        if self.subscribed:
            self.subscribed = False
            self.events.followers -= 1
            if not self.shared:
                self.events.bus.unsubscribe(self.subscription)

    async def _next(self) -> bytes:
        """The next bytes to write, framed (waiting for events)."""
        events, subscription = self.events, self.subscription
        bus = events.bus
        while True:
            if self.broken:
                raise trio.BrokenResourceError("the client is gone")
            if self.pending:
                pending, self.pending = self.pending, b""
                return pending
            cursor = subscription.cursor
            assert cursor is not None
            limit = bus.limit(subscription)
            if self.shared:
                group = events.group_cursor
                if cursor == group and self.fd >= 0:
                    await self._grouped()
                    continue
                if cursor > group:  # ahead of the group (new, and the fan-out has not run yet): wait for it
                    await events.next_round()
                    continue
                limit = group  # behind it: catch up to it, alone, then join it
            if subscription.watching is not None:
                watchlists.skip_quiet(bus, subscription)
                cursor = subscription.cursor
                assert cursor is not None
                step = await watchlists.next_frames(bus, subscription, cursor, limit, WRITE_BYTES, None,
                                                    self._from_disk)
                if step is not None:
                    frames, subscription.cursor = step
                    if frames:
                        return self.frame(b"".join(map(sse_text, frames)))
                    await trio.lowlevel.checkpoint()  # a long filtered replay lets others run
                    continue
            elif cursor < limit:
                oldest = bus.oldest_recent()
                if oldest is not None and cursor >= oldest:
                    frames = bus.frames(cursor, limit, WRITE_BYTES)
                    subscription.cursor = cursor + len(frames)
                    return self.frame(events.texts.consecutive(cursor, frames))
                frames, subscription.cursor = await events.observers.events(self, cursor, limit)
                if frames:
                    return self.frame(b"".join(map(sse_text, frames)))
                continue
            if self.shared:
                await events.next_round()  # (an HTTP/1.0 follower: never grouped)
            else:
                await subscription.wait()

    async def _grouped(self) -> None:
        """Wait in the group, the fan-out writing to this follower, until it leaves (``leave``: a write it did
        not take whole, a broken connection) or the wait is cancelled (a heartbeat is due, the server stops:
        it leaves where the group is, so its own task may write)."""
        events = self.events
        self._solo = trio.Event()
        events.group.add(self)
        try:
            await self._solo.wait()
        finally:
            if self in events.group:
                events.group.discard(self)
                self.subscription.cursor = events.group_cursor

    async def _from_disk(self, cursor: int, below: int, watched: Callable[[Uid], bool]) -> tuple[list[bytes], int]:
        return await self.events.observers.from_disk(self, cursor, below, watched)
