"""What a browser's request says of where it comes from: the Host rule and the same-origin rule (pure).

Theory of operation
-------------------
Two HTTP listeners answer on loopback without a token when auth is off: the HTTP API and the metrics
endpoint. A web page the operator opens cannot read their answers (no CORS headers are ever sent), but it
can still reach them two ways:

* **DNS rebinding.** The page's own name (``evil.example``) is made to resolve to 127.0.0.1; its requests
  go to the loopback listener and are same-origin to the browser, answers readable. They carry the
  attacker's name in ``Host``. So with auth off a ``Host`` must name this machine the way nobody can
  rebind: an IP literal (``127.0.0.1``, ``[::1]``, any address: an IP is not looked up) or ``localhost``,
  with any port (an SSH tunnel's local port). ``local_host`` says whether it does. A request without any
  ``Host`` (HTTP/1.0) names nothing and is not a browser's; a request with two is refused by the callers
  (RFC 9112 3.2: 400).
* **Cross-site requests** (CSRF): a page may send a "simple" request anywhere -- a GET, or a POST of a form
  or ``text/plain`` -- without a preflight; the answer is unreadable but the request runs. Browsers mark
  such a request with ``Origin`` (every POST; a GET from ``fetch``) and ``Sec-Fetch-Site``. ``same_origin``
  says whether an ``Origin`` names the host the request was sent to: a browser serialises an origin as
  ``scheme://host[:port]``, the port left out when it is the scheme's default, as it is left out of ``Host``;
  so the two agree when the authority part equals the ``Host``, letter case aside. ``null`` (a sandboxed or
  ``file:`` page) is no origin.

Worked example: ``Host: localhost:9878`` -> the name ``localhost``, port ``9878``: local. ``Host:
127.0.0.1.nip.io`` -> a DNS name: not local (it resolves to 127.0.0.1, which is what an attacker wants).
``Host: [::1]:8080`` -> ``::1``, an IPv6 literal: local. ``Origin: http://127.0.0.1:8080`` with ``Host:
127.0.0.1:8080``: same origin; with ``Host: localhost:8080``: not (two origins to a browser too).
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Final

__all__ = ["LOCAL_NAME", "local_host", "misdirected", "misdirected_text", "same_origin"]

LOCAL_NAME: Final = "localhost"  # browsers resolve it to loopback themselves (RFC 6761): it cannot be rebound
MAX_PORT_DIGITS: Final = 5
CACHED_HOSTS: Final = 256  # a client sends the same Host on every request; ipaddress takes ~1.3 us to parse one


@functools.lru_cache(maxsize=CACHED_HOSTS)
def local_host(host: str) -> bool:
    """Whether a ``Host`` header's value (``name[:port]``) is an IPv4 literal, a bracketed IPv6 literal or
    ``localhost``, with an optional port."""
    if host.startswith("["):
        literal, bracket, port = host[1:].partition("]")
        if not bracket or not _port(port):
            return False
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            return False
        return True
    name, colon, port = host.partition(":")
    if not _port(colon + port):
        return False
    if name.lower() == LOCAL_NAME:
        return True
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


def misdirected(host: str | None) -> bool:
    """The Host rule, for a listener with auth off: a ``Host`` (the first, when there are several) that names this
    machine some other way than ``local_host`` -- a rebound name. No ``Host`` at all is no browser's request."""
    return host is not None and not local_host(host)


def misdirected_text(listener: str) -> str:
    """What a refused request is told (``listener``: "the API", "this endpoint")."""
    return (f"with auth off {listener} answers only a Host that is an IP address or localhost (DNS rebinding): use "
            "one, or turn auth on")


def same_origin(origin: str, host: str) -> bool:
    """Whether an ``Origin`` header's value is ``http(s)://`` followed by exactly the request's ``Host``."""
    scheme, separator, authority = origin.strip().partition("://")
    if not separator or scheme.lower() not in ("http", "https") or not authority:
        return False
    return authority.lower() == host.strip().lower()


def _port(part: str) -> bool:
    """``""`` (no port) or ``:`` and one to five digits."""
    if not part:
        return True
    digits = part[1:]
    return part[0] == ":" and len(digits) <= MAX_PORT_DIGITS and digits.isascii() and digits.isdigit()
