"""``--election etcd://HOST:PORT[,HOST:PORT...]/prefix``: where the etcd cluster is and which keys are ours.

A pure parser: text in, an `EtcdTarget` or an `ElectionConfigError` saying what is wrong out. The rules:

* the scheme is ``etcd`` (the client speaks plain HTTP to etcd's v3 JSON gateway; there is no TLS yet);
* one or more endpoints, comma-separated: ``host:port``, ``[ipv6]:port``; the port may be left out and is
  then etcd's client port, 2379; no user, password, query or fragment (credentials never go in a URL
  that is logged and shown in ``ps``);
* a prefix of one or more ``/``-separated segments of letters, digits, ``.``, ``_`` and ``-`` (no empty
  segment, no trailing ``/``): the keys are ``<prefix>/leader`` and ``<prefix>/seq``. Two deployments
  sharing one etcd use two prefixes.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from idled.server.election.errors import ElectionConfigError

__all__ = ["DEFAULT_PORT", "EtcdTarget", "parse_election_url"]

DEFAULT_PORT: Final = 2379
_WHAT: Final = "--election"
_HOSTNAME: Final = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_SEGMENT: Final = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True, slots=True)
class EtcdTarget:
    """A parsed election URL. ``endpoints``: (host, port), in the URL's order; ``prefix``: starts with
    ``/``, never ends with one."""

    endpoints: tuple[tuple[str, int], ...]
    prefix: str

    @property
    def base_urls(self) -> tuple[str, ...]:
        """``http://host:port`` for each endpoint (IPv6 literals in brackets)."""
        return tuple(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
                     for host, port in self.endpoints)

    @property
    def leader_key(self) -> str:
        return f"{self.prefix}/leader"

    @property
    def seq_key(self) -> str:
        return f"{self.prefix}/seq"

    def __str__(self) -> str:
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.endpoints)
        return f"etcd://{hosts}{self.prefix}"


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
    endpoints = tuple(_endpoint(item) for item in hosts.split(","))
    if len(set(endpoints)) != len(endpoints):
        raise ElectionConfigError(_WHAT, f"{text!r} names an endpoint twice")
    segments = path.split("/")
    for segment in segments:
        if not segment:
            raise ElectionConfigError(_WHAT, f"prefix /{path!r} has an empty segment (a doubled or trailing '/')")
        if not _SEGMENT.match(segment) or segment in (".", ".."):
            raise ElectionConfigError(
                _WHAT, f"prefix segment {segment!r} may hold only letters, digits, '.', '_' and '-'")
    return EtcdTarget(endpoints, "/" + path)


def _endpoint(item: str) -> tuple[str, int]:
    if not item:
        raise ElectionConfigError(_WHAT, "an empty endpoint (a doubled or trailing ',')")
    if item.startswith("["):
        host, bracket, tail = item[1:].partition("]")
        if not bracket:
            raise ElectionConfigError(_WHAT, f"endpoint {item!r}: an IPv6 address without its closing ']'")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ElectionConfigError(_WHAT, f"endpoint {item!r}: {host!r} is not an IPv6 address") from None
        if tail and not tail.startswith(":"):
            raise ElectionConfigError(_WHAT, f"endpoint {item!r}: expected ':PORT' after ']'")
        port_text = tail[1:] if tail else None
    else:
        if item.count(":") > 1:
            raise ElectionConfigError(_WHAT, f"endpoint {item!r}: write an IPv6 address in brackets, [::1]:2379")
        host, colon, port_text_or_empty = item.partition(":")
        port_text = port_text_or_empty if colon else None
        if not _HOSTNAME.match(host):
            raise ElectionConfigError(_WHAT, f"endpoint {item!r}: {host!r} is not a host name or address")
    if port_text is None:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ElectionConfigError(_WHAT, f"endpoint {item!r}: port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)
