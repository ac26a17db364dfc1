"""``--election etcd://HOST:PORT[,HOST:PORT...]/prefix``: where the etcd cluster is and which keys are ours.

A pure parser: text in, an `EtcdTarget` or an `ElectionConfigError` saying what is wrong out. The rules:

* the scheme is ``etcd`` (the client speaks plain HTTP to etcd's v3 JSON gateway; there is no TLS yet);
* one or more endpoints, comma-separated, as the one address grammar reads them (``idled.protocol.address``):
  ``host:port``, ``[ipv6]:port``; the port may be left out and is then etcd's client port, 2379; no endpoint
  twice; no user, password, query or fragment (credentials never go in a URL that is logged and shown in
  ``ps``);
* a prefix of one or more ``/``-separated segments of letters, digits, ``.``, ``_`` and ``-`` (no empty
  segment, no trailing ``/``): the keys are ``<prefix>/leader`` and ``<prefix>/seq``. Two deployments
  sharing one etcd use two prefixes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from idled.protocol.address import AddressError, HostPort, format_address, format_addresses, parse_addresses
from idled.server.election.errors import ElectionConfigError

__all__ = ["DEFAULT_PORT", "EtcdTarget", "parse_election_url"]

DEFAULT_PORT: Final = 2379
_WHAT: Final = "--election"
_SEGMENT: Final = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True, slots=True)
class EtcdTarget:
    """A parsed election URL. ``endpoints``: (host, port), in the URL's order; ``prefix``: starts with
    ``/``, never ends with one."""

    endpoints: tuple[HostPort, ...]
    prefix: str

    @property
    def base_urls(self) -> tuple[str, ...]:
        """``http://host:port`` for each endpoint (IPv6 literals in brackets)."""
        return tuple(f"http://{format_address(endpoint)}" for endpoint in self.endpoints)

    @property
    def leader_key(self) -> str:
        return f"{self.prefix}/leader"

    @property
    def seq_key(self) -> str:
        return f"{self.prefix}/seq"

    def __str__(self) -> str:
        return f"etcd://{format_addresses(self.endpoints)}{self.prefix}"


def parse_election_url(text: str) -> EtcdTarget:
    """Parse ``etcd://HOST:PORT[,HOST:PORT...]/prefix`` (see the module docstring)."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ElectionConfigError(_WHAT, f"{text!r} is not a URL: expected etcd://HOST:PORT/prefix")
    if scheme.lower() != "etcd":
        raise ElectionConfigError(_WHAT, f"scheme {scheme!r} is not supported: expected etcd://HOST:PORT/prefix")
    for char, name in (("?", "a query"), ("#", "a fragment"), ("@", "credentials")):
        if char in rest:
            raise ElectionConfigError(_WHAT, f"{text!r} has {name}: only etcd://HOST:PORT[,HOST:PORT]/prefix")
    hosts, slash, path = rest.partition("/")
    if not slash or not path:
        raise ElectionConfigError(_WHAT, f"{text!r} has no key prefix: expected etcd://HOST:PORT/prefix")
    if not hosts:
        raise ElectionConfigError(_WHAT, f"{text!r} names no etcd endpoint")
    try:
        endpoints = parse_addresses(hosts, DEFAULT_PORT)
    except AddressError as exc:
        raise ElectionConfigError(_WHAT, f"etcd endpoint: {exc}") from None
    if len(endpoints) != hosts.count(",") + 1:
        raise ElectionConfigError(_WHAT, f"{text!r} names an endpoint twice")
    segments = path.split("/")
    for segment in segments:
        if not segment:
            raise ElectionConfigError(_WHAT, f"prefix /{path!r} has an empty segment (a doubled or trailing '/')")
        if not _SEGMENT.match(segment) or segment in (".", ".."):
            raise ElectionConfigError(
                _WHAT, f"prefix segment {segment!r} may hold only letters, digits, '.', '_' and '-'")
    return EtcdTarget(endpoints, "/" + path)
