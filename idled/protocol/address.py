"""The one address grammar: how idled reads and writes where a process is (pure: text in, value out).

Theory of operation
-------------------
Every place an operator or a peer names a core, an edge's core, a standby's active, an advertised address, an
etcd endpoint or a metrics endpoint goes through `parse_address` (one) or `parse_addresses` (``A,B,...``), and
every place idled writes one goes through `format_address`, so that what one process prints another reads
back, and the same text means the same thing to every command. The forms::

    host:port          a host name or an IPv4 address, and a port     core-1.example.org:7878  127.0.0.1:7878
    [ipv6]:port        an IPv6 address goes in brackets               [::1]:7878  [fe80::1%eth0]:7878
    host  or  [ipv6]   where the caller has a default port            localhost  [::1]
    ipv6               without brackets, with a default port, only when it cannot be read as address:port
    unix:path          a unix socket, where the caller takes one      unix:/run/idled/core.sock

The rules, each refused with an `AddressError` (a ``ValueError``) naming the text and the forms expected:

* *Ports* are decimal ``1..65535``; ``0`` only for an address to listen on (``listen=True``: the kernel picks
  a free port), never for one to dial.
* *Host names*: dot-separated labels of ASCII letters, digits, ``-`` and ``_`` (1..63 characters, no ``-``
  at either end), 253 characters at most; ``_`` is not in RFC 1123 but is in names that resolve in practice
  (container and service names). A name whose last label is all digits must be an IPv4 address in dotted
  quads, so ``127.1``, ``2130706433`` and ``1.2.3.4.5`` -- which a resolver would read as some other address,
  or not at all -- are refused, as is a leading zero (``127.000.0.1``, octal to ``inet_aton``).
* *IPv6* with a port goes in brackets. ``::1:7878`` is refused: it is the address ``::1:7878`` as much as
  ``::1`` port 7878. A bare IPv6 address is taken with the default port only when no reading as
  ``address:port`` exists (``::1``, ``2001:db8::1``; not ``fe80::1:2``, whose last group could be a port).
  Brackets hold only IPv6 (a scope such as ``%eth0`` of letters, digits, ``_ . -``), never a name or IPv4.
* *unix:PATH*: a non-empty path without NUL, control characters or ``,`` (the list separator), of at most
  107 bytes (Linux's ``sun_path``). ``unix:`` always means a socket: a host called ``unix`` is named by its
  address or a longer name. Callers that dial only TCP refuse it.
* *Text*: surrounding whitespace is ignored; at most `MAX_ADDRESS_CHARS` characters (a host name or
  bracketed IPv6, a colon and a port fit), checked before anything else.
* *Lists*: comma-separated (or a sequence of addresses); an empty member is refused, duplicates are dropped
  keeping the first, and an empty list is refused.

IP literals are checked by ``ipaddress`` and kept as written (they are not rewritten in canonical form: the
text an operator gave is the one they see in messages). ``urllib.parse`` is not used: it takes ``a b:1``
as a host, has no ``unix:``, and reads ``::1:7878`` without complaint.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, TypeAlias, overload

__all__ = [
    "MAX_ADDRESS_CHARS", "MAX_UNIX_PATH_BYTES", "AddressError", "HostPort", "UnixPath", "Endpoint",
    "parse_port", "parse_address", "parse_addresses", "format_address", "format_addresses",
]

MAX_ADDRESS_CHARS: Final = 300  # a 253-character name, or a bracketed IPv6 with a scope, a colon, a port
MAX_UNIX_PATH_BYTES: Final = 107  # sun_path is 108 bytes on Linux, with its NUL
UNIX_PREFIX: Final = "unix:"

_LABEL: Final = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?", re.ASCII)
_PORT: Final = re.compile(r"[0-9]{1,5}", re.ASCII)
_SCOPE: Final = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


class AddressError(ValueError):
    """An address that does not parse. ``text``: what was given; ``problem``: what is wrong with it;
    ``expected``: the forms the caller takes. ``str()`` is one line naming all three."""

    def __init__(self, text: str, problem: str, expected: str, what: str = "address") -> None:
        self.text = text
        self.problem = problem
        self.expected = expected
        super().__init__(f"bad {what} {_shown(text)}: {problem} (expected {expected})")


class HostPort(NamedTuple):
    """A TCP address: a host name, an IPv4 address or an IPv6 address (no brackets), and a port. A tuple, so
    ``host, port = address`` and comparisons with plain ``(host, port)`` pairs work."""

    host: str
    port: int

    def __str__(self) -> str:
        return format_address(self)


@dataclass(frozen=True, slots=True)
class UnixPath:
    """A unix socket, by its path."""

    path: str

    def __str__(self) -> str:
        return format_address(self)


Endpoint: TypeAlias = HostPort | UnixPath


def format_address(address: tuple[str, int] | UnixPath) -> str:
    """``host:port``, ``[ipv6]:port`` or ``unix:path``: the text `parse_address` reads back as ``address``."""
    if isinstance(address, UnixPath):
        return UNIX_PREFIX + address.path
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def format_addresses(addresses: Iterable[tuple[str, int] | UnixPath], separator: str = ",") -> str:
    """``A,B,...``: the text `parse_addresses` reads back as ``addresses`` (``separator``: ", " for prose)."""
    return separator.join(map(format_address, addresses))


def parse_port(text: str, *, listen: bool = False) -> int:
    """A port number: ``1..65535``, or ``0..65535`` for an address to listen on. ValueError (`AddressError`)
    naming the text otherwise."""
    if not _PORT.fullmatch(text.strip()):
        raise AddressError(text, "not a port number", f"a number {_port_range(listen)}", "port")
    if not (0 if listen else 1) <= int(text) <= 65535:
        raise AddressError(text, "out of range", f"a number {_port_range(listen)}", "port")
    return int(text)


@overload
def parse_address(text: str, default_port: int | None = None, *, unix: Literal[False] = False,
                  listen: bool = False) -> HostPort: ...
@overload
def parse_address(text: str, default_port: int | None = None, *, unix: Literal[True],
                  listen: bool = False) -> Endpoint: ...
@overload
def parse_address(text: str, default_port: int | None = None, *, unix: bool,
                  listen: bool = False) -> Endpoint: ...
def parse_address(text: str, default_port: int | None = None, *, unix: bool = False,
                  listen: bool = False) -> Endpoint:
    """One address (see the module docstring). ``default_port``: the port of a bare host (None: a port is
    required); ``unix``: whether ``unix:PATH`` is taken; ``listen``: port 0 is allowed."""
    expected = _expected(default_port, unix)
    if len(text) > MAX_ADDRESS_CHARS:
        raise AddressError(text, f"longer than {MAX_ADDRESS_CHARS} characters", expected)
    given, text = text, text.strip()
    if text.startswith(UNIX_PREFIX):
        if not unix:
            raise AddressError(given, "a unix socket is not taken here", expected)
        return UnixPath(_unix_path(text[len(UNIX_PREFIX):], given, expected))
    if text.startswith("["):
        host, port_text = _bracketed(text, given, expected)
    elif text.count(":") > 1:
        return _bare_ipv6(text, given, default_port, expected)
    else:
        host, colon, rest = text.partition(":")
        port_text = rest if colon else None
        _check_name(host, given, expected)
    if port_text is None:
        if default_port is None:
            raise AddressError(given, "no port", expected)
        return HostPort(host, default_port)
    return HostPort(host, _port(port_text, given, expected, listen))


@overload
def parse_addresses(texts: str | Sequence[str], default_port: int | None = None, *,
                    unix: Literal[False] = False, listen: bool = False) -> tuple[HostPort, ...]: ...
@overload
def parse_addresses(texts: str | Sequence[str], default_port: int | None = None, *,
                    unix: Literal[True], listen: bool = False) -> tuple[Endpoint, ...]: ...
@overload
def parse_addresses(texts: str | Sequence[str], default_port: int | None = None, *,
                    unix: bool, listen: bool = False) -> tuple[Endpoint, ...]: ...
def parse_addresses(texts: str | Sequence[str], default_port: int | None = None, *, unix: bool = False,
                    listen: bool = False) -> tuple[Endpoint, ...]:
    """``A,B,...`` (or a sequence of single addresses) -> the addresses, in order, duplicates dropped (the
    first kept); each read as `parse_address` reads it. An empty member or an empty list is refused."""
    items = texts.split(",") if isinstance(texts, str) else list(texts)
    whole = texts if isinstance(texts, str) else ",".join(texts)
    found: dict[Endpoint, None] = {}
    for item in items:
        if not item.strip():
            raise AddressError(whole, "an empty member (a doubled or trailing ',')" if len(items) > 1
                               else "no address", _expected(default_port, unix) + ", comma-separated")
        found[parse_address(item, default_port, unix=unix, listen=listen)] = None
    if not found:
        raise AddressError(whole, "no address", _expected(default_port, unix) + ", comma-separated")
    return tuple(found)


# -- the pieces ---------------------------------------------------------------------------------------------


def _bracketed(text: str, given: str, expected: str) -> tuple[str, str | None]:
    """``[ipv6]`` or ``[ipv6]:port`` -> (the address, the port's text or None)."""
    host, bracket, tail = text[1:].partition("]")
    if not bracket:
        raise AddressError(given, "an IPv6 address without its closing ']'", expected)
    if tail and not tail.startswith(":"):
        raise AddressError(given, f"{tail!r} after ']' (only ':PORT' may follow)", expected)
    if not _is_ipv6(host):
        what = "an IPv4 address" if _is_ipv4(host) else repr(host)
        raise AddressError(given, f"brackets hold an IPv6 address, not {what}", expected)
    return host, (tail[1:] if tail else None)


def _bare_ipv6(text: str, given: str, default_port: int | None, expected: str) -> HostPort:
    """Two colons or more without brackets: an IPv6 address alone, with the default port, if nothing else."""
    prefix, _, last = text.rpartition(":")
    as_port = bool(_PORT.fullmatch(last)) and _is_ipv6(prefix)  # "::1:7878" could be [::1]:7878
    if as_port:
        alone = f" (or [{text}] for that address alone)" if default_port is not None and _is_ipv6(text) else ""
        raise AddressError(given, f"an IPv6 address with a port goes in brackets: write [{prefix}]:{last}{alone}",
                           expected)
    if not _is_ipv6(text):
        raise AddressError(given, f"{text!r} is not an IPv6 address (with a port: [IPV6]:PORT)", expected)
    if default_port is None:
        raise AddressError(given, f"no port: write [{text}]:PORT", expected)
    return HostPort(text, default_port)


def _check_name(host: str, given: str, expected: str) -> None:
    """A host name or an IPv4 address (see the module docstring)."""
    if not host:
        raise AddressError(given, "no host", expected)
    if host == "unix":
        raise AddressError(given, "a host called 'unix' (unix:... names a socket): give its address or a longer "
                           "name", expected)
    if len(host) > 253:
        raise AddressError(given, "a host name longer than 253 characters", expected)
    labels = host.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise AddressError(given, f"{host!r} is not a host name (letters, digits, '-' and '_' in dot-separated "
                           "labels) or an IP address", expected)
    if labels[-1].isdigit() and not _is_ipv4(host):
        raise AddressError(given, f"{host!r} is not an IPv4 address (four decimal numbers 0..255, no leading "
                           "zero) nor a host name (whose last label is not all digits)", expected)


def _port(text: str, given: str, expected: str, listen: bool) -> int:
    if not text:
        raise AddressError(given, "no port after ':'", expected)
    if not _PORT.fullmatch(text):
        raise AddressError(given, f"port {text!r} is not a number", expected)
    if not (0 if listen else 1) <= int(text) <= 65535:
        raise AddressError(given, f"port {text} is not in {_port_range(listen)}", expected)
    return int(text)


def _unix_path(path: str, given: str, expected: str) -> str:
    if not path:
        raise AddressError(given, "unix: with no path", expected)
    if _CONTROL.search(path) or "," in path:
        raise AddressError(given, "a unix socket path with a NUL, a control character or ','", expected)
    if len(path.encode("utf-8", "surrogateescape")) > MAX_UNIX_PATH_BYTES:
        raise AddressError(given, f"a unix socket path longer than {MAX_UNIX_PATH_BYTES} bytes", expected)
    return path


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _is_ipv6(text: str) -> bool:
    address, percent, scope = text.partition("%")
    if percent and not _SCOPE.fullmatch(scope):
        return False  # a scope that could hold ']' or ',' would not read back
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return True


def _port_range(listen: bool) -> str:
    return "0..65535" if listen else "1..65535"


def _expected(default_port: int | None, unix: bool) -> str:
    forms = "HOST:PORT or [IPV6]:PORT" if default_port is None else "HOST[:PORT] or [IPV6][:PORT]"
    if unix:
        forms = forms.replace(" or ", ", ") + " or unix:PATH"
    return forms if default_port is None else f"{forms}; port {default_port} if none is given"


def _shown(text: str) -> str:
    """The bad text in a message: quoted, and cut if long (a message stays one readable line)."""
    return repr(text) if len(text) <= 80 else repr(text[:80]) + f"... ({len(text)} characters)"
