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
are bounded by the sessions it attached (a uid pending at most once per reason: ``Outbox``, below).
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
(``ended`` frames, batched: ``Outbox``, below); its welcome carries the server's default ``timeout``,
``tick`` and ``max_timeout`` so that an edge answers its users' logins exactly as the server would.

*Degraded* (the server's disk is full: ``idled.server.engine.degraded``): an attach that would bring its user online
(an ``online`` event the log cannot take) is refused, key by key: a gateway that gets ``ended`` notices is
told ``ended`` with reason ``unavailable`` for it (an edge closes that user with ``unavailable``); one that
does not can only be told by an error frame, which ends its connection (``unavailable``). An attach of a user
online already changes nothing durable and goes on, the rule a direct login follows
(``idled.server.engine.sessions``, *A login that adds nothing*): attaching again what the gateway owns (a new
keepalive, a resumed edge's users), a user who moved to it from a direct connection or another gateway
(newest wins: the old owner is told ``kicked``), another device of a user online, a user back within its
offline grace. So do touches and detaches.
Attaches and detaches do not wait for the log's room meanwhile (``_room``): the gateway's task must go on
reading its touches (a keepalive left unread is a false offline in waiting), and what they can add to memory
is bounded already (no new session; a logout that cannot be held is left to its deadline: ``Sessions.logout``).

*Touch ages.* A batching gateway holds its touches a while before they travel (an edge: up to 100 ms); a
``touch`` carrying ``ago`` (which the welcome's ``ages`` invites) is stamped that much before it arrived, so a
deadline is its user's last keepalive plus the timeout, not plus the batch's wait too. At most half a tick of
it is applied: a stamp later than the activity is never an early offline, and so capped a deadline never lands
on a tick already judged (``ago`` < a tick <= any timeout); a touch stamped before what the session already
has changes nothing (``touch_owned``).

A gateway that logs in with ``"marks": true`` (every edge) reports watermarks: the presence table tracks it
as an owner (``idled.core.watermarks``), its outbox sends ``mark`` requests, and each ``marked`` answer
raises its watermark -- waking the tick task when held sessions became due. Its sessions expire ``idle``
only once it has forwarded its users' activity past their deadlines, so an edge that lags or is stopped
never loses a session that kept talking.

*Resuming.* Such a gateway is also known by its name, and outlives its connection: the owner of its sessions
is the ``Gateway``, a connection is a ``GatewayConnection``. A connection that ends without ``bye`` -- the edge gave
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

The outbox
----------
A gateway that logged in with ``"ended": true`` and/or ``"marks": true`` gets an ``Outbox``; its second task
(``run(stream)``, beside the one reading its frames) is the only one that writes on its own initiative.

*Ended notices.* Whenever the server ends one of the gateway's sessions -- the tick task (``idle_timeout``),
a newer login elsewhere (``kicked``), shutdown (``server_shutdown``) -- ``Gateway.release`` calls
``add(uid, code)``, which only files the uid under its reason (``idle``, ``kicked``, ``shutdown``): no I/O on
the caller's path, which may be the tick task expiring thousands of sessions in one slice. The task sends
them ``FLUSH_INTERVAL`` after the first, so that a tick's expiries travel together, as ``ended`` frames no
larger than the gateway's frame limit, in one write.

*Mark requests* (``idled.core.watermarks``). The task sends ``mark(t)``, ``t`` the server clock at that moment,
every ``mark_interval`` while the gateway owns sessions (``owned``: one that owns none is not asked, so an idle
edge sleeps; its first attach wakes the task, ``owns_again``) and at once when the tick task holds a session of
this gateway (``want``): the answer, ``marked(t)`` (``answered``), raises the gateway's watermark. At most ``MAX_OUTSTANDING`` requests are
unanswered at a time (a stopped gateway is not flooded); a periodic one is sent only when none is, or when
the newest is a period old; a wanted one whenever no request already sent covers the deadline waited on.
An answer must echo a request actually sent (a gateway cannot claim a watermark it was never asked for).

Writes to the gateway's stream from both tasks (this one, and the gateway task's pongs) go through one lock
(``send``): a trio stream forbids concurrent ``send_all``. Before the gateway task answers a ``ping`` it
flushes the pending notices, so a notice generated before the ping was processed always arrives before its
pong.

Bounds: a uid is pending at most once per reason, and only for a session the gateway owned and lost, so the
pending notices never exceed the sessions the gateway attached; requests in flight are at most
``MAX_OUTSTANDING``. When the connection is closed by the server (``flush_final``) whatever notice is still
pending goes out before the closing ``error`` frame, bounded in time.
"""


from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final, cast

import trio

from idled.core.detector import DEFAULT_CHUNK
from idled.core.presence import SessionKey as Key
from idled.core.timeouts import max_touch_age
from idled.protocol import (
    MAX_DEVICE_BYTES,
    MAX_KEEPALIVE,
    MAX_UID_BYTES,
    BYE,
    PING,
    PONG_FRAME,
    Attach,
    Detach,
    Ended,
    ErrorCode,
    FrameDecoder,
    Login,
    Mark,
    Marked,
    ProtocolError,
    SessionKey,
    Touch,
    Welcome,
    encode,
    receive_message,
)
from idled.server.engine.sessions import Sessions
from idled.server.roles.doorway import Connection, close_with

__all__ = [
    "ATTACH_CHUNK", "FLUSH_INTERVAL", "MAX_OUTSTANDING", "Gateway", "GatewayConnection", "Gateways", "Outbox", "mark_interval",
    "outbox_running",
]

log = logging.getLogger("idled.server.roles.gateways")

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
        self.uids: dict[Key, None] = {}  # the session keys it owns (a uid, or (uid, device))
        self.link: GatewayConnection | None = None
        self.unconfirmed: dict[Key, None] | None = None  # after a resume: sessions not attached again yet
        self.resumed = trio.Event()  # set when a new connection resumes it (ends its grace period)

    def release(self, uid: Key, code: str, reason: str) -> None:
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


class GatewayConnection(Connection):
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
    def uids(self) -> dict[Key, None]:
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
        gateway = self._claim(str(login.name)) if login.marks else Gateway(str(login.name))
        outbox = None
        if login.ended or login.marks:
            outbox = Outbox(self.max_frame, notices=login.ended, marks=login.marks, now=clock.now,
                            interval=mark_interval(presence.tick), owned=gateway.uids)
        link = gateway.link = GatewayConnection(gateway, outbox)
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
        return Welcome("gateway", gateway.name, rule(None), self.max_frame, rule(1e-9), rule(MAX_KEEPALIVE),
                       ages=True)

    async def serve(self, link: GatewayConnection, stream: trio.abc.Stream, decoder: FrameDecoder) -> bool:
        """The gateway's frames until ``bye`` (True) or the end of its stream (False)."""
        sessions = self.sessions
        presence, now = sessions.presence, sessions.clock.now
        gateway, outbox = link.gateway, link.outbox
        max_ago = max_touch_age(presence.tick)
        while True:
            message = await receive_message(stream, decoder)
            if message is None or message is BYE:
                return message is BYE
            if type(message) is Touch:
                t = now() - min(message.ago, max_ago)
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
        owned_none = not gateway.uids
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
        if owned_none and gateway.uids and gateway.link is not None and gateway.link.outbox is not None:
            gateway.link.outbox.owns_again()

    def _refuse(self, gateway: Gateway, uid: Key) -> None:
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

    async def _end(self, gateway: Gateway, uids: dict[Key, None]) -> int:
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


# -- the outbox: what the server sends a gateway on its own initiative ----------------------------------------

FLUSH_INTERVAL: Final = 0.010  # seconds a notice waits for company (the expiries of one tick travel together)
FINAL_FLUSH_TIMEOUT: Final = 1.0  # a gateway that does not read can't hold a closing connection longer
MAX_OUTSTANDING: Final = 16  # mark requests in flight at most (a stopped gateway gets no more)
_FRAME_OVERHEAD: Final = 64  # op, keys, reason, array header: generous, so a frame never exceeds the limit

# The error code a session's owner is released with -> the reason an `ended` notice carries.
REASONS: Final[dict[str, str]] = {
    ErrorCode.IDLE_TIMEOUT: "idle",
    ErrorCode.KICKED: "kicked",
    ErrorCode.SERVER_SHUTDOWN: "shutdown",
    ErrorCode.UNAVAILABLE: "unavailable",  # an attach refused (``idled.server.roles.gateways``)
}


def mark_interval(tick: float) -> float:
    """Seconds between periodic mark requests: a quarter tick, within [20 ms, 250 ms]. A held session waits
    for a request of its own (one round trip), so the period only bounds how stale an idle watermark is."""
    return min(0.25, max(0.02, tick / 4))


def _uid_size(uid: object) -> int:
    """Upper bound of a uid's msgpack size."""
    return 9 if type(uid) is int else len(str(uid).encode()) + 3


def _key_size(key: object) -> int:
    """Upper bound of a session key's msgpack size: a uid, or the 2-array [uid, device]."""
    if type(key) is tuple:
        return 1 + _uid_size(key[0]) + len(key[1].encode()) + 2
    return _uid_size(key)


_MAX_KEY_SIZE: Final = 1 + MAX_UID_BYTES + 3 + MAX_DEVICE_BYTES + 2


class Outbox:
    """One gateway's pending notices and mark requests (see the module docstring). ``notices`` / ``marks``:
    what it opted in to; ``now`` is the server clock marks are read from."""

    __slots__ = ("max_frame", "notices", "marks", "pending", "lock", "sent_frames", "owned", "_wake", "_now",
                 "_interval", "_sent", "_sent_at", "_wanted")

    def __init__(self, max_frame: int, *, notices: bool = True, marks: bool = False,
                 now: Callable[[], float] = trio.current_time, interval: float = 0.25,
                 owned: dict[Key, None] | None = None) -> None:
        if max_frame < _MAX_KEY_SIZE + _FRAME_OVERHEAD:
            raise ValueError(f"max_frame {max_frame} is too small for an ended frame")
        self.max_frame = max_frame
        self.notices = notices
        self.marks = marks
        self.pending: dict[str, dict[SessionKey, None]] = {}  # reason -> keys, in the order they ended
        self.lock = trio.Lock()
        self.sent_frames = 0
        # The gateway's sessions (``Gateway.uids``): periodic marks only while it has some -- a watermark
        # nobody is held by need not be fresh, and an idle edge then sleeps (issue 36).
        self.owned: dict[Key, None] = {} if owned is None else owned
        self._wake = trio.Event()
        self._now = now
        self._interval = interval
        self._sent: deque[float] = deque()  # mark requests in flight, oldest first
        self._sent_at = -math.inf  # trio time of the newest request sent
        self._wanted = -math.inf  # a request is wanted whose t is at least this

    # -- ended notices ---------------------------------------------------------------------------------------

    def add(self, key: Key, code: str) -> None:
        if self.notices:
            # A gateway attaches wire keys (a uid, or (uid, device)); the core's key type is wider only because
            # the core is generic. The notice names the key as the gateway attached it.
            self.pending.setdefault(REASONS.get(code, str(code)), {})[cast(SessionKey, key)] = None
            self._wake.set()

    def take(self) -> list[bytes]:
        """Every pending notice as frames of at most ``max_frame`` body bytes; clears them."""
        budget = self.max_frame - _FRAME_OVERHEAD
        frames: list[bytes] = []
        for reason, uids in self.pending.items():
            chunk: list[SessionKey] = []
            size = 0
            for uid in uids:
                n = _key_size(uid)
                if size + n > budget:
                    frames.append(encode(Ended(tuple(chunk), reason)))
                    chunk, size = [], 0
                chunk.append(uid)
                size += n
            if chunk:
                frames.append(encode(Ended(tuple(chunk), reason)))
        self.pending = {}
        return frames

    # -- marks -----------------------------------------------------------------------------------------------

    def want(self, deadline: float) -> None:
        """A held session waits for this gateway's watermark to pass ``deadline``: ask unless a request in
        flight already covers it."""
        if self.marks and not (self._sent and self._sent[-1] >= deadline) and deadline > self._wanted:
            self._wanted = deadline
            self._wake.set()

    def answered(self, t: float) -> None:
        """The gateway answered ``marked(t)``: forget every request up to it. ProtocolError if it was never
        asked (an answer must echo a request, in order)."""
        sent = self._sent
        full = len(sent) >= MAX_OUTSTANDING
        while sent and sent[0] < t:
            sent.popleft()
        if not sent or sent[0] != t:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "marked: no such mark was requested")
        sent.popleft()
        if full:
            self._wake.set()  # room for a request again

    def owns_again(self) -> None:
        """The gateway owned no session and attached some: periodic marks, stopped meanwhile, resume."""
        self._wake.set()

    def _periodic(self) -> bool:
        return self.marks and len(self._sent) < MAX_OUTSTANDING and bool(self.owned)

    def _mark_due(self) -> bool:
        if not self.marks or len(self._sent) >= MAX_OUTSTANDING:
            return False
        if self._wanted > -math.inf:
            return True
        return self._periodic() and (not self._sent or trio.current_time() >= self._sent_at + self._interval)

    def _mark_frame(self) -> bytes:
        t = self._now()
        self._sent.append(t)
        self._sent_at = trio.current_time()
        self._wanted = -math.inf
        return encode(Mark(t))

    # -- writing ---------------------------------------------------------------------------------------------

    async def send(self, stream: trio.abc.SendStream, data: bytes) -> None:
        """Write ``data`` after every pending notice (the lock orders it with the task's own writes)."""
        async with self.lock:
            frames = self.take()
            if frames:
                self.sent_frames += len(frames)
                data = b"".join(frames) + data
            await stream.send_all(data)

    async def run(self, stream: trio.abc.SendStream) -> None:
        """Send notices within FLUSH_INTERVAL of the first, and mark requests when due; until cancelled."""
        while True:
            periodic = self._periodic()
            with trio.move_on_at(self._sent_at + self._interval if periodic else math.inf):
                await self._wake.wait()
            self._wake = trio.Event()
            if self.pending and self._wanted == -math.inf:
                await trio.sleep(FLUSH_INTERVAL)  # company for the notices (a wanted mark does not wait)
            if self.pending or self._mark_due():
                async with self.lock:
                    frames = self.take()
                    self.sent_frames += len(frames)
                    if self._mark_due():
                        frames.append(self._mark_frame())
                    await stream.send_all(b"".join(frames))

    async def flush_final(self, stream: trio.abc.SendStream) -> None:
        """Send what is still pending before the server closes the gateway (bounded, even while cancelled)."""
        if not self.pending:
            return
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + FINAL_FLUSH_TIMEOUT
            try:
                await self.send(stream, b"")
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                pass


@asynccontextmanager
async def outbox_running(outbox: Outbox | None, stream: trio.abc.SendStream) -> AsyncIterator[None]:
    """Run ``outbox``'s task (if the gateway opted in to anything) while the block runs."""
    if outbox is None:
        yield
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run, stream)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()
