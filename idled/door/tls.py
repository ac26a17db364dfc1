"""The front of a public connection: the PROXY header (from an allowed balancer), then TLS, then idled frames.

Theory of operation
-------------------
The gate (``idled.door.gate``) runs ``Front.read_proxy`` then ``Front.handshake`` once per accepted connection,
inside the doorway's login deadline (so a peer that stalls in the header or the handshake is closed like one
that never logs in). They give the stream the protocol runs on and the client's address as logs should show it:

1. **PROXY** (``--proxy-protocol``): the socket's own peer must be in ``--proxy-allow`` (a header from anyone
   else would let them claim any address: refused with an error frame). The header is read with
   ``idled.protocol.proxy``, at most ``wanted`` bytes per read, so a v2 header leaves nothing behind; bytes a
   v1 header's read took past its CRLF are given back in front of the stream (``Replay``). A missing or bad
   header is a ``ProxyError`` (``bad_frame``). Its source address replaces the socket's peer (LOCAL/UNKNOWN
   headers -- the balancer's health checks -- keep the socket's).
2. **TLS** (``--tls-cert``/``--tls-key``): a trio ``SSLStream`` over what step 1 left, server side, handshake
   done here. A failed handshake (a plaintext client, an old protocol version, an untrusted client
   certificate) raises ``HandshakeFailed``, after sending the TLS alert that says why (``_send_alert``): the
   doorway closes without a frame (there is no channel to send one on). However the handshake ended, the stream's built-in reference cycle is then broken (``untie``),
   so a closed connection is freed by reference counting, not left for the collector.

**The context** (``server_context``): TLS 1.2 minimum (1.3 preferred by OpenSSL), forward-secret AEAD ciphers
only for 1.2, no compression, ALPN ``idled/1`` (selected when the client offers it; a client offering none,
or only other protocols, is served without ALPN: the framing tells soon enough), one TLS 1.3 session ticket
per handshake (``num_tickets = 1``: one reconnect needs one; OpenSSL's default 2 costs a second ticket's
encryption and bytes on every handshake).
Resumption is stateless (tickets encrypted under a key of the context): no server-side session cache.

**The client side** (``client_context``): what a link to another core speaks (``idled.door.outbound``: a
standby's, an edge's): the server verified against a CA file or the system's trust store, its name checked,
TLS 1.2 minimum with the same 1.2 suites, ALPN ``idled/1``, optionally a client certificate.

**Reload** (SIGHUP): ``Front.reload()`` builds a new context from the same files; new handshakes use it,
established connections keep the SSL objects they have. If the new files do not load, the old context stays
and the error is logged. A new context has a new ticket key, so tickets issued before a reload make full
handshakes after it (rotate certificates at a quiet hour, or expect one full-handshake wave).

**Client certificates** (``--tls-client-ca``): the server asks for a certificate (optional: users have none)
and verifies any that is presented against that CA; an untrusted one fails the handshake. ``certified(stream,
login)`` then decides whether a verified certificate stands in for a token. The rule, exactly: only the roles
``gateway``, ``observer`` and ``standby`` (never ``uid``), and only when the certificate names that role and name -- a
``subjectAltName`` URI ``idled:<role>:<name>`` (e.g. ``idled:gateway:push-eu1``) or, for a certificate with
no URI names at all, a subject commonName exactly ``<role>:<name>``. DNS names are not consulted: they name
hosts, and a host name is not a gateway's identity. A login that carries a token is still checked as a token.
The doorway (``idled.server.roles.doorway``) gives a certified login a short-lived token of its own, so an edge that
relays it makes the core accept it.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Sequence
from typing import Any, Final

import trio

from idled.door.addresses import display, host_of
from idled.ops.config import Config
from idled.ops.fatal import EXIT_USAGE, Fatal
from idled.protocol import Login, NEED_DATA
from idled.protocol.proxy import ProxyError, ProxyHeader, ProxyParser

__all__ = [
    "ALPN", "CERT_ROLES", "Front", "HandshakeFailed", "Replay", "Wrapped", "TLSConfigError", "allowed", "certificate_names",
    "client_context", "parse_allow", "server_context", "untie",
]

log = logging.getLogger("idled.door.tls")

ALPN: Final = "idled/1"
CERT_ROLES: Final = ("gateway", "observer", "standby")  # roles a client certificate may stand in for a token for
DRAIN_TIME: Final = 0.05  # seconds a refused PROXY peer's pending bytes are read for (see _drain)
DRAIN_READS: Final = 16  # ... and at most this many reads of 4 KiB
ALERT_TIME: Final = 0.5  # seconds a failed handshake's alert may take to send (see _send_alert)
TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"  # TLS 1.3 suites are OpenSSL's (all AEAD, all fine)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TLSConfigError(ValueError):
    """A certificate, key or CA file that does not load (``what``: which file, ``reason``: why)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"cannot load {what}: {reason}")
        self.what, self.reason = what, reason


class HandshakeFailed(Exception):
    """The TLS handshake failed; ``reason`` is short and countable."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def server_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The server context described in the module docstring (``TLSConfigError`` naming the file if not)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols([ALPN])
    ctx.num_tickets = 1
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"TLS certificate {cert} / key {key}", str(exc)) from None
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"TLS client CA {client_ca}", str(exc)) from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(ca: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """The client side of a link to another core (``idled.door.outbound``): the server's certificate verified
    against ``ca`` (None: the system's trust store) and its name checked (``check_hostname``: the caller gives
    the name), TLS 1.2 minimum, the same 1.2 suites as the server's, ALPN ``idled/1``; ``cert``/``key``: a
    client certificate to present. ``TLSConfigError`` naming the file that does not load."""
    try:
        ctx = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"link CA {ca}", str(exc)) from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols([ALPN])
    if cert:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"link certificate {cert} / key {key}", str(exc)) from None
    return ctx


def parse_allow(text: str) -> list[Network]:
    """``--proxy-allow``: comma-separated CIDRs (or single addresses). ValueError naming the bad one."""
    networks = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                networks.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise ValueError(f"proxy_allow: {part!r} is not an address or CIDR") from None
    return networks


def allowed(host: str, networks: Sequence[Network]) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack listener sees IPv4 balancers as ::ffff:a.b.c.d
    return any(address in net for net in networks if net.version == address.version)


async def _drain(stream: trio.abc.Stream) -> None:
    """Read (briefly, boundedly) what the peer already sent before it is refused: closing a socket with unread
    data resets the connection, and a reset can destroy the error frame before the peer reads it."""
    with trio.move_on_after(DRAIN_TIME):
        for _ in range(DRAIN_READS):
            if not await stream.receive_some(4096):
                return


async def _send_alert(tls: trio.SSLStream[Any], stream: trio.abc.Stream) -> None:
    """Send the alert OpenSSL wrote when the handshake failed. trio raises at the failure without sending what
    the SSL object still holds, so the peer would see the connection just close; with the alert it learns why
    -- e.g. a client whose certificate this server's CA does not trust reads ``unknown ca`` (TLS 1.3: at its
    first read) instead of an EOF it cannot tell from a restart (``idled.door.outbound`` classifies it). A few
    bytes, bounded in time; a private attribute of trio's, so a trio that renames it sends nothing, as before."""
    outgoing = getattr(tls, "_outgoing", None)
    data = outgoing.read() if isinstance(outgoing, ssl.MemoryBIO) else b""
    if data:
        with trio.move_on_after(ALERT_TIME):
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError):
                pass


def certificate_names(cert: dict) -> set[str]:
    """``role:name`` identities a verified certificate (``getpeercert()``) carries, by the module's rule."""
    uris = [value for kind, value in cert.get("subjectAltName", ()) if kind == "URI"]
    if uris:
        return {uri[len("idled:"):] for uri in uris if uri.startswith("idled:")}
    return {value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"}


async def _handshake_spent() -> None:
    raise AssertionError("an SSLStream runs its handshake once")  # never called: see untie


def untie(tls: trio.SSLStream[Any]) -> None:
    """Break the reference cycle every trio ``SSLStream`` is born in, once its handshake has run.

    The stream's run-once handshake guard (``_handshook``, a ``trio._ssl._Once``) holds the bound method
    ``stream._do_handshake``: stream -> guard -> method -> stream. Reference counting never frees a cycle, so
    each finished stream (its SSLObject, both MemoryBIOs, the socket under it: ~23 objects, counted
    with ``gc.DEBUG_SAVEALL``) waits for the cyclic collector -- and the GC policy (``idled.ops.gcpolicy``) freezes whatever
    survives a full collection, so a connection alive at one is freed only by the next thaw, up to a day
    later. Measured before this: 500 stalled handshakes at a time grew an edge from 33 MB to 176-238 MB.

    Once the guard has started (``do_handshake`` was entered; whether it then succeeded, failed or was
    cancelled), trio never calls the method again -- the guard only waits on its event, and a broken or
    closed stream raises before reaching it -- so replacing it changes nothing but the cycle. A trio that
    renames the guard leaves this a no-op; ``tests/server/test_tls_garbage.py`` then fails and says so.
    """
    once = vars(tls).get("_handshook")
    if once is not None and getattr(once, "started", False):
        once._afn = _handshake_spent


class Wrapped(trio.abc.Stream):
    """A stream in front of another, passing everything through (subclasses change what ``receive_some`` does)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.socket = getattr(stream, "socket", None)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


class Replay(Wrapped):
    """A stream with some bytes already read from it given back in front (a v1 PROXY read past its CRLF)."""

    def __init__(self, stream: trio.abc.Stream, head: bytes) -> None:
        super().__init__(stream)
        self.head = head

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.head:
            n = len(self.head) if max_bytes is None else max_bytes
            data, self.head = self.head[:n], self.head[n:]
            await trio.lowlevel.checkpoint()
            return data
        return await self.stream.receive_some(max_bytes)


class Front:
    """PROXY then TLS for one listener's connections, per the configuration (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        self.cert, self.key, self.client_ca = config.tls_cert, config.tls_key, config.tls_client_ca
        try:
            self.context = server_context(self.cert, self.key, self.client_ca) if self.cert and self.key else None
        except TLSConfigError as exc:
            raise Fatal("cannot start TLS", exc.what, exc.reason, EXIT_USAGE) from None
        self.proxy = config.proxy_protocol
        self.allow = parse_allow(config.proxy_allow)

    @property
    def active(self) -> bool:
        return self.context is not None or self.proxy

    def reload(self) -> bool:
        """Re-read the certificate files (SIGHUP). False (logged) if they do not load: the old ones stay."""
        if self.context is None or self.cert is None or self.key is None:
            return True
        try:
            self.context = server_context(self.cert, self.key, self.client_ca)
        except TLSConfigError as exc:
            log.error("SIGHUP: TLS certificate not reloaded, still serving the previous one: %s", exc)
            return False
        log.info("SIGHUP: TLS certificate reloaded from %s (new handshakes use it)", self.cert)
        return True

    async def read_proxy(self, stream: trio.abc.Stream, address: str) -> tuple[trio.abc.Stream, str]:
        """Read the PROXY header from an allowed balancer: the stream to go on with (bytes read past the header
        given back in front) and the client's address (the balancer's own for LOCAL/UNKNOWN headers, its health
        checks). ``ProxyError`` if refused (what the peer already sent is drained first)."""
        try:
            header = await self._proxy_header(stream, address)
        except ProxyError:
            await _drain(stream)
            raise
        if isinstance(header, tuple):
            header, stream = header
        if header.source is not None:
            address = display(*header.source)
        return stream, address

    async def handshake(self, stream: trio.abc.Stream) -> trio.SSLStream[trio.abc.Stream]:
        """The server side of a TLS handshake over ``stream`` (``HandshakeFailed`` if it fails)."""
        assert self.context is not None
        tls = trio.SSLStream(stream, self.context, server_side=True)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            await _send_alert(tls, stream)
            cause = exc.__cause__
            raise HandshakeFailed(getattr(cause, "reason", None) or type(cause or exc).__name__) from None
        finally:
            untie(tls)
        return tls

    async def _proxy_header(
        self, stream: trio.abc.Stream, address: str
    ) -> ProxyHeader | tuple[ProxyHeader, trio.abc.Stream]:
        host = host_of(address)
        if not allowed(host, self.allow):
            raise ProxyError(f"{address} is not an allowed balancer (proxy_allow)")
        parser = ProxyParser()
        while True:
            event = parser.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ProxyHeader)
                return (event, Replay(stream, parser.trailing)) if parser.trailing else event
            data = await stream.receive_some(parser.wanted)
            if not data:
                raise ProxyError("connection closed before the header ended")
            parser.receive_data(data)

    def certified(self, stream: trio.abc.Stream, login: Login) -> bool:
        """True if a verified client certificate names this gateway/observer login (the module's rule)."""
        if self.client_ca is None or login.role not in CERT_ROLES or not isinstance(stream, trio.SSLStream):
            return False
        cert = stream.getpeercert()
        return bool(cert) and f"{login.role}:{login.name}" in certificate_names(cert)
