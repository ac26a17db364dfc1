"""How a load-test worker opens a connection and waits for the server's welcome, and how failures are named.

Every connection binds a loopback source address before connecting -- with IP_BIND_ADDRESS_NO_PORT, so the
ephemeral port is chosen per (source, destination) by connect() -- which spreads tens of thousands of
connections over several 127.0.0.x addresses without running out of ports. Messages are read with the
protocol's one receive loop (`idled.protocol.receive_message`).

A worker's configuration may ask for a PROXY v2 header (``proxy_protocol``: it names the connection's own
source address and port, as a balancer would) and for TLS (``tls``; ``tls_ca`` to verify the server with,
else no verification: the load test measures the server, not the PKI). The TLS handshake is part of the
connect phase (its time is in the connect histogram). One client context per worker process, so its session
cache is shared -- but the load test never reconnects, so every handshake is a full one.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import ssl
from collections.abc import Mapping
from typing import Any, Final

import trio

from idled.protocol import Error, FrameDecoder, ProtocolError, Welcome, receive_message
from idled.protocol.proxy import encode_v2

__all__ = [
    "IP_BIND_ADDRESS_NO_PORT", "RECV_SIZE", "LoginFailed", "client_context", "open_from", "welcome", "error_name",
    "connect_reason",
]

# Linux: defer the ephemeral port choice from bind() to connect(), which then only needs the 4-tuple to be
# unique: ports can be reused across destinations (e.g. a new server port per --compare run).
IP_BIND_ADDRESS_NO_PORT: Final = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
RECV_SIZE: Final = 4096  # a user connection reads pongs (a few bytes each)


class LoginFailed(Exception):
    """A connection could not log in; `name` is what to count."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@functools.cache
def client_context(ca: str | None) -> ssl.SSLContext:
    """The workers' TLS context: verifying against ``ca``, or (None) not verifying at all."""
    ctx = ssl.create_default_context(cafile=ca) if ca else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not ca:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["idled/1"])
    return ctx


async def open_from(source: str, host: str, port: int, cfg: Mapping[str, Any] | None = None) -> trio.abc.Stream:
    """A connection to host:port from the loopback address `source`: TCP, then a PROXY header and TLS when
    ``cfg`` (the worker's configuration) asks for them."""
    stream = await _tcp_from(source, host, port)
    if not cfg or not (cfg.get("tls") or cfg.get("proxy_protocol")):
        return stream
    try:
        if cfg.get("proxy_protocol"):
            local = stream.socket.getsockname()
            await stream.send_all(encode_v2((local[0], local[1]), (host, port)))
        if cfg.get("tls"):
            tls = trio.SSLStream(stream, client_context(cfg.get("tls_ca")), server_hostname=host)
            await tls.do_handshake()
            return tls
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream


async def _tcp_from(source: str, host: str, port: int) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        except OSError:
            pass  # not Linux: bind() picks the port, fine below ~28k connections per source
        await sock.bind((source, 0))
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


async def welcome(stream: trio.abc.Stream, decoder: FrameDecoder, receive_bytes: int = RECV_SIZE) -> Welcome:
    """The server's welcome; LoginFailed if it refuses or closes first."""
    while True:
        msg = await receive_message(stream, decoder, receive_bytes)
        if msg is None:
            raise LoginFailed("eof_before_welcome")
        if type(msg) is Welcome:
            return msg
        if type(msg) is Error:
            raise LoginFailed(f"server:{msg.code}")
        # anything else before the welcome is ignored (lenient client)


def error_name(exc: BaseException) -> str:
    """A short, countable name for a failure: the errno name where there is one."""
    while True:
        if isinstance(exc, ssl.SSLError):
            return f"tls:{exc.reason or type(exc).__name__}"  # its errno is OpenSSL's, not the system's
        if isinstance(exc, OSError) and exc.errno:
            return errno.errorcode.get(exc.errno, f"errno{exc.errno}")
        if isinstance(exc, trio.TooSlowError):
            return "timeout"
        if isinstance(exc, ProtocolError):
            return f"protocol:{exc.code}"
        cause = exc.__cause__ or exc.__context__
        if cause is None or cause is exc:
            return type(exc).__name__
        exc = cause


def connect_reason(exc: OSError) -> str:
    """`Connection refused`, not trio's `all attempts to connect to H:P failed`: the first attempt's strerror
    (trio chains the attempts' errors as the cause, in an exception group)."""
    pending: list[BaseException] = [exc]
    while pending:
        e = pending.pop(0)
        if isinstance(e, OSError) and e.errno:
            return os.strerror(e.errno)
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
        elif e.__cause__ is not None:
            pending.append(e.__cause__)
    return str(exc)
