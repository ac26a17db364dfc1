"""The gate every accepted connection passes before its protocol sees it: a share per source, PROXY, TLS.

Theory of operation
-------------------
A listener's handler (the client port's doorway, the HTTP API, the metrics endpoint) runs each connection in
``async with gate.enter(stream, timeout) as entry:`` and, first thing, looks at ``entry.refused``: None, or why
the gate turned the connection away (a ``Refused``, already counted; the handler answers in its protocol if
``refused.stream`` allows, and closes). The gate, in this order, cheapest first:

1. **Whose share.** The connection counts against its source (``idled.door.addresses.address_key``: the
   address, an IPv6 /64; a unix socket's peer is not counted) until the handler says it authenticated
   (``entry.authenticated()``: a login whose token checked out, an API request with a good bearer token) or it
   ends. A source already holding ``per_address`` such connections is refused (``Refused("per_address")``)
   before a byte of it is read: one address cannot take the room every other client needs to log in (nginx's
   ``limit_conn`` per address, for connections not yet known). Behind a balancer speaking PROXY (``front``),
   the balancer's own connections are not counted: the source is read from its header first, and counted.
2. **PROXY** (``front.proxy``): the header, from an allowed balancer only (else ``Refused("proxy")``).
3. **Over all sources.** At ``max_pending`` unauthenticated connections in all, a new one is refused -- or,
   with ``evict``, the oldest of them is cancelled to make room (counted ``evicted`` as its body unwinds).
   The metrics endpoint evicts: a prober's one short request always gets in, while a flood from many
   addresses only ever holds connections that have not said anything yet. The client port and the HTTP API
   evict the same way at their own connection limit (``evict_oldest``): many sources each within their share
   (three addresses, or an IPv6 /48's worth of /64s) cannot fill every slot with connections that never
   authenticate either -- the newest connection takes the slot of the oldest that has not shown a token and
   has waited ``evict_after`` (half its login or request deadline), which, under attack, is the attacker's:
   a real login takes milliseconds, and one still within its time is never cut short (at the limit under a
   storm of real logins the newcomer is refused busy, as before).
4. **TLS** (``front.context``): the first byte is peeked: a client that does not begin with a TLS handshake
   record is refused in plain text (``Refused("tls_required")``: its protocol can say so, instead of a
   handshake that fails silently), else the handshake runs (``Refused("tls_handshake")`` if it fails).

Steps 2 and 4 share the deadline ``timeout`` from the accept (``Refused("timeout")`` past it); the handler
gets what is left of it as ``entry.deadline`` (the client port's login deadline covers PROXY, TLS and the
login frame). ``Refused.stream`` is the stream a refusal may be written on in plain text, or None when none
can be (mid-handshake). Refusals are counted by reason in ``refused``. The gate never closes a stream: its
handler owns the connection (the client port hands logged-in users over to the user plane). Refusing by a
value rather than an exception keeps the handlers' protocol (``idled.ops.http``, below this package, types it
structurally) free of this package.
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final, NoReturn

import trio

from idled.door.addresses import address_key, display, host_of
from idled.door.tls import Front, HandshakeFailed, Replay
from idled.protocol.proxy import ProxyError

__all__ = ["TLS_HANDSHAKE_RECORD", "Entry", "Gate", "Limits", "Refused"]

TLS_HANDSHAKE_RECORD: Final = 0x16  # the first byte of every TLS ClientHello


class Refused(Exception):
    """Why the gate turned a connection away. ``reason``: a countable label (per_address, busy, proxy,
    tls_required, tls_handshake, timeout); ``message``: for the peer; ``stream``: where a plain-text refusal
    may be written (None: nowhere, e.g. mid-handshake). Raised inside the gate, handed to the handler as
    ``entry.refused``."""

    def __init__(self, reason: str, message: str, stream: trio.abc.Stream | None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.stream = reason, message, stream


@dataclass(frozen=True, slots=True)
class Limits:
    """A listener's limits on connections not yet authenticated (see the module docstring)."""

    per_address: int
    max_pending: int | None = None
    evict: bool = False
    # Seconds a connection must have waited without authenticating before a newcomer may evict it: a login in
    # progress is never cut short (at the limit under a storm of real logins the newcomer is refused, not
    # every login in turn), a connection lingering to hold a slot is.
    evict_after: float = 0.0

    def __post_init__(self) -> None:
        if self.per_address < 1 or (self.max_pending is not None and self.max_pending < 1) or self.evict_after < 0:
            raise ValueError("per_address and max_pending must be at least 1, evict_after not negative")


class Entry:
    """A connection through the gate: its stream (TLS or not), its client's address, what is left of its
    deadline, and ``authenticated()`` to give back its source's share."""

    __slots__ = ("stream", "address", "key", "deadline", "since", "scope", "refused", "_gate", "_counted")

    def __init__(self, gate: Gate, stream: trio.abc.Stream, address: str, key: str | None, since: float,
                 deadline: float) -> None:
        self._gate = gate
        self.since = since  # when it came (eviction spares it for a while)
        self.stream = stream
        self.address = address
        self.key = key
        self.deadline = deadline
        self.scope = trio.CancelScope()  # cancelled to evict it
        self.refused: Refused | None = None
        self._counted = False

    def authenticated(self) -> None:
        """It showed who it is: it no longer counts against its source (idempotent)."""
        self._gate._leave(self)


class Gate:
    """Admission of one listener's connections (see the module docstring)."""

    def __init__(self, limits: Limits, front: Front | None = None) -> None:
        self.limits = limits
        self.front = front
        self.pending: dict[str, int] = {}  # source -> connections not authenticated yet
        self._entries: dict[Entry, None] = {}  # the same, oldest first (eviction)
        self.refused: Counter[str] = Counter()

    @property
    def waiting(self) -> int:
        """Connections not authenticated yet, over all sources."""
        return len(self._entries)

    @asynccontextmanager
    async def enter(self, stream: trio.abc.Stream, timeout: float,
                    full: Callable[[], bool] | None = None) -> AsyncIterator[Entry]:
        """Admit ``stream`` and yield its entry for the body's lifetime (``entry.refused``: see above). ``full``:
        whether the listener is at its connection limit, asked once the source's share is known to allow the
        connection (and before TLS): then the oldest connection not authenticated yet makes room, or -- none
        left but this one -- it is refused ``busy``."""
        now = trio.current_time()
        host, address = _peer(stream)
        front = self.front
        proxied = front is not None and front.proxy and host is not None
        entry = Entry(self, stream, address, None if proxied else address_key(host), now, now + timeout)
        try:
            with entry.scope:
                try:
                    await self._open(entry, front, proxied, full)
                except Refused as exc:
                    self._leave(entry)
                    # Kept without its traceback and context: they hold this very frame (and the entry), a
                    # reference cycle per refused connection that only the cyclic collector would free.
                    exc.__traceback__ = exc.__context__ = exc.__cause__ = None
                    entry.refused = exc
                yield entry
            if entry.scope.cancelled_caught:
                self.refused["evicted"] += 1
        finally:
            self._leave(entry)

    async def _open(self, entry: Entry, front: Front | None, proxied: bool, full: Callable[[], bool] | None) -> None:
        if not proxied:
            self._enter(entry)
        else:
            assert front is not None
            stream, address = await self._proxy(front, entry.stream, entry.address, entry.deadline)
            entry.stream, entry.address, entry.key = stream, address, address_key(host_of(address))
            self._enter(entry)
        if full is not None and full() and not self.evict_oldest(sparing=entry):
            self._refuse("busy", "too many connections", entry.stream)
        if front is not None and front.context is not None:
            entry.stream = await self._tls(front, entry.stream, entry.deadline)

    # -- the steps ------------------------------------------------------------------------------------------------

    def evict_oldest(self, sparing: Entry | None = None) -> bool:
        """Make room for a newcomer at its listener's connection limit: cancel the oldest connection that has
        not authenticated yet and has waited ``evict_after`` at least (True), if there is one but ``sparing``
        (False: every other connection has shown who it is, or is still within its time to)."""
        oldest = next(iter(self._entries), None)
        if oldest is None or oldest is sparing or trio.current_time() - oldest.since < self.limits.evict_after:
            return False
        self._leave(oldest)
        oldest.scope.cancel()  # counted as evicted when its body unwinds
        return True

    def _enter(self, entry: Entry) -> None:
        key, limits = entry.key, self.limits
        if key is not None and self.pending.get(key, 0) >= limits.per_address:
            self._refuse("per_address", f"more than {limits.per_address} connections from {key} are logging in",
                         entry.stream)
        if limits.max_pending is not None and len(self._entries) >= limits.max_pending:
            if not limits.evict:
                self._refuse("busy", f"more than {limits.max_pending} connections are logging in", entry.stream)
            self.evict_oldest()
        entry._counted = True
        self._entries[entry] = None
        if key is not None:
            self.pending[key] = self.pending.get(key, 0) + 1

    def _leave(self, entry: Entry) -> None:
        if not entry._counted:
            return
        entry._counted = False
        del self._entries[entry]
        key = entry.key
        if key is not None:
            left = self.pending[key] - 1
            if left:
                self.pending[key] = left
            else:
                del self.pending[key]

    async def _proxy(self, front: Front, stream: trio.abc.Stream, address: str,
                     deadline: float) -> tuple[trio.abc.Stream, str]:
        opened = None
        try:
            with trio.move_on_at(deadline):
                opened = await front.read_proxy(stream, address)
        except ProxyError as exc:
            self._refuse("proxy", str(exc), stream)
        if opened is None:  # (a frame only where the client is not about to speak TLS)
            self._refuse("timeout", "no PROXY header in time", stream if front.context is None else None)
        return opened

    async def _tls(self, front: Front, stream: trio.abc.Stream, deadline: float) -> trio.abc.Stream:
        tls = None
        with trio.move_on_at(deadline):
            first = await _peek(stream)
            if first is not None and first != TLS_HANDSHAKE_RECORD:
                self._refuse("tls_required", "this port speaks TLS: connect with TLS", stream)
            try:
                tls = await front.handshake(stream)
            except HandshakeFailed as exc:
                self._refuse("tls_handshake", exc.reason, None)
        if tls is None:
            self._refuse("timeout", "no TLS handshake in time", None)
        return tls

    def _refuse(self, reason: str, message: str, stream: trio.abc.Stream | None) -> NoReturn:
        self.refused[reason] += 1
        raise Refused(reason, message, stream)


def _peer(stream: trio.abc.Stream) -> tuple[str | None, str]:
    """(the peer's IP address -- None for a unix socket or anything without a socket --, ``host:port`` as logs
    show it), from one ``getpeername``."""
    sock = getattr(stream, "socket", None)
    try:
        peer = sock.getpeername() if sock is not None else None
    except OSError:
        return None, "-"
    if not isinstance(peer, tuple) or len(peer) < 2:
        return None, "-"
    host = str(peer[0])
    return host, display(host, peer[1])


async def _peek(stream: trio.abc.Stream) -> int | None:
    """The first byte the peer sent, left in place; None if it closed first (or the stream cannot peek)."""
    if isinstance(stream, Replay) and stream.head:
        return stream.head[0]
    sock = getattr(stream, "socket", None)
    if isinstance(stream, Replay):
        sock = getattr(stream.stream, "socket", None)
    if sock is None:
        return None
    data = await sock.recv(1, socket.MSG_PEEK)
    return data[0] if data else None
