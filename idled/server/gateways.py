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

*Session keys.* Every element of ``attach``, ``touch`` and ``detach`` is a session key: a uid, or ``[uid,
device]`` (decoded as the tuple the presence table keys by). The presence table's per-user rules apply as
for direct users: a key that joins or leaves while another key of its user lives emits no event; an attach
past ``max_devices`` ends the user's oldest key (its owner -- this gateway or another -- is told ``kicked``);
a ``detach`` with reason ``closed`` of a user's last key waits out ``offline_grace``. ``ended`` notices name
keys as they were attached.

A gateway that logs in with ``"ended": true`` is told which of its sessions the server ended and why
(``ended`` frames, batched: ``idled.server.outbox``); its welcome carries the server's default ``timeout``,
``tick`` and ``max_timeout`` so that an edge answers its users' logins exactly as the server would.

*Degraded* (the server's disk is full: ``idled.server.degraded``): an attach that would bring its user online
(an ``online`` event the log cannot take) is refused, key by key: a gateway that gets ``ended`` notices is
told ``ended`` with reason ``unavailable`` for it (an edge closes that user with ``unavailable``); one that
does not can only be told by an error frame, which ends its connection (``unavailable``). An attach of a user
online already changes nothing durable and goes on, the rule a direct login follows
(``idled.server.sessions``, *A login that adds nothing*): attaching again what the gateway owns (a new
keepalive, a resumed edge's users), a user who moved to it from a direct connection or another gateway
(newest wins: the old owner is told ``kicked``), another device of a user online, a user back within its
offline grace. So do touches and detaches.
Attaches and detaches do not wait for the log's room meanwhile (``_room``): the gateway's task must go on
reading its touches (a keepalive left unread is a false offline in waiting), and what they can add to memory
is bounded already (no new session; a logout that cannot be held is left to its deadline: ``Sessions.logout``).

A gateway that logs in with ``"marks": true`` (every edge) reports watermarks: the presence table tracks it
as an owner (``idled.core.watermarks``), its outbox sends ``mark`` requests, and each ``marked`` answer
raises its watermark -- waking the tick task when held sessions became due. Its sessions expire ``idle``
only once it has forwarded its users' activity past their deadlines, so an edge that lags or is stopped
never loses a session that kept talking.

*Resuming.* Such a gateway is also known by its name, and outlives its connection: the owner of its sessions
is the ``Gateway``, a connection is a ``GatewayLink``. A connection that ends without ``bye`` -- the edge gave
up on a core that was stopped longer than its liveness check allows, a reset on the network -- leaves the
gateway in a grace period (``gateway_grace``): its sessions stay online, held (its watermark stands still).
A login of the same name within it resumes the gateway: no event for any session; the edge attaches again
every user it still has (the same owner: a new deadline, no event), and its first answer to a mark, which
follows those attaches, *confirms* them: the sessions it did not attach again are users who left meanwhile
(``gateway_lost``). A login of a name whose connection is still open (the core had not noticed the old one
die) takes the gateway over and closes the old connection (``kicked``). Past the grace period, or after
``bye``, the gateway is lost: every session it owns goes offline (``gateway_lost``) and it is no longer
tracked -- unless shutdown has begun: then shutdown ends them all (``shutdown``), whatever happens to the
gateway's connection meanwhile. Gateways that do not report watermarks are not resumed (their names need not
be unique): losing the connection loses them at once, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from idled.core.detector import DEFAULT_CHUNK
from idled.core.presence import SessionKey
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

__all__ = ["ATTACH_CHUNK", "Gateway", "GatewayLink", "Gateways"]

log = logging.getLogger("idled.server.gateways")

ATTACH_CHUNK = 2048  # uids of one attach or detach frame applied between two checkpoints


class Gateway:
    """A gateway as the owner of its sessions; ``link`` is its connection now (None while it has none).

    A gateway that reports watermarks outlives its connection (see the module docstring): a connection of
    the same name resumes it within the grace period, with every session it owned."""

    __slots__ = ("name", "uids", "link", "unconfirmed", "resumed")

    def __init__(self, name: str) -> None:
        self.name = name
        # A dict, not a set: the cyclic GC untracks a dict holding only ints and strs, while it would walk
        # every key of a set on each full collection (1M sessions: ~3M container entries per pass).
        self.uids: dict[SessionKey, None] = {}  # the session keys it owns (a uid, or (uid, device))
        self.link: GatewayLink | None = None
        self.unconfirmed: dict[SessionKey, None] | None = None  # after a resume: sessions not attached again yet
        self.resumed = trio.Event()  # set when a new connection resumes it (ends its grace period)

    def release(self, uid: SessionKey, code: str, reason: str) -> None:
        # One session of many ended (expired or taken over): the gateway itself stays.
        self.uids.pop(uid, None)
        if self.unconfirmed is not None:
            self.unconfirmed.pop(uid, None)
        link = self.link
        if link is not None and link.outbox is not None:
            link.outbox.add(uid, code)

    def want_mark(self, deadline: float) -> None:
        """A held session of this gateway waits for its watermark to pass ``deadline`` (the tick task asks)."""
        link = self.link
        if link is not None and link.outbox is not None:
            link.outbox.want(deadline)


class GatewayLink(Connection):
    """One connection of a gateway (what shutdown closes, what the supervisor counts)."""

    __slots__ = ("gateway", "outbox")

    def __init__(self, gateway: Gateway, outbox: Outbox | None) -> None:
        super().__init__()
        self.gateway = gateway
        self.outbox = outbox  # None: the gateway opted in to neither ended notices nor marks

    @property
    def name(self) -> str:
        return self.gateway.name

    @property
    def uids(self) -> dict[SessionKey, None]:
        return self.gateway.uids


class Gateways:
    """The gateway role (``run``) over ``sessions``; ``peers`` holds the live connections for shutdown to close.

    ``max_frame`` (a gateway's larger frame limit) applies to the next gateway to log in: a reload sets it.
    ``grace``: seconds a gateway that reports watermarks is kept after losing its connection (0: none).
    ``spawn`` (the server's ``nursery.start_soon``) runs the grace periods; without it there are none."""

    def __init__(self, sessions: Sessions, peers: set[Connection], *, max_frame: int, grace: float = 0.0) -> None:
        self.sessions = sessions
        self.peers = peers
        self.max_frame = max_frame
        self.grace = grace
        self.spawn: Callable[..., object] | None = None
        self.resumable: dict[str, Gateway] = {}  # by name: gateways that report watermarks, linked or in grace

    async def run(self, stream: trio.abc.Stream, decoder: FrameDecoder, login: Login) -> None:
        presence, clock = self.sessions.presence, self.sessions.clock
        outbox = None
        if login.ended or login.marks:
            outbox = Outbox(self.max_frame, notices=login.ended, marks=login.marks, now=clock.now,
                            interval=mark_interval(presence.tick))
        gateway = self._claim(str(login.name)) if login.marks else Gateway(str(login.name))
        link = gateway.link = GatewayLink(gateway, outbox)
        decoder.max_frame = self.max_frame
        self.peers.add(link)
        if login.marks:
            presence.track_owner(gateway, clock.now())  # a resumed gateway keeps its watermark
        failure: BaseException | None = None
        said_bye = False
        try:
            with link.scope:
                await stream.send_all(encode(self.welcome(gateway)))
                async with outbox_running(outbox, stream):
                    # Caught inside the outbox's nursery, not outside: out of it a protocol error would come
                    # wrapped in an ExceptionGroup, which the doorway does not answer with an error frame.
                    try:
                        said_bye = await self.serve(link, stream, decoder)
                    except (ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        failure = exc
        finally:
            self.peers.discard(link)
            if gateway.link is link:  # (not replaced by a newer connection of the same gateway)
                gateway.link = None
                with trio.CancelScope(shield=True):
                    await self._unlinked(gateway, resumable=login.marks and not said_bye)
        if failure is not None:
            raise failure
        if link.end is not None:
            if outbox is not None:
                await outbox.flush_final(stream)
            await close_with(stream, *link.end)

    def _claim(self, name: str) -> Gateway:
        """The gateway of this name that reports watermarks: a new one, or one resumed -- from its grace period,
        or from a connection still open (the newest connection wins; the old one is closed ``kicked``)."""
        gateway = self.resumable.get(name)
        if gateway is None:
            gateway = self.resumable[name] = Gateway(name)
            return gateway
        if gateway.link is not None:
            gateway.link.close(ErrorCode.KICKED, "replaced by a newer connection of this gateway")
        gateway.unconfirmed = dict(gateway.uids)
        gateway.resumed.set()
        gateway.resumed = trio.Event()
        log.info("gateway %s resumed by a new connection: %d sessions kept", name, len(gateway.uids))
        return gateway

    async def _unlinked(self, gateway: Gateway, *, resumable: bool) -> None:
        """The gateway's connection ended: its sessions end now, or after the grace period unless resumed."""
        if self.sessions.stopping:
            # Shutdown's end_all ends them (``shutdown``), held ones too: still tracked, they are not expired
            # meanwhile. An edge's attach refused during the shutdown drops its link; its sessions' offlines
            # must not turn into ``gateway_lost`` for that.
            return
        if not (resumable and self.grace > 0 and self.spawn is not None):
            await self.lost(gateway)
            return
        log.info("gateway %s lost its connection: its %d sessions are kept %g s for it to come back",
                 gateway.name, len(gateway.uids), self.grace)
        self.spawn(self._grace_period, gateway, gateway.resumed)

    async def _grace_period(self, gateway: Gateway, resumed: trio.Event) -> None:
        with trio.move_on_after(self.grace):
            await resumed.wait()
        if not resumed.is_set():
            await self.lost(gateway)

    def welcome(self, gateway: Gateway) -> Welcome:
        # The presence table's own rule, evaluated at its extremes, gives the edge its parameters: the
        # default timeout, the floor (a tick) and the cap (max_timeout, as far as any keepalive can reach).
        rule = self.sessions.presence.timeout_for
        return Welcome("gateway", gateway.name, rule(None), self.max_frame, rule(1e-9), rule(MAX_KEEPALIVE))

    async def serve(self, link: GatewayLink, stream: trio.abc.Stream, decoder: FrameDecoder) -> bool:
        """The gateway's frames until ``bye`` (True) or the end of its stream (False)."""
        sessions = self.sessions
        presence, now = sessions.presence, sessions.clock.now
        gateway, outbox = link.gateway, link.outbox
        while True:
            message = await receive_message(stream, decoder)
            if message is None or message is BYE:
                return message is BYE
            if type(message) is Touch:
                t = now()
                for uid in message.uids:
                    presence.touch_owned(uid, gateway, t)
            elif type(message) is Marked and outbox is not None and outbox.marks:
                outbox.answered(message.t)
                if gateway.unconfirmed is not None:
                    await self.confirm(gateway)
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
        await sessions.room_unless_degraded()
        sessions.refuse_if_stopping()
        now, wall = clock.now(), clock.wall()
        refusing = bool(sessions.degraded.reasons)
        for index, uid in enumerate(message.uids, 1):
            if refusing and sessions.brings_online(uid):
                self._refuse(gateway, uid)
                continue
            replaced, event = presence.login(uid, gateway, now, wall, message.keepalive)
            sessions.take_over(uid, replaced, gateway)
            gateway.uids[uid] = None
            if gateway.unconfirmed is not None:
                gateway.unconfirmed.pop(uid, None)
            sessions.publish(event)
            if index % ATTACH_CHUNK == 0:  # a 1 MiB attach is ~100k uids: don't hold the loop for all of them
                sessions.wake_ticker()
                await trio.lowlevel.checkpoint()
                await sessions.room_unless_degraded()
                sessions.refuse_if_stopping()
                now, wall = clock.now(), clock.wall()
                refusing = bool(sessions.degraded.reasons)
        sessions.wake_ticker()

    def _refuse(self, gateway: Gateway, uid: SessionKey) -> None:
        """A degraded server does not start ``uid``'s session (see the module docstring)."""
        link = gateway.link
        if link is None or link.outbox is None or not link.outbox.notices:
            self.sessions.degraded.refuse()  # the error frame: the only way to tell this gateway
            return
        link.outbox.add(uid, ErrorCode.UNAVAILABLE)

    async def detach(self, gateway: Gateway, message: Detach) -> None:
        sessions = self.sessions
        clock = sessions.clock
        await sessions.room_unless_degraded()
        now, wall = clock.now(), clock.wall()
        reason = message.reason or "detach"  # an edge says what its user did (logout, closed)
        for index, uid in enumerate(message.uids, 1):
            sessions.logout(uid, gateway, now, wall, reason)
            gateway.uids.pop(uid, None)
            if index % ATTACH_CHUNK == 0:  # like attach: a 1 MiB detach must not hold the loop for all of it
                await trio.lowlevel.checkpoint()
                await sessions.room_unless_degraded()
                now, wall = clock.now(), clock.wall()

    async def lost(self, gateway: Gateway) -> None:
        """The gateway is gone: every session it still owns goes offline (``gateway_lost``)."""
        if self.resumable.get(gateway.name) is gateway:
            del self.resumable[gateway.name]  # first: a login of its name from now on starts a new gateway
        ended = await self._end(gateway, gateway.uids)
        if not self.sessions.stopping:  # (else shutdown ends the rest, and the watermark must keep holding them)
            self.sessions.presence.untrack_owner(gateway)
        if ended:
            log.info("gateway %s lost: %d sessions offline", gateway.name, ended)

    async def confirm(self, gateway: Gateway) -> None:
        """A resumed gateway has attached again every user it still has (its first answer to a mark follows
        them): the sessions it did not are users who left while it was away (``gateway_lost``)."""
        unconfirmed, gateway.unconfirmed = gateway.unconfirmed or {}, None
        ended = await self._end(gateway, unconfirmed)
        log.info("gateway %s confirmed its sessions after resuming: %d not attached again went offline",
                 gateway.name, ended)

    async def _end(self, gateway: Gateway, uids: dict[SessionKey, None]) -> int:
        """End these sessions of ``gateway`` (``gateway_lost``), in chunks; returns how many. Stops once shutdown
        began: from then on, every session that ends at the server's hand ends ``shutdown`` (``end_all``)."""
        sessions = self.sessions
        ended = 0
        while uids:
            await sessions.room()
            if sessions.stopping:
                break
            now, wall = sessions.clock.now(), sessions.clock.wall()
            for _ in range(min(DEFAULT_CHUNK, len(uids))):
                uid = uids.popitem()[0]
                gateway.uids.pop(uid, None)
                event = sessions.presence.logout(uid, gateway, now, wall, "gateway_lost")
                sessions.publish(event)
                ended += event is not None
            await trio.lowlevel.checkpoint()
        return ended
