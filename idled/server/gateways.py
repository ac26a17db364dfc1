"""The gateway role: one connection carrying many sessions, in batched ``attach``/``touch``/``detach`` frames.

Theory of operation
-------------------
A gateway (an edge proxy, a push service) terminates its users' connections itself and reports their
activity in batches. It owns every session it attached; a session taken over by a direct login or another
gateway is no longer its own (``touch_owned`` ignores its touches, ``release`` forgets it). Losing the gateway
connection ends every session it still owns (``gateway_lost``), in chunks with checkpoints. A large attach or
detach is applied in chunks of ``ATTACH_CHUNK`` uids with a checkpoint between them, waiting for room (the
log writer's backlog) before each and, for an attach, re-checking the shutdown flag after it: an attach that
straddles the start of a shutdown must not start sessions nothing will end.

Memory: a gateway's frames are read one at a time (up to ``max_gateway_frame``, 1 MiB by default) and
applied before the next is read; its ``pong`` is written inline by its own task, and its ``ended`` notices
are bounded by the sessions it attached (a uid pending at most once per reason: ``idled.server.outbox``).
So a gateway that does not read what it is sent back-pressures itself: once its socket buffers are full its
task blocks in that write and stops reading its frames (its touches go unread, so its sessions go idle and
expire); nothing else is queued for it. The events it causes reach observers through the bus's shared
window, not through per-observer queues, so no burst -- 100k uids in one frame -- can cut an observer that
keeps reading.

A gateway that logs in with ``"ended": true`` is told which of its sessions the server ended and why
(``ended`` frames, batched: ``idled.server.outbox``); its welcome carries the server's default ``timeout``,
``tick`` and ``max_timeout`` so that an edge answers its users' logins exactly as the server would.

A gateway that logs in with ``"marks": true`` (every edge) reports watermarks: the presence table tracks it
as an owner (``idled.core.watermarks``), its outbox sends ``mark`` requests, and each ``marked`` answer
raises its watermark -- waking the tick task when held sessions became due. Its sessions expire ``idle``
only once it has forwarded its users' activity past their deadlines, so an edge that lags or is stopped
never loses a session that kept talking. When the connection ends it is no longer tracked, after its
sessions ended (``gateway_lost``).
"""

from __future__ import annotations

import logging
import time

import trio

from idled.core.detector import DEFAULT_CHUNK
from idled.core.presence import Uid
from idled.protocol import (
    MAX_KEEPALIVE,
    BYE,
    PING,
    PONG_FRAME,
    Attach,
    Detach,
    ErrorCode,
    FrameDecoder,
    Login,
    Marked,
    ProtocolError,
    Touch,
    Welcome,
    encode,
    receive_message,
)
from idled.server.conn import Connection, close_with
from idled.server.outbox import Outbox, mark_interval, outbox_running
from idled.server.sessions import Sessions

__all__ = ["ATTACH_CHUNK", "Gateway", "Gateways"]

log = logging.getLogger("idled.server.gateways")

ATTACH_CHUNK = 2048  # uids of one attach or detach frame applied between two checkpoints


class Gateway(Connection):
    """A gateway connection: owns many sessions; losing it ends them all (``gateway_lost``)."""

    __slots__ = ("name", "uids", "outbox")

    def __init__(self, name: str, outbox: Outbox | None = None) -> None:
        super().__init__()
        self.name = name
        self.outbox = outbox  # None: the gateway opted in to neither ended notices nor marks
        # A dict, not a set: the cyclic GC untracks a dict holding only ints and strs, while it would walk
        # every key of a set on each full collection (1M sessions: ~3M container entries per pass).
        self.uids: dict[Uid, None] = {}

    def release(self, uid: Uid, code: str, reason: str) -> None:
        # One session of many ended (expired or taken over): the gateway connection itself stays.
        self.uids.pop(uid, None)
        if self.outbox is not None:
            self.outbox.add(uid, code)

    def want_mark(self, deadline: float) -> None:
        """A held session of this gateway waits for its watermark to pass ``deadline`` (the tick task asks)."""
        if self.outbox is not None:
            self.outbox.want(deadline)


class Gateways:
    """The gateway role (``run``) over ``sessions``; ``peers`` holds the live gateways for shutdown to close.

    ``max_frame`` (a gateway's larger frame limit) applies to the next gateway to log in: a reload sets it."""

    def __init__(self, sessions: Sessions, peers: set[Connection], *, max_frame: int) -> None:
        self.sessions = sessions
        self.peers = peers
        self.max_frame = max_frame

    async def run(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        presence, clock = self.sessions.presence, self.sessions.clock
        outbox = None
        if login.ended or login.marks:
            outbox = Outbox(self.max_frame, notices=login.ended, marks=login.marks, now=clock.now,
                            interval=mark_interval(presence.tick))
        gateway = Gateway(str(login.name), outbox)
        decoder.max_frame = self.max_frame
        self.peers.add(gateway)
        if login.marks:
            presence.track_owner(gateway, clock.now())
        failure: BaseException | None = None
        try:
            with gateway.scope:
                await stream.send_all(encode(self.welcome(gateway)))
                async with outbox_running(outbox, stream):
                    # Caught inside the outbox's nursery, not outside: out of it a protocol error would come
                    # wrapped in an ExceptionGroup, which the doorway does not answer with an error frame.
                    try:
                        await self.serve(gateway, stream, decoder)
                    except (ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        failure = exc
        finally:
            self.peers.discard(gateway)
            with trio.CancelScope(shield=True):
                await self.lost(gateway)
                presence.untrack_owner(gateway)
        if failure is not None:
            raise failure
        if gateway.end is not None:
            if outbox is not None:
                await outbox.flush_final(stream)
            await close_with(stream, *gateway.end)

    def welcome(self, gateway: Gateway) -> Welcome:
        # The presence table's own rule, evaluated at its extremes, gives the edge its parameters: the
        # default timeout, the floor (a tick) and the cap (max_timeout, as far as any keepalive can reach).
        rule = self.sessions.presence.timeout_for
        return Welcome("gateway", gateway.name, rule(None), self.max_frame, rule(1e-9), rule(MAX_KEEPALIVE))

    async def serve(self, gateway: Gateway, stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        """The gateway's frames until ``bye`` or the end of its stream."""
        sessions = self.sessions
        presence, now = sessions.presence, sessions.clock.now
        outbox = gateway.outbox
        while True:
            message = await receive_message(stream, decoder)
            if message is None or message is BYE:
                return
            if type(message) is Touch:
                t = now()
                for uid in message.uids:
                    presence.touch_owned(uid, gateway, t)
            elif type(message) is Marked and outbox is not None and outbox.marks:
                outbox.answered(message.t)
                if presence.mark(gateway, message.t):
                    sessions.wake_ticker()
            elif type(message) is Attach:
                await self.attach(gateway, message)
            elif type(message) is Detach:
                await self.detach(gateway, message)
            elif message is PING:
                if outbox is None:
                    await stream.send_all(PONG_FRAME)
                else:  # notices pending before this ping go first: a pong orders them
                    await outbox.send(stream, PONG_FRAME)
            else:
                raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for gateways")

    async def attach(self, gateway: Gateway, message: Attach) -> None:
        sessions = self.sessions
        presence, clock = sessions.presence, sessions.clock
        await sessions.room()
        sessions.refuse_if_stopping()
        now, wall = clock.now(), time.time()
        for index, uid in enumerate(message.uids, 1):
            previous, event = presence.login(uid, gateway, now, wall, message.keepalive)
            sessions.take_over(uid, previous, gateway)
            gateway.uids[uid] = None
            sessions.publish(event)
            if index % ATTACH_CHUNK == 0:  # a 1 MiB attach is ~100k uids: don't hold the loop for all of them
                sessions.wake_ticker()
                await trio.sleep(0)
                await sessions.room()
                sessions.refuse_if_stopping()
                now, wall = clock.now(), time.time()
        sessions.wake_ticker()

    async def detach(self, gateway: Gateway, message: Detach) -> None:
        sessions = self.sessions
        presence, clock = sessions.presence, sessions.clock
        await sessions.room()
        now, wall = clock.now(), time.time()
        reason = message.reason or "detach"  # an edge says what its user did (logout, closed)
        for index, uid in enumerate(message.uids, 1):
            sessions.publish(presence.logout(uid, gateway, now, wall, reason))
            gateway.uids.pop(uid, None)
            if index % ATTACH_CHUNK == 0:  # like attach: a 1 MiB detach must not hold the loop for all of it
                await trio.sleep(0)
                await sessions.room()
                now, wall = clock.now(), time.time()

    async def lost(self, gateway: Gateway) -> None:
        """The gateway connection ended: every session it still owns goes offline (``gateway_lost``)."""
        sessions = self.sessions
        ended = 0
        while gateway.uids:
            await sessions.room()
            now, wall = sessions.clock.now(), time.time()
            for _ in range(min(DEFAULT_CHUNK, len(gateway.uids))):
                sessions.publish(sessions.presence.logout(gateway.uids.popitem()[0], gateway, now, wall, "gateway_lost"))
                ended += 1
            await trio.sleep(0)
        if ended:
            log.info("gateway %s lost: %d sessions offline", gateway.name, ended)
