"""The connection loop shared by every client role, written once for both trio and asyncio.

Theory of operation
-------------------
A `Link` owns one logical connection to idled: `run()` connects, logs in, lets the role (user session,
gateway, observer) restore its state on the new connection (`_on_welcome`), then runs two things at once
until either ends: the reader (`receive_message`, the protocol's one receive loop, feeding `_on_message`)
and the role's timer (`_background`: keepalive pings, batch flushes). When the connection fails with a
retryable `ClientError` (connection lost, `busy`, `unavailable`, `server_shutdown`...) and reconnecting is enabled, `run()`
sleeps a full-jitter backoff and starts over; a final error (`auth_failed`, `kicked`, ...) or `aclose()` ends
it, and the error is kept in `error` and raised to whoever waits on the link. The backoff counts the attempts
since the last connection set up (`_settle`: the welcome, or an observer's subscription taken): a link that was
up starts again from the shortest delay, one whose setup is refused is a failed attempt.

*Several cores.* `host` may name several (``"a:7878,b:7878"`` or a list; a member without a port takes
`port`). `cores` (`idled.client.leader.LeaderSearch`) picks each attempt's address: a failed login that
another core could take (anything retryable, ``not_leader`` included) moves on to the core a ``not_leader``
named, else to the next one, *at once*; the backoff is slept only between full rounds. Even without
`reconnect` the first login tries the whole round. With one address this is the loop described above.

Beyond the client roles, the edge's link to its core is a `Link` too (through `idled.client.gatewaylink`):
it opens its own streams (`_open`: TCP or a unix socket), logs in with a fresh token each time (`_login`),
retries whatever the core said (`_retryable`) and logs each retry (`_on_retry`).

The I/O primitives come from a `Runtime` (`idled.client.trio.TRIO`, `idled.client.asyncio.ASYNCIO`): connect,
sleep, now, run-until-first-finishes, timeouts, events, a lock. That is all that differs between trio and
asyncio, so the protocol logic exists once and the adapters stay ~100 lines each; every rule (when to ping,
how to batch, where to resume) is in the sans-IO `idled.client.core`.

Concurrent users of a link (the application's task sending, the keepalive timer) serialise their writes
through one lock: a trio stream forbids concurrent `send_all`, and asyncio's `drain()` is not fair either.
TLS (``ssl_context=``, an ``ssl.SSLContext`` the application builds: its CA, a client certificate for a
gateway or observer logging in by certificate) wraps every connection of the link, verifying the server as
``server_hostname`` (default: the host of the core connected to). The adapters remember the last TLS session of a link and offer it on
the next connect (trio; asyncio's streams cannot), so a reconnect costs a resumed handshake, not a full one:
what makes a reconnect storm affordable for the server.

State changes (connected, disconnected, done) are broadcast by replacing an event (`_pulse`), so any number
of waiters can wait for "something changed" and re-check.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from idled.client.core import Backoff
from idled.client.errors import ClientError, ConnectionLost, NotLeader, ProtocolMismatch, error_from
from idled.client.leader import Hosts, LeaderSearch
from idled.protocol import (
    BYE_FRAME, Error, FrameDecoder, Login, ProtocolError, Welcome, encode, parse_server_message, receive_message,
)
from idled.protocol.address import AddressError, parse_address, parse_addresses

__all__ = ["Conn", "Flag", "Runtime", "Link", "Mailbox", "CLIENT_MAX_FRAME"]

T = TypeVar("T")
# Largest frame the client accepts from a server: a `status` reply to a big query, an `event` with extras.
CLIENT_MAX_FRAME = 1 << 24


class Conn(Protocol):
    """A connected byte stream; every I/O failure is raised as ConnectionLost."""

    async def receive_some(self, max_bytes: int | None = None, /) -> bytes | bytearray: ...
    async def send_all(self, data: bytes) -> None: ...
    async def aclose(self) -> None: ...


class Flag(Protocol):
    """A one-shot event (trio.Event / asyncio.Event)."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> Any: ...


class Runtime(Protocol):
    """What a link needs from an async library."""

    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...
    async def connect(self, host: str, port: int, tls: TLS | None = None) -> Conn: ...
    async def race(self, *fns: Callable[[], Awaitable[Any]]) -> Any: ...
    async def with_timeout(self, seconds: float, fn: Callable[[], Awaitable[T]]) -> T: ...
    def event(self) -> Flag: ...
    def lock(self) -> Any: ...


class TLS:
    """A link's TLS: the context, the name the server's certificate must carry, the session to resume."""

    __slots__ = ("context", "server_hostname", "session")

    def __init__(self, context: ssl.SSLContext, server_hostname: str | None) -> None:
        self.context = context
        self.server_hostname = server_hostname  # None: the host connected to
        self.session: ssl.SSLSession | None = None  # set by the adapter when a connection ends


class Mailbox(Generic[T]):
    """A bounded single-producer single-consumer queue over a Runtime's events (the same code on both
    libraries). `get()` returns None once closed and drained. A full mailbox makes `put` wait: the observer's
    reader then stops reading, which is how a slow application pushes back on the server."""

    def __init__(self, runtime: Runtime, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.items: deque[T] = deque()
        self.maxsize = maxsize
        self.closed = False
        self._runtime = runtime
        # Set while the consumer (producer) waits: whoever changes `items` must wake it.
        self.waiting_reader: Flag | None = None
        self.waiting_writer: Flag | None = None

    async def put(self, item: T) -> None:
        while len(self.items) >= self.maxsize:
            self.waiting_writer = flag = self._runtime.event()
            await flag.wait()
        self.items.append(item)
        if self.waiting_reader is not None:
            self.waiting_reader.set()
            self.waiting_reader = None

    async def get(self) -> T | None:
        items = self.items
        while not items:
            if self.closed:
                return None
            self.waiting_reader = flag = self._runtime.event()
            await flag.wait()
        item = items.popleft()
        if self.waiting_writer is not None:
            self.waiting_writer.set()
            self.waiting_writer = None
        return item

    def close(self) -> None:
        self.closed = True
        if self.waiting_reader is not None:
            self.waiting_reader.set()
            self.waiting_reader = None


class Link:
    """One logical connection with login, reconnects and a send lock; subclassed per role."""

    def __init__(self, runtime: Runtime, host: Hosts, port: int | None, login: Login, *, reconnect: bool = True,
                 backoff: Backoff | None = None, connect_timeout: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        self.runtime = runtime
        # The cores to find the leader among (one, or several: see idled.client.leader); `host`, `port`: the
        # one being tried or connected to.
        self.cores: LeaderSearch[Any] = LeaderSearch(parse_addresses(host, port))
        self.host, self.port = self.cores.target
        self.tls = TLS(ssl_context, server_hostname) if ssl_context is not None else None
        self.login = login
        self.reconnect = reconnect
        self.backoff = backoff or Backoff()
        self.connect_timeout = connect_timeout
        self.welcome: Welcome | None = None
        self.error: ClientError | None = None  # the final error, once run() ended because of one
        self.last_error: ClientError | None = None  # the latest retryable one
        self.connections = 0  # successful logins: 1 + reconnects
        self.settled = 0  # connections whose setup was accepted (see _settle)
        self.frames_sent = 0
        self.done = False
        self._conn: Conn | None = None
        self._closing = False
        self._changed = runtime.event()
        self._send_lock = runtime.lock()

    # -- state ------------------------------------------------------------------------------------------------

    def _pulse(self) -> None:
        changed, self._changed = self._changed, self.runtime.event()
        changed.set()

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def _raise_if_done(self) -> None:
        if self.error is not None:
            raise self.error
        if self.done or self._closing:
            raise ConnectionLost("the client is closed")

    async def wait_connected(self) -> Conn:
        """The current connection, waiting for a (re)connect; raises the final error if the link ended."""
        while True:
            self._raise_if_done()
            if self._conn is not None:
                return self._conn
            await self._changed.wait()

    async def wait_done(self) -> None:
        """Until run() has ended; raises its final error, if any."""
        while not self.done:
            await self._changed.wait()
        if self.error is not None:
            raise self.error

    # -- sending ----------------------------------------------------------------------------------------------

    async def send_frame(self, frame: bytes) -> None:
        """Send one encoded frame on the current connection (waiting for one if reconnecting)."""
        async with self._send_lock:
            conn = await self.wait_connected()
            await conn.send_all(frame)
            self.frames_sent += 1
            self._sent(frame)

    def _sent(self, frame: bytes) -> None:
        """Hook: a frame went out (sessions count it as activity)."""

    # -- the loop ---------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, log in and serve until aclose() or a final error; never raises a ClientError."""
        attempt = 0
        cores = self.cores
        try:
            while not self._closing:
                before = self.settled
                if isinstance(cores.target, tuple):  # HostPort (an edge's unix:PATH core is not: its _open dials it)
                    self.host, self.port = cores.target
                try:
                    await self._connection()
                    attempt = 0
                    cores.lost()
                except ClientError as exc:
                    if self._closing:
                        return
                    was_up = self.settled > before  # set up, not merely welcomed (see _settle)
                    hint = self._hint(exc)
                    if was_up:
                        cores.lost(hint)
                    elif self._elsewhere(exc) and cores.failed(hint):
                        # Another core is left in this round (see idled.client.leader): at once, no backoff.
                        self.last_error = exc
                        self._on_retry(exc, False, 0.0)
                        continue
                    if not self._retryable(exc):
                        self.error = exc
                        return
                    self.last_error = exc
                    if was_up:
                        attempt = 0  # the backoff counts failed rounds since the last login, not connections
                    elif self.connections == 0 and attempt == 0 and not isinstance(exc, ConnectionLost):
                        attempt = 1  # refused at once (busy): do not hammer
                    delay = self.backoff.delay(attempt)
                    self._on_retry(exc, was_up, delay)
                    await self.runtime.sleep(delay)
                    attempt += 1
        finally:
            self.done = True
            self._on_done()
            self._pulse()

    def _hint(self, exc: ClientError) -> Any:
        """The core a `not_leader` refusal named, as a member of `cores` (None: none, or unreadable)."""
        leader = exc.leader if isinstance(exc, NotLeader) else None
        if leader is None:
            return None
        try:
            return parse_address(leader)
        except AddressError:
            return None  # a hint we cannot read is no hint: go on with the list

    def _elsewhere(self, exc: ClientError) -> bool:
        """Whether a failed login is worth trying at the next core of the round (even without reconnects:
        the round is one attempt): whatever a later attempt could cure."""
        return exc.retryable or self._retryable(exc)

    async def _connection(self) -> None:
        runtime = self.runtime
        conn = await runtime.with_timeout(self.connect_timeout, self._open)
        decoder = FrameDecoder(CLIENT_MAX_FRAME, parse=parse_server_message)
        try:
            await conn.send_all(encode(self._login()))
            welcome = await runtime.with_timeout(self.connect_timeout, lambda: self._receive(conn, decoder))
            if not isinstance(welcome, Welcome):
                raise ProtocolMismatch("bad_message", f"expected welcome, got {type(welcome).__name__}")
            self.welcome = welcome
            self.connections += 1
            self.cores.connected()
            await self._on_welcome(conn, welcome)
            self._conn = conn
            if self._settles_at_welcome():
                self._settle()
            self._pulse()
            await runtime.race(lambda: self._read(conn, decoder), lambda: self._background(conn))
        finally:
            self._conn = None
            self._on_disconnect()
            self._pulse()
            await conn.aclose()

    async def _receive(self, conn: Conn, decoder: FrameDecoder) -> Any:
        try:
            message = await receive_message(conn, decoder)
        except ProtocolError as exc:
            # Retryable on purpose: today's server can cut an event frame short when it drops a slow
            # observer (the `busy` frame follows a partial write), and a fresh connection resumes by seq.
            raise ConnectionLost(f"undecodable frame from the server ({exc.code}: {exc.reason})") from None
        if message is None:
            raise ConnectionLost("the server closed the connection")
        if type(message) is Error:
            raise error_from(message.code, message.reason, message.leader)
        return message

    async def _read(self, conn: Conn, decoder: FrameDecoder) -> None:
        while True:
            await self._on_message(await self._receive(conn, decoder))

    async def aclose(self, linger: float = 1.0) -> None:
        """Log out (`bye`) and stop reconnecting; waits up to `linger` s for the server to close, so the bye
        is not lost to a reset (closing a socket with unread data resets it)."""
        if self._closing or self.done:
            return
        self._closing = True
        conn = self._conn
        if conn is not None:
            try:
                async with self._send_lock:
                    await conn.send_all(BYE_FRAME)
            except ClientError:
                return
            async def until_done() -> None:
                while not self.done and self._conn is conn:
                    await self._changed.wait()
            try:
                await self.runtime.with_timeout(linger, until_done)
            except ClientError:
                pass

    # -- role hooks -------------------------------------------------------------------------------------------

    async def _open(self) -> Conn:
        """A new connection to the server (within `connect_timeout`)."""
        return await self.runtime.connect(self.host, self.port, self.tls)

    def _login(self) -> Login:
        """The login frame of a new connection."""
        return self.login

    def _retryable(self, exc: ClientError) -> bool:
        """Whether to reconnect after `exc` (else it is the link's final error)."""
        return self.reconnect and exc.retryable

    def _on_retry(self, exc: ClientError, was_up: bool, delay: float) -> None:
        """The connection ended (`was_up`: after its login) or failed to log in; the next attempt is in `delay` s."""

    async def _on_welcome(self, conn: Conn, welcome: Welcome) -> None:
        """Restore the role's state on a new connection (before anyone else may send on it)."""

    def _settles_at_welcome(self) -> bool:
        """Whether the welcome ends this role's setup (an observer's subscription is answered later)."""
        return True

    def _settle(self) -> None:
        """The server accepted this connection's setup: the welcome, or what the role sent after it (an
        observer's subscription). Only a settled connection counts as up: one whose setup is refused (a
        standby behind the seq an observer resumes from) is a failed attempt -- the next core at once, the
        backoff growing between rounds -- not a lost connection to log in again to at once."""
        self.settled += 1
        self._on_settled()
        self._pulse()

    def _on_settled(self) -> None:
        """Hook: this connection is set up (`_settle`)."""

    async def _on_message(self, message: Any) -> None:
        """A message other than `error`."""

    async def _background(self, conn: Conn) -> None:
        """Timers while connected (keepalive, flushes); by default nothing: wait until cancelled."""
        await self.runtime.event().wait()

    def _on_disconnect(self) -> None:
        """The connection ended (the link may reconnect)."""

    def _on_done(self) -> None:
        """run() ended for good."""
