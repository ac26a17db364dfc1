"""The edge's link to the core: one gateway connection carrying every user of this edge.

Theory of operation
-------------------
The user tasks never wait on the link. ``attach``, ``touch`` and ``detach`` are synchronous: they file the
operation and return, whether the core is connected or not, so a core that is slow, restarting or gone never
stops an edge from reading its users and answering their pings.

* *One gateway link.* ``CoreLink`` is the client library's ``GatewayLink`` (``idled.client.gatewaylink``, the
  same code as the application's ``Gateway``): connecting, the login, reconnecting after a backoff, the
  re-attach on every welcome and the dispatch of notices are written once there; this module adds what an
  edge needs on top -- synchronous filing, acknowledged attaches, one writer, liveness, marks answered after
  its loop turns, the drain.
* *Session keys.* Every "uid" below is a session key: a user's uid, or ``(uid, device)`` for a user that
  logged in with a device (``EdgeUsers``); the batcher, the touches and the re-attach treat both alike, and
  the frames carry a key as ``[uid, device]``.
* *Batching.* Attach and detach go into the link's ``GatewayBatcher`` (``idled.client.core``: ordered groups,
  a detach's reason, frames split by the core's frame limit, and the live uids with their keepalive). A touch
  -- the per-packet path -- is one dict store into ``touches``; the flusher folds them into the batcher when
  it flushes (after the attach/detach groups: a touch of a uid detached meanwhile is ignored by the core, one
  attached meanwhile is covered by the attach). All goes in one write, at most ``flush_interval`` (10 ms)
  after the first attach or detach, touches alone ``touch_interval`` (100 ms) after the first (a flush costs
  loop turns here and at the core: docs/peer.md, "Touch ages"), at once at ``flush_size`` touches. Each
  touch carries its age (``idled.server.edge.touches``): the wait moves no deadline. It is no longer than
  the core applies of an age (half its tick); a core that takes no ages gets touches after ``flush_interval``.
* *Attaches are acknowledged.* An attach is flushed followed by a ping; the core handles a gateway's frames
  in order, so its pong says the attach is done. ``attach`` returns the event that pong sets (shared by
  every attach of that flush; released too if the connection ends): the edge sends the user's welcome after
  it, so a welcome means "online in the record", as for a direct login. An attach is flushed at once while
  no acknowledgement is in flight, else when that one's pong arrives or the batch interval is up: under a
  login storm the attaches of a round trip share one frame and one pong (batches grow with the core's lag).
* *Reconnecting* (``Link.run``). When the connection ends (refused, reset, end of stream, any error frame
  of the core -- an edge retries them all, ``auth_failed`` included): the reader or the flusher that saw it
  raises ``ConnectionLost`` (or the core's error), the other is cancelled, nothing is raised out of
  ``run()``, and the link sleeps a full-jitter backoff (``Backoff``: a thousand edges do not return in
  lockstep) and connects again. While disconnected (not ``up``) only the live uids are kept up to date
  (``touches`` are dropped: the re-attach is fresh activity for all of them). On every welcome the batcher's
  ``reattach`` replaces whatever was pending by an attach of every live uid (the core forgot them: they come
  back ``online``); the flusher writes it first.
* *TLS* (``link_tls``): the link and every relayed connection to a TCP core are opened by
  ``idled.door.outbound.dial`` (a ``unix:PATH`` core stays plain). A configuration the two sides cannot
  speak -- a plaintext link answered ``tls_required``, a TLS link to a plaintext core, a certificate that does
  not verify -- is not retried while nothing has worked since the start (``LinkPolicy.strict``) and every
  listed core answered one in a full round (``LinkRound``): ``run()`` ends with them in ``mismatches`` and
  the edge exits with one line naming them all. Otherwise a mismatch is logged once and the next core tried
  (after a first welcome: retried like any other refusal).
* *Several cores* (``--core A,B``): an active core and its standbys, or an elected group. Which one to try
  is the client library's rule (``idled.client.leader``): the core a ``not_leader`` refusal names (its
  ``leader``) first, else the others in turn, at once; the backoff is slept between full rounds only. The
  users stay, and the welcome of whichever core leads re-attaches them there (a switch is logged once);
  relayed gateways and observers go to the current core.
* *Notices.* The link logs in with ``"ended": true``; each ``ended`` frame is handed to ``on_ended(uids,
  reason)``, which decides per uid what to forget (``EdgeUsers.on_ended``: a notice that crossed a fresh
  login re-attaches it instead). The welcome's ``timeout``, ``tick`` and ``max_timeout`` are kept in
  ``params`` (``timeout_for``): the edge answers its users' logins with them.
* *Bounds.* ``touches``: one entry per live uid at most. Attach/detach groups grow with logins while the core
  is not reading; past ``max_pending`` uids the connection is dropped, and one re-attach replaces the backlog.
  A frame from the core is at most the client library's ``CLIENT_MAX_FRAME``.
* *Watermarks* (``idled.core.watermarks``). The link logs in with ``"marks": true``. When the core asks
  ``mark(t)``, the flusher answers ``marked(t)`` after two event-loop turns and a drain of the user plane
  (``drain``) -- by then every user task and the plane have read, and touched, whatever a socket held when
  the request arrived -- and after the touches it collected, in the same write. The core holds a session of
  this edge until an answer passes its deadline: a keepalive that reached this edge in time is never lost to a
  lagging or stopped edge, a full batch or a busy link. Only the latest request waiting is answered.
* *Admission.* Past ``MAX_ATTACHING`` attaches not yet acknowledged (``attaches_in_flight``) the edge refuses
  new logins ``busy`` (``EdgeUsers.begin``): a core that cannot keep up pushes back instead of a backlog.
* *Liveness.* The link pings the core every ``ping_interval`` seconds; no frame at all for ``dead_after``
  seconds of this edge's own running time (``clock``: the stall guard's, so a pause of this edge is not the
  core's silence) means the core, or the path to it, is gone without a reset: the connection is dropped
  (over a unix socket the kernel reports a dead core at once; no silence ends such a link).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import trio

from idled.client.core import Backoff
from idled.client.errors import ClientError, ConnectionLost, TLSRequired
from idled.client.gatewaylink import EndedCallback, GatewayLink
from idled.client.leader import LeaderSearch
from idled.client.link import Conn
from idled.client.trio import TRIO, TrioConn
from idled.core.timeouts import DEFAULT_MAX_TIMEOUT, DEFAULT_TICK, DEFAULT_TIMEOUT, max_touch_age, timeout_for
from idled.door.outbound import LinkFailed, LinkPolicy, LinkRound, broken_link, dial
from idled.protocol import (
    BYE_FRAME, PING_FRAME, Login, Marked, SessionKey, Welcome, encode, tokens,
)
from idled.protocol.address import Endpoint, HostPort, UnixPath, format_address, format_addresses, parse_addresses
from idled.server.edge.touches import fold
from idled.server.runtime.clock import WallClock

__all__ = ["CoreLink", "CoreParams", "LinkMismatch", "open_core_stream", "parse_cores"]

log = logging.getLogger("idled.server.edge.link")

FLUSH_INTERVAL: Final = 0.010  # seconds an attach or detach may wait for company
TOUCH_INTERVAL: Final = 0.100  # seconds touches alone may wait for company (module docstring, *Batching*)
FLUSH_SIZE: Final = 4096  # pending touches that trigger a flush at once
MAX_PENDING: Final = 1_000_000  # pending attach/detach uids before the connection is dropped and re-attached
TOKEN_TTL: Final = 86400.0  # a gateway token minted per connection lives this long
CONNECT_TIMEOUT: Final = 10.0
MAX_ATTACHING: Final = 1000  # unacknowledged attaches before new logins are refused busy (see Admission)


def parse_cores(text: str) -> tuple[Endpoint, ...]:
    """``--core A,B,...``: ``HOST:PORT``, ``[IPV6]:PORT`` or ``unix:PATH`` each (``idled.protocol.address``: no
    default port), duplicates dropped; AddressError (a ValueError) otherwise."""
    return parse_addresses(text, unix=True)


async def open_core_stream(core: Endpoint, policy: LinkPolicy | None = None, *, relay: bool = False) -> trio.abc.Stream:
    """A new byte stream to the core (the link's own, or a relayed peer's: ``relay``): TLS as ``policy`` says
    for a TCP core, a unix socket plain. OSError / TooSlowError if it cannot be reached, ``LinkFailed`` if
    the TLS handshake fails (``idled.door.outbound``)."""
    with trio.fail_after(CONNECT_TIMEOUT):
        if isinstance(core, UnixPath):
            return await trio.open_unix_socket(core.path)
        return await dial(core.host, core.port, policy, relay=relay)


class LinkMismatch(ClientError):
    """The core and this edge cannot speak (``failure``: what happened and what to change). Not retryable
    while nothing has worked since the start (see TLS in the module docstring)."""

    def __init__(self, failure: LinkFailed) -> None:
        super().__init__("link_mismatch", str(failure))
        self.failure = failure


class _TLSConn(TrioConn):
    """The link's TLS connection: a core that refuses our certificate says so at the first read (TLS 1.3)."""

    __slots__ = ()

    async def receive_some(self, max_bytes: int | None = None, /) -> bytes | bytearray:
        try:
            return await self.stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            failure = broken_link(exc)
            if failure is not None:
                raise LinkMismatch(failure) from None
            raise ConnectionLost(f"receive failed: {exc!r}") from None


class CoreParams:
    """What the core's welcome said: default timeout, tick, largest timeout, touch age applied (None: no ages)."""

    __slots__ = ("timeout", "tick", "max_timeout", "max_age")

    def __init__(self, welcome: Welcome) -> None:
        self.timeout = welcome.timeout if welcome.timeout is not None else DEFAULT_TIMEOUT
        self.tick = welcome.tick if welcome.tick is not None else DEFAULT_TICK
        self.max_timeout = welcome.max_timeout if welcome.max_timeout is not None else DEFAULT_MAX_TIMEOUT
        self.max_age = max_touch_age(self.tick) if welcome.ages else None

    def timeout_for(self, keepalive: float | None) -> float:
        """The core's rule (``idled.core.timeouts``), so a user's welcome says what a direct login would."""
        return timeout_for(keepalive, self.timeout, self.tick, self.max_timeout)


class CoreLink(GatewayLink):
    """See the module docstring. ``run()`` until cancelled; ``ready`` is set at the first welcome."""

    def __init__(
        self,
        address: str,
        name: str,
        *,
        secret: bytes | None,
        on_ended: EndedCallback,
        links: LinkPolicy | None = None,
        flush_interval: float = FLUSH_INTERVAL,
        touch_interval: float = TOUCH_INTERVAL,
        backoff: Backoff | None = None,
        ping_interval: float = 5.0,
        dead_after: float = 15.0,
        clock: Callable[[], float] = trio.current_time,
        wall: Callable[[], float] | None = None,
    ) -> None:
        members = parse_cores(address)  # fail early on a malformed address
        # The base takes TCP addresses only; its search is replaced by ours (unix:PATH members too) at once.
        first = members[0] if isinstance(members[0], HostPort) else HostPort("localhost", 1)
        super().__init__(TRIO, format_address(first), None, name, ended=True, marks=True,
                         on_ended=on_ended, max_pending=MAX_PENDING, backoff=backoff or Backoff(base=0.1, cap=5.0),
                         connect_timeout=CONNECT_TIMEOUT)
        self.cores = LeaderSearch(members)
        self.addresses = format_addresses(members)
        self.name = name
        self.secret = secret
        self.links = LinkPolicy(strict=False) if links is None else links  # TLS; whether a mismatch is fatal
        self.mismatches: dict[str, LinkFailed] = {}  # every core's, if that ended run() at start (the edge exits)
        self.round = LinkRound()  # what the cores answered this round; the mismatches logged
        self._attempt = self.address  # the core of the latest attempt (`address` moves on when it fails)
        self.flush_interval = flush_interval
        self.touch_interval = touch_interval
        self._touches_wait = False  # the flusher waits for touches alone (an operation cuts it short)
        self.ping_interval = ping_interval
        self._dead_after = dead_after
        self.clock = clock
        self.wall = WallClock() if wall is None else wall  # a minted token's expiry: the edge's wall clock
        self.touches: dict[SessionKey, float] = {}  # session key -> when its latest activity was read (``touches``)
        self.params: CoreParams | None = None
        self.ready = trio.Event()
        self._first: list[bytes] = []  # the re-attach, for the flusher to write first
        self._wake = trio.Event()
        self._urgent = trio.Event()
        self._token: trio.lowlevel.TrioToken  # _open()'s
        self._scope: trio.CancelScope | None = None  # the connection's flusher's: cancelled to drop a connection
        self._down = trio.Event()  # set when the current connection ended
        self._attached = trio.Event()  # set when the attaches filed since the last flush are done at the core
        self.attaches_in_flight = 0  # attaches filed and not yet acknowledged by the core
        self._filed = 0  # of those, filed since the last flush
        self._acking = 0  # acknowledgement pings in flight (see Attaches)
        # One entry per ping in flight, oldest first: the event its pong sets and the attaches it acknowledges
        # (None, 0: a liveness ping only).
        self._pongs: deque[tuple[trio.Event | None, int]] = deque()
        self._mark: float | None = None  # the latest mark request not answered yet
        self.drain: Callable[[], object] = lambda: None  # read before a mark is answered (the edge's user plane)
        self._heard = 0.0  # self.clock() when the core's last frame arrived
        self._core: str | None = None  # the core of the last welcome (to log a switch)

    @property
    def core(self) -> Endpoint:
        """The core being tried or connected to (one of the listed, or a core a refusal named)."""
        target: Endpoint = self.cores.target
        return target

    @property
    def address(self) -> str:
        """`core` as text, for messages (one of ``addresses``)."""
        return format_address(self.core)

    @property
    def welcomed_by(self) -> str | None:
        """The core of the last welcome (None: none yet); the one logged in to while ``connected``."""
        return self._core

    @property
    def dead_after(self) -> float:
        """Seconds of silence that end the connection (see Liveness): never over a unix socket."""
        return math.inf if isinstance(self.cores.target, UnixPath) else self._dead_after

    # -- what user tasks call: synchronous, never waits ------------------------------------------------------

    def attach(self, uid: SessionKey, keepalive: float | None) -> trio.Event | None:
        """File the attach of session ``uid`` (a uid, or a (uid, device) key); returns the event set once the core has processed it (None: no core now).

        The attach is flushed at once (not after the batch interval: a login waits for it), followed by a
        ping; the core answers frames in order, so its pong proves the attach is done -- the session is
        online in the record before the user reads its ``welcome``, exactly as for a direct login. Attaches
        filed meanwhile share the flush, the ping and the event."""
        if self.up:
            self.batch.attach((uid,), keepalive, 0.0)
            self.attaches_in_flight += 1
            self._filed += 1
            self._pending()
            if not self._acking:
                self._urgent.set()  # else the pong of the acknowledgement in flight flushes it (see Attaches)
            return self._attached
        self.batch.live[uid] = keepalive
        return None

    def touch(self, uid: SessionKey, now: float) -> None:
        """Activity from ``uid``, read at ``now`` (``touches.TOUCH_CLOCK``: the user loop's ``touch(uid, now())``)."""
        if self.up:
            touches = self.touches
            touches[uid] = now
            if len(touches) == 1:
                self._touched(False)
            elif len(touches) == FLUSH_SIZE:  # (once: from the plane's thread each wake-up is a syscall)
                self._touched(True)

    def _touched(self, urgent: bool) -> None:
        """Wake the flusher: from a task at once, from the plane's thread through the loop (trio's is per thread)."""
        if trio.lowlevel.in_trio_run():
            (self._urgent if urgent else self._wake).set()
        else:
            self._token.run_sync_soon(self._touched, urgent)

    def detach(self, uid: SessionKey, reason: str) -> None:
        """``uid``'s connection here ended: ``reason`` is ``logout`` (bye) or ``closed``."""
        if self.up:
            self.batch.detach((uid,), 0.0, reason)
            self._pending()
        else:
            self.batch.forget((uid,))

    def forget(self, uid: SessionKey) -> None:
        """The core ended ``uid`` itself (idle, kicked): it is no longer live here and is not re-attached."""
        self.batch.forget((uid,))
        self.touches.pop(uid, None)

    def _pending(self) -> None:
        self._wake.set()
        if self._touches_wait:
            self._urgent.set()  # (an attach or detach waits no longer than flush_interval: it goes out now)
        if self.batch.pending > MAX_PENDING and self._scope is not None:
            log.warning("core link: %d operations pending, the core is not reading; reconnecting", self.batch.pending)
            self._scope.cancel()

    # -- the connection (the loop itself is Link.run's) -------------------------------------------------------

    async def _open(self) -> Conn:
        self._token = trio.lowlevel.current_trio_token()  # (before any welcome: for _touched, before any touch)
        self._attempt = self.address
        try:
            stream = await open_core_stream(self.core, self.links)
        except (OSError, trio.TooSlowError) as exc:
            raise ConnectionLost(f"connect to {self.address} failed: {exc!r}") from None
        except LinkFailed as exc:
            if exc.mismatch:
                raise LinkMismatch(exc) from None
            raise ConnectionLost(f"connect to {self.address} failed: {exc.reason}") from None
        return _TLSConn(stream) if isinstance(stream, trio.SSLStream) else TrioConn(stream)

    def _login(self) -> Login:
        if self.secret is None:
            return self.login
        token = tokens.mint(self.secret, "gateway", self.name, self.wall() + TOKEN_TTL)  # fresh per connection
        return dataclasses.replace(self.login, token=token)

    def _elsewhere(self, exc: ClientError) -> bool:
        # Each failed login (before a welcome) moves on to the next core of the round, a mismatch too:
        # another core may agree (see TLS in the module docstring). Its outcome counts for the round.
        self.round.failed(self._attempt, _failure(exc))
        return True

    def _retryable(self, exc: ClientError) -> bool:
        # A round is over (or a connection that was up ended). An edge waits for its core for ever, whatever
        # it said -- but for a configuration no listed core can speak, at start: then run() ends, and the edge
        # with it (see TLS in the module docstring).
        every = self.round.over()
        if every and self.links.strict:
            self.mismatches = every
            return False
        return True

    def _on_retry(self, exc: ClientError, was_up: bool, delay: float) -> None:
        failure = _failure(exc)
        if failure is not None and self.round.tell(self._attempt, failure):
            then = f"trying {self.address}" if self.round.outcomes else "retrying"  # in the round, or after it
            log.warning("core link to %s: %s; %s", self._attempt, failure, then)
        if was_up:
            log.warning("core link to %s lost (%s); keeping %d users, reconnecting", self._core, exc, self.live)
        log.debug("core link: %s; next attempt at %s in %.2f s", exc, self.address, delay)

    async def _on_welcome(self, conn: Conn, welcome: Welcome) -> None:
        self.params = CoreParams(welcome)
        self._down = trio.Event()
        self._scope = trio.CancelScope()  # the flusher runs in it; a cancel before it starts counts too
        self.touches = {}
        await super()._on_welcome(conn, welcome)  # up, re-attach taken; _send_first keeps it for the flusher
        if self._core is not None and self._core != self.address:
            log.info("edge: core is now %s (was %s)", self.address, self._core)
        self._core = self.address
        self.round.connected()
        self.links.proven()  # the configurations agree: a later mismatch is the core's change, retried
        log.info("core link to %s up (connection %d%s): re-attaching %d users", self.address, self.connections,
                 ", TLS" if isinstance(conn, _TLSConn) else "", self.live)
        self.ready.set()

    async def _send_first(self, conn: Conn, frames: list[bytes]) -> None:
        self._first = frames  # the flusher is the only writer (and the reader runs while it writes)

    def _on_disconnect(self) -> None:
        super()._on_disconnect()
        self._scope = None
        self.touches = {}
        self._first = []
        self._down.set()
        # Logins waiting for an attach that will never be answered: the re-attach on the next welcome
        # covers them, and their users are served meanwhile.
        for waiting, _ in (*self._pongs, (self._attached, 0)):
            if waiting is not None:
                waiting.set()
        self._pongs.clear()
        self._attached = trio.Event()
        self.attaches_in_flight = self._filed = self._acking = 0
        self._mark = None

    # -- the reader's side: GatewayLink dispatches ------------------------------------------------------------

    async def _on_message(self, message: Any) -> None:
        self._heard = self.clock()
        await super()._on_message(message)

    async def _on_ended(self, uids: tuple[SessionKey, ...], reason: str) -> None:
        await self._notify(uids, reason)  # the edge's users decide what to forget (see Notices)

    async def _on_mark(self, t: float) -> None:
        self._mark = t
        self._wake.set()
        self._urgent.set()

    def _on_pong(self) -> None:
        if self._pongs:
            attached, count = self._pongs.popleft()
            if attached is not None:
                self.attaches_in_flight -= count
                self._acking -= 1
                attached.set()
                if self.batch.attaching:
                    self._wake.set()
                    self._urgent.set()  # the attaches that waited for this pong

    # -- the writer ------------------------------------------------------------------------------------------

    async def _background(self, conn: Conn) -> None:
        assert self._scope is not None
        with self._scope:
            await self._flusher(conn)
        raise ConnectionLost("too many operations pending: the core is not reading")  # the scope was cancelled

    async def _flusher(self, conn: Conn) -> None:
        """The only writer of the connection: the re-attach, then batches, pings, and the final bye."""
        first, self._first = self._first, []
        max_age = self.params.max_age if self.params else None  # (this connection's welcome came first)
        await self._write(conn, first)
        next_ping = trio.current_time() + self.ping_interval
        self._heard = self.clock()
        while True:
            with trio.move_on_after(max(0.0, next_ping - trio.current_time())):
                await self._wake.wait()
            if self._wake.is_set():
                self._touches_wait = not self.batch.pending and self._mark is None
                wait = self.flush_interval  # touches alone: no longer than the core applies of an age
                if self._touches_wait and max_age is not None:
                    wait = min(self.touch_interval, max_age)
                with trio.move_on_after(wait):
                    await self._urgent.wait()
                self._touches_wait = False
                self._wake, self._urgent = trio.Event(), trio.Event()
            silent = self.clock() - self._heard
            if silent > self.dead_after:
                raise ConnectionLost(f"no frame from the core for {silent:.1f} s")
            marked = self._mark
            if marked is not None:
                self._mark = None
                # Two loop turns: every user task woken by data that arrived before the request has read it
                # and touched (see the module docstring); the touches go out ahead of the answer.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
                self.drain()
            attaching = self.batch.attaching
            frames = self._take(max_age)
            if marked is not None:
                frames.append(encode(Marked(marked)))
            if attaching or trio.current_time() >= next_ping:  # the pong proves the core is alive (see _on_pong)
                frames.append(PING_FRAME)
                next_ping = trio.current_time() + self.ping_interval
                if attaching:
                    self._pongs.append((self._attached, self._filed))
                    self._attached, self._filed = trio.Event(), 0
                    self._acking += 1
                else:
                    self._pongs.append((None, 0))
            closing = self._closing
            if closing:
                frames.append(BYE_FRAME)
            await self._write(conn, frames)
            if closing:
                await trio.sleep_forever()  # the core closes the connection after the bye

    def _take(self, max_age: float | None) -> list[bytes]:
        if self.touches:
            fold(self.touches, self.batch, max_age)
            self.touches = {}
        return self.batch.take(self.max_frame)

    async def close(self, timeout: float = 2.0) -> None:
        """Drain: send what is pending (the users' detaches), then ``bye``, and stop reconnecting; bounded in
        time. Returns as soon as the connection is gone -- the core read the bye and closed it, or the link
        failed meanwhile (the core is gone: nothing more can be sent). The caller cancels ``run()`` afterwards."""
        self._closing = True
        if not self.up:
            return
        self._wake.set()
        self._urgent.set()
        with trio.move_on_after(timeout):
            await self._down.wait()

    async def aclose(self, linger: float = 2.0) -> None:
        """``close()``: the bye goes out in the flusher's write, never beside it."""
        await self.close(linger)


def _failure(exc: ClientError) -> LinkFailed | None:
    """The mismatch behind a failed link attempt (see TLS in the module docstring), None for anything else."""
    if isinstance(exc, LinkMismatch):
        return exc.failure
    if isinstance(exc, TLSRequired):
        return LinkFailed.tls_required()
    return None
