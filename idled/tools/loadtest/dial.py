"""Non-blocking connections for the user engine: socket, source address, connect, PROXY header, TLS steps.

Theory of operation
-------------------
`dial` opens a non-blocking TCP socket, sets ``IP_BIND_ADDRESS_NO_PORT`` and binds the loopback source
address with port 0, then ``connect_ex``: EINPROGRESS (or 0) is the normal answer, anything else is raised
as OSError. The option matters: a plain ``bind((addr, 0))`` makes the kernel search the ephemeral range for
a port free for *every* destination, which crawls (seconds per call, all CPU) once an earlier run's ports
sit in TIME_WAIT; with it, connect() picks the port and only needs the 4-tuple to be unique. The engine
then waits for EPOLLOUT and calls `connect_error` (``SO_ERROR``: 0 means connected).

With ``proxy_protocol`` the PROXY v2 header naming the socket's own address goes out first, in clear, as
a load balancer would send it (`proxy_header`: 28 bytes into an empty send buffer, written whole). With
``tls`` the socket is wrapped by the worker's one client context (`idled.tools.loadtest.connect.client_context`)
with ``do_handshake_on_connect=False``, and `handshake_step` is called whenever the socket is ready: it
returns 0 once the handshake is done, or the epoll flag OpenSSL waits for (EPOLLIN for SSLWantRead,
EPOLLOUT for SSLWantWrite). The wrapped socket keeps the same fd, so the engine's fd -> session map holds.

`check_loopback` is the guard every engine passes first: the load test only ever sends traffic to, and
from, 127.0.0.0/8.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import ssl
import struct
from typing import Final
from collections.abc import Iterable

from idled.protocol.proxy import encode_v2
from idled.tools.loadtest.connect import IP_BIND_ADDRESS_NO_PORT

__all__ = ["check_loopback", "dial", "connect_error", "proxy_header", "wrap_tls", "handshake_step"]


def check_loopback(host: str, sources: Iterable[str]) -> None:
    """ValueError unless the target and every source address are IPv4 loopback addresses (127.0.0.0/8)."""
    for addr in (host, *sources):
        ip = ipaddress.ip_address(addr)
        if ip.version != 4 or not ip.is_loopback:
            raise ValueError(f"the load test only connects within 127.0.0.0/8, not {addr}")


def dial(source: str, host: str, port: int) -> socket.socket:
    """A non-blocking socket from `source` whose connect to host:port is under way (or done)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        except OSError:
            pass  # not Linux: bind() picks the port, fine below ~28k connections per source
        sock.bind((source, 0))
        err = sock.connect_ex((host, port))
        if err and err != errno.EINPROGRESS:
            raise OSError(err, os.strerror(err))
    except BaseException:
        sock.close()
        raise
    return sock


def connect_error(sock: socket.socket) -> int:
    """0 once a non-blocking connect succeeded (after EPOLLOUT), else its errno."""
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)


def proxy_header(sock: socket.socket, host: str, port: int) -> bytes:
    """The PROXY v2 header naming this connection's own address as the client's."""
    local = sock.getsockname()
    return encode_v2((local[0], local[1]), (host, port))


def wrap_tls(sock: socket.socket, ctx: ssl.SSLContext, host: str) -> ssl.SSLSocket:
    """The connected socket as a TLS client socket, handshake not yet started (same fd)."""
    return ctx.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)


def handshake_step(sock: ssl.SSLSocket) -> int:
    """Advance the TLS handshake: 0 when done, else the epoll flag to wait for. Raises OSError / SSLError."""
    try:
        sock.do_handshake()
    except ssl.SSLWantReadError:
        return select.EPOLLIN
    except ssl.SSLWantWriteError:
        return select.EPOLLOUT
    return 0


# Linux: stamp received packets, so a login's latency is the welcome's arrival, not the turn that read it
SO_TIMESTAMPNS: Final = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC: Final = struct.Struct("@qq")


def arrival(ancillary: list[tuple[int, int, bytes]], now: float, wall_offset: float) -> float:
    """When the kernel received the packet just read (engine time = wall time - ``wall_offset``), from its
    SO_TIMESTAMPNS stamp; ``now`` without one."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return float(min(now, sec + nsec * 1e-9 - wall_offset))
    return now


def tls_rest(sock: ssl.SSLSocket, size: int) -> bytes:
    """Plaintext OpenSSL already holds beyond the first read (the fd may not show ready for it)."""
    more = b""
    while sock.pending():
        more += sock.recv(size)
    return more
