"""Addresses as the door sees them: how to show one, whether it is local, and whose share a peer counts against.

Three small answers every listener needs, in one place so that they agree:

* ``display(host, port)``: ``host:port`` as an operator types it (``[::1]:7878``), a unix socket's path as it is;
* ``is_local(host, port)``: nobody off this machine can connect (loopback, ``localhost``, a unix socket);
* ``address_key(host)``: the *source* a connection is counted against for the per-address limits
  (``idled.door.gate``). An IPv4 address is itself (``::ffff:a.b.c.d`` is ``a.b.c.d``); an IPv6 address counts
  as its /64, because one subscriber is routinely handed a whole /64 and could otherwise open a fresh address
  per connection (the prefix nginx and HAProxy users rate-limit by); a unix socket is None: the peers of the
  door's unix sockets are this machine's own processes (the ``--workers`` edges relaying their clients, whose
  addresses were counted on the public port already).
"""

from __future__ import annotations

import ipaddress
from typing import Final

import trio

from idled.protocol.address import format_address

__all__ = ["IPV6_PREFIX", "address_key", "bound_address", "display", "host_of", "is_local"]

IPV6_PREFIX: Final = 64  # an IPv6 source counts as its /64 (see the module docstring)


def display(host: str, port: int | None) -> str:
    """``host:port`` as an operator would type it (``[::1]:7878``: ``idled.protocol.address``); a unix socket's
    path as it is."""
    if port is None:
        return host or "(unnamed unix socket)"
    return format_address((host, port))


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is not an address
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:127.0.0.1 is loopback, whatever the Python version says
    return address


def is_local(host: str, port: int | None = 0) -> bool:
    """True for loopback addresses, ``localhost`` and unix sockets (``port`` None): nobody off this machine
    can connect. Anything else -- a wildcard, a public or private address, a name -- is not."""
    if port is None or host == "localhost":
        return True
    address = _ip(host)
    return address is not None and address.is_loopback


def address_key(host: str | None) -> str | None:
    """The source ``host`` counts against (see the module docstring); None: not counted (a unix socket)."""
    if host is None:
        return None
    if host.count(".") == 3 and host.replace(".", "").isdigit():
        return host  # IPv4 as getpeername gives it (dotted quad, canonical): the per-login path skips the parse
    address = _ip(host)
    if address is None:
        return host  # not an IP address (a test's memory stream): itself
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, IPV6_PREFIX), strict=False))
    return str(address)


def bound_address(listener: trio.SocketListener) -> tuple[str, int | None]:
    """(host, port) the socket is really bound to; a unix socket gives (its path, None)."""
    name = listener.socket.getsockname()
    if isinstance(name, tuple):
        return str(name[0]), int(name[1])
    return (name.decode(errors="replace") if isinstance(name, bytes) else str(name)), None


def host_of(address: str) -> str:
    """The host part of a ``display``-formatted ``host:port`` (``[::1]:7878`` -> ``::1``). Not the address
    grammar's parse: this reads back only what ``display`` wrote from a peer's address (or ``-``), once per
    connection, so it splits without checking."""
    return address.rsplit(":", 1)[0].strip("[]")
