"""An observer: typed presence events as an async iterator, resumed without loss after any disconnect.

Theory of operation
-------------------
The reader task puts each new `Event` into a bounded mailbox that the application drains with
``async for event in observer``. Its position (`ObserverCursor.last`, see `idled.client.core`) is the seq
of the last event put there; after a dropped connection, a restarted server or a `busy` (the server cuts an
observer that falls more than 65,536 events behind) the link reconnects and subscribes with
``from = last + 1``: no event is missed, and an event the server sends twice (overlap at the resume seam) is
dropped by seq before the application sees it.

Checkpoints: an application that must not lose events across its *own* restart stores the seq of each event
it has fully processed (in the same transaction as its effect) and passes it as `after=` when it starts
again. Events after the checkpoint are then delivered again -- at-least-once -- and the application can tell
duplicates by `seq <= stored`. `after=0` reads everything the server still retains (seq 1 is the first ever);
`after=None` starts from now. If the requested events are no longer retained, iteration raises `Gone`
(with `oldest_seq`): resynchronise with `query` and start again from there.

Durable or fast: with ``durable=True`` the server delivers only events already durable in its event log
under its fsync policy (Kafka's high watermark), so nothing this observer sees can be erased by a crash of
the server: after the restart the table it built equals the one the log rebuilds. The price is latency (one
fdatasync under ``--fsync always``, up to the sync interval under ``interval``). The default is chosen from
`after`: given a checkpoint (any int, 0 included) the observer keeps state, and reads the durable view;
from now (``after=None``, a dashboard or an alerting hook) it reads the fast one. Pass ``durable=`` to
override either way.

Known gap: subscribing "from now" has no acknowledgement carrying the current seq, so a connection lost
before the first event arrives resubscribes from now again and may skip events in between. Start from a
checkpoint (or `after=0`) when that matters; a `subscribed` reply with the next seq would close the gap
server-side.

`query(uids)` may be called from another task while events stream: the server answers in order, behind the
events already queued, so each reply is matched to the oldest outstanding query. `query(uids, last_seen=True)`
also asks when each user was last active and which devices it has online: one `UserStatus` per uid (a
server older than the flag refuses it with `bad_message`).

A connection counts as up (`Link._settle`: the backoff starts again from its shortest delay, a loss is
followed at once) once its subscription is taken: the first frame after it that is not an error says so (an
event of the replay, or the pong of a ping sent after the subscribe frames, for when there is nothing to
replay).
A subscription refused instead (``gone``; ``unavailable`` from a standby whose copy has not reached the seq
to resume from) is a failed attempt at that core.

Watchlists: ``uids=[...]`` (even empty) subscribes to the events of those uids only; `watch(uids)` and
`unwatch(uids)` change the list and return once the server applies the change (a `ping` after the frames,
answered in order: events published after that are filtered by the new list). The client keeps the list and
sends all of it again on every reconnection, before its `subscribe` (`ObserverCursor.subscribe_frames`), so
a resumed watchlist observer misses none of its uids' events. Its seqs skip those of other uids.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, overload

from idled.client.core import Backoff, ObserverCursor
from idled.client.errors import ClientError, ConnectionLost
from idled.client.leader import Hosts
from idled.client.link import Conn, Flag, Link, Mailbox, Runtime
from idled.protocol import DEFAULT_MAX_FRAME, PING_FRAME, Event, Login, Query, Status, Uid, Welcome, encode
from idled.protocol import Pong

__all__ = ["Observer", "UserStatus", "DEFAULT_BUFFER"]

DEFAULT_BUFFER: Final = 1024  # events read ahead of the application before the reader stops reading


@dataclass(frozen=True, slots=True)
class UserStatus:
    """One user in the answer to ``query(uids, last_seen=True)``. ``last_seen``: wall unix seconds of its last
    activity (online: the latest over its sessions; offline: when its last session was last active), None if
    the server does not know (never seen, or longer ago than its ``last_seen_horizon``). ``devices``: the
    devices it is online with (empty: none named, or offline)."""

    online: bool
    last_seen: float | None = None
    devices: tuple[str, ...] = ()


class _Reply:
    """A request waiting for its answer: a `status` (query) or a `pong` (a watchlist change's ping, or the ping
    after a connection's subscription)."""

    __slots__ = ("flag", "value")

    def __init__(self, flag: Flag) -> None:
        self.flag = flag
        self.value: Status | Pong | ClientError | None = None


class Observer(Link):
    """An observer connection; create it through `idled.client.trio.open_observer` or the asyncio twin."""

    def __init__(self, runtime: Runtime, host: Hosts, port: int | None, name: str, *, token: str | None = None,
                 after: int | None = None, durable: bool | None = None, subscribe: bool = True,
                 buffer: int = DEFAULT_BUFFER, reconnect: bool = True, backoff: Backoff | None = None,
                 connect_timeout: float = 10.0, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None, uids: Iterable[Uid] | None = None) -> None:
        super().__init__(runtime, host, port, Login("observer", name, token), reconnect=reconnect,
                         backoff=backoff, connect_timeout=connect_timeout,
                         ssl_context=ssl_context, server_hostname=server_hostname)
        self.cursor = ObserverCursor(after, durable, uids)
        self.subscribe = subscribe
        self.duplicates = 0  # events dropped because their seq was already delivered
        self._events: Mailbox[Event] = Mailbox(runtime, buffer)
        self._replies: deque[_Reply] = deque()
        self._unsettled = False  # subscribed on this connection, and nothing heard since (see _on_welcome)

    @property
    def durable(self) -> bool:
        """Whether this observer subscribes to the durable view (only events already in the event log)."""
        return self.cursor.durable

    @property
    def watchlist(self) -> list[Uid] | None:
        """The uids watched (None: every event)."""
        return None if self.cursor.uids is None else list(self.cursor.uids)

    @property
    def position(self) -> int | None:
        """Seq of the last event received (None: nothing yet, subscribed from now)."""
        return self.cursor.last

    def __aiter__(self) -> Observer:
        return self

    async def __anext__(self) -> Event:
        mailbox = self._events
        if mailbox.items and mailbox.waiting_writer is None:  # the per-event fast path: no await
            return mailbox.items.popleft()
        event = await mailbox.get()
        if event is None:
            if self.error is not None:
                raise self.error
            raise StopAsyncIteration
        return event

    @overload
    async def query(self, uids: Iterable[Uid], *, last_seen: Literal[False] = False) -> dict[Uid, bool]: ...

    @overload
    async def query(self, uids: Iterable[Uid], *, last_seen: Literal[True]) -> dict[Uid, UserStatus]: ...

    async def query(self, uids: Iterable[Uid], *, last_seen: bool = False) -> dict[Uid, bool] | dict[Uid, UserStatus]:
        """Which of these uids are online (keys as given: 42 and "42" differ). ``last_seen=True``: a
        `UserStatus` per uid instead (online, when last active, its devices)."""
        uids = tuple(uids)
        status = await self._status(Query(uids, last_seen))
        if not last_seen:
            return dict(status.online)
        seen, devices = status.last_seen or {}, status.devices or {}
        return {
            uid: UserStatus(bool(status.online.get(uid)), seen.get(uid), tuple(devices.get(uid, ())))
            for uid in uids
        }

    async def _status(self, query: Query) -> Status:
        frame = encode(query)
        reply = _Reply(self.runtime.event())
        async with self._send_lock:
            conn = await self.wait_connected()
            self._replies.append(reply)
            await conn.send_all(frame)
            self.frames_sent += 1
        await reply.flag.wait()
        if isinstance(reply.value, ClientError):
            raise reply.value
        assert type(reply.value) is Status  # replies come in request order: a query's is its status
        return reply.value

    async def watch(self, uids: Iterable[Uid]) -> None:
        """Add ``uids`` to the watchlist (an observer opened with ``uids=``); returns once the server applies
        it: their events published from then on are delivered."""
        await self._change(self.cursor.watch(uids))

    async def unwatch(self, uids: Iterable[Uid]) -> None:
        """Remove ``uids`` from the watchlist; returns once the server applies it."""
        await self._change(self.cursor.unwatch(uids))

    async def _change(self, frames: list[bytes]) -> None:
        # The list is changed locally first: a reconnection from here on sends it whole, so the change is
        # confirmed by a pong on whichever connection carries it.
        while True:
            reply = _Reply(self.runtime.event())
            async with self._send_lock:
                conn = await self.wait_connected()
                self._replies.append(reply)
                try:
                    for frame in frames:
                        await conn.send_all(frame)
                    await conn.send_all(PING_FRAME)
                    self.frames_sent += len(frames) + 1
                except ConnectionLost:
                    pass  # the reader sees it too: the disconnect fails the reply, and we go round again
            await reply.flag.wait()
            if not isinstance(reply.value, ClientError):
                return
            if self.error is not None or self.done:
                raise reply.value
            frames = []  # disconnected: the next connection's subscribe carries the list; confirm there

    async def _on_welcome(self, conn: Conn, welcome: Welcome) -> None:
        if self.subscribe:
            # The server answers a subscription it refuses with an error frame, and one it takes with events
            # (a replay) or nothing: so the first frame after the welcome that is not an error settles the
            # connection (Link._settle), and a ping after the subscription makes sure one comes (its pong,
            # answered in order, at once when there is nothing to replay). Its reply is the first in line:
            # nobody else may send before this returns.
            self._unsettled = True
            self._replies.append(_Reply(self.runtime.event()))
            for frame in self.cursor.subscribe_frames(welcome.max_frame or DEFAULT_MAX_FRAME):
                await conn.send_all(frame)
            await conn.send_all(PING_FRAME)

    def _settles_at_welcome(self) -> bool:
        return not self.subscribe

    async def _on_message(self, message: Any) -> None:
        if self._unsettled:  # before a full mailbox can hold the reader up (see _on_welcome)
            self._unsettled = False
            self._settle()
        if type(message) is Event:
            if self.cursor.accept(message):
                mailbox = self._events
                if len(mailbox.items) < mailbox.maxsize and mailbox.waiting_reader is None:
                    mailbox.items.append(message)  # the per-event fast path: no await, nobody to wake
                else:
                    await mailbox.put(message)
            else:
                self.duplicates += 1
        elif type(message) is Status or type(message) is Pong:
            if self._replies:
                reply = self._replies.popleft()
                reply.value = message
                reply.flag.set()

    def _fail_replies(self, error: ClientError) -> None:
        while self._replies:
            reply = self._replies.popleft()
            reply.value = error
            reply.flag.set()

    def _on_disconnect(self) -> None:
        self._unsettled = False
        self._fail_replies(ConnectionLost("disconnected before the status reply"))

    def _on_done(self) -> None:
        self._fail_replies(self.error or ConnectionLost("the observer is closed"))
        self._events.close()
