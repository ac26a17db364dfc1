"""The PROXY protocol (HAProxy's, versions 1 and 2), sans-IO: bytes in, the original addresses out.

Theory of operation
-------------------
A load balancer that terminates the client's TCP (or TLS) connection opens its own connection to idled, so
idled's socket sees the balancer's address. With the PROXY protocol the balancer writes one header first,
before any byte of the client's, naming the client's address and port (and the address it connected to).
Spec: https://www.haproxy.org/download/2.8/doc/proxy-protocol.txt.

* **v1** is one text line: ``PROXY TCP4 203.0.113.7 192.0.2.1 56324 7878\\r\\n`` (or ``TCP6``, or
  ``PROXY UNKNOWN ...\\r\\n``), at most 107 bytes including the CRLF.
* **v2** is binary: the 12-byte signature ``\\r\\n\\r\\n\\0\\r\\nQUIT\\n``, a version/command byte (0x21 PROXY,
  0x20 LOCAL), a family/transport byte (0x11 TCP/IPv4, 0x21 TCP/IPv6, 0x31 unix, 0x00 unspecified), a
  big-endian 16-bit length, then the addresses (12, 36 or 216 bytes) and optional TLVs (ignored here).

``ProxyParser`` is fed bytes (``receive_data``) and asked for the header (``next_event``), which returns a
``ProxyHeader`` or ``NEED_DATA``, or raises ``ProxyError`` (a ``ProtocolError``, code ``bad_frame``).
``wanted`` says how many more bytes the caller may read *without reading past the header*: exact for v2 (so a
v2 header never leaves client bytes behind in the parser), a best effort for v1 (whose length is only known
at its CRLF); ``trailing`` holds whatever was read past the header, which belongs to the client's stream.

A header that says LOCAL (v2) or UNKNOWN (v1) carries no client address -- the balancer's own health check --
and ``ProxyHeader.source`` is None: the caller keeps the socket's address. A header longer than ``max_size``
(v2 headers with TLVs can be long; v1 is at most 107) is an error; a caller reading at most ``wanted`` bytes
at a time never buffers more than that.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

from idled.protocol.messages import NEED_DATA, ErrorCode, NeedData, ProtocolError

__all__ = [
    "MAX_V1", "DEFAULT_MAX_SIZE", "SIGNATURE_V2", "ProxyError", "ProxyHeader", "ProxyParser", "encode_v1", "encode_v2",
]

SIGNATURE_V2: Final = b"\r\n\r\n\x00\r\nQUIT\n"
MAX_V1: Final = 107  # the spec's limit, CRLF included
DEFAULT_MAX_SIZE: Final = 4096  # a v2 header with TLVs (HAProxy's send-proxy-v2-ssl adds a few hundred bytes)
_V2_FIXED: Final = 16  # signature, version/command, family, length
_ADDRESS_SIZES: Final = {0x1: 12, 0x2: 36, 0x3: 216}  # by family nibble: IPv4, IPv6, unix


class ProxyError(ProtocolError):
    """Not a valid PROXY header (or none where one is required)."""

    def __init__(self, reason: str) -> None:
        super().__init__(ErrorCode.BAD_FRAME, f"PROXY protocol: {reason}")


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """What the balancer said: ``source`` is the client's (host, port), None for LOCAL/UNKNOWN headers."""

    version: int
    source: tuple[str, int] | None
    destination: tuple[str, int] | None


class ProxyParser:
    """One connection's PROXY header (see the module docstring)."""

    __slots__ = ("max_size", "_buffer", "_header", "trailing")

    def __init__(self, max_size: int = DEFAULT_MAX_SIZE) -> None:
        if max_size < _V2_FIXED + 216:
            raise ValueError(f"max_size must be at least {_V2_FIXED + 216}")
        self.max_size = max_size
        self._buffer = bytearray()
        self._header: ProxyHeader | None = None
        self.trailing = b""  # bytes read past the header: the start of the client's own stream

    @property
    def wanted(self) -> int:
        """How many more bytes to read at most, so as not to read past the header (at least 1)."""
        buf = self._buffer
        if len(buf) < len(SIGNATURE_V2):
            # "PROXY UNKNOWN\r\n" (15 bytes) is the shortest v1 header: 12 can be read safely either way.
            return len(SIGNATURE_V2) - len(buf)
        if buf.startswith(SIGNATURE_V2):
            if len(buf) < _V2_FIXED:
                return _V2_FIXED - len(buf)
            return max(1, _V2_FIXED + struct.unpack_from(">H", buf, 14)[0] - len(buf))
        return max(1, MAX_V1 - len(buf))  # v1: only its CRLF ends it; whatever follows it is kept (trailing)

    def receive_data(self, data: bytes | bytearray) -> None:  # what trio.abc.ReceiveStream returns
        if self._header is not None:
            self.trailing += data
            return
        self._buffer += data  # bounded by the caller, who reads at most ``wanted`` (<= max_size) at a time

    def next_event(self) -> ProxyHeader | NeedData:
        if self._header is not None:
            return self._header
        buf = self._buffer
        probe = min(len(buf), len(SIGNATURE_V2))
        if buf[:probe] == SIGNATURE_V2[:probe]:
            header = self._v2()
        elif buf[: min(len(buf), 6)] == b"PROXY "[: min(len(buf), 6)]:
            header = self._v1()
        else:
            raise ProxyError(f"expected a PROXY header, got {bytes(buf[:16])!r}")
        if header is NEED_DATA:
            if len(buf) > self.max_size:
                raise ProxyError(f"no complete header in {len(buf)} bytes")
            return NEED_DATA
        assert isinstance(header, ProxyHeader)
        self._header = header
        return header

    # -- v2 ----------------------------------------------------------------------------------------------------

    def _v2(self) -> ProxyHeader | NeedData:
        buf = self._buffer
        if len(buf) < _V2_FIXED:
            return NEED_DATA
        version_command, family_transport, length = buf[12], buf[13], struct.unpack_from(">H", buf, 14)[0]
        if version_command >> 4 != 2:
            raise ProxyError(f"unsupported v2 version {version_command >> 4}")
        command = version_command & 0xF
        if command not in (0, 1):
            raise ProxyError(f"unknown v2 command {command}")
        if _V2_FIXED + length > self.max_size:
            raise ProxyError(f"v2 header of {_V2_FIXED + length} bytes is over the limit ({self.max_size})")
        end = _V2_FIXED + length
        if len(buf) < end:
            return NEED_DATA
        self.trailing = bytes(buf[end:])
        body = bytes(buf[_V2_FIXED:end])
        del buf[:]
        family, transport = family_transport >> 4, family_transport & 0xF
        if command == 0 or family == 0 or family == 0x3:
            return ProxyHeader(2, None, None)  # LOCAL (health check), unspecified or unix: no IP address to use
        if family not in _ADDRESS_SIZES or transport != 0x1:
            raise ProxyError(f"unsupported v2 family/transport 0x{family_transport:02x} (TCP over IPv4/IPv6 only)")
        size = _ADDRESS_SIZES[family]
        if length < size:
            raise ProxyError(f"v2 address block of {length} bytes, {size} needed")
        if family == 0x1:
            src, dst, sport, dport = struct.unpack_from(">4s4sHH", body)
            return ProxyHeader(2, (str(ipaddress.IPv4Address(src)), sport), (str(ipaddress.IPv4Address(dst)), dport))
        src, dst, sport, dport = struct.unpack_from(">16s16sHH", body)
        return ProxyHeader(2, (str(ipaddress.IPv6Address(src)), sport), (str(ipaddress.IPv6Address(dst)), dport))

    # -- v1 ----------------------------------------------------------------------------------------------------

    def _v1(self) -> ProxyHeader | NeedData:
        buf = self._buffer
        end = buf.find(b"\r\n", 0, MAX_V1)
        if end < 0:
            if len(buf) >= MAX_V1:
                raise ProxyError(f"v1 header longer than {MAX_V1} bytes")
            if b"\n" in buf or b"\r" in buf[:-1]:
                raise ProxyError("v1 header not ended by CRLF")
            return NEED_DATA
        try:
            line = bytes(buf[:end]).decode("ascii")
        except UnicodeDecodeError:
            raise ProxyError("v1 header is not ASCII") from None
        self.trailing = bytes(buf[end + 2:])
        del buf[:]
        parts = line.split(" ")
        if len(parts) >= 2 and parts[1] == "UNKNOWN":
            return ProxyHeader(1, None, None)
        if len(parts) != 6 or parts[1] not in ("TCP4", "TCP6"):
            raise ProxyError(f"malformed v1 header {line!r}")
        kind = ipaddress.IPv4Address if parts[1] == "TCP4" else ipaddress.IPv6Address
        try:
            src, dst = kind(parts[2]), kind(parts[3])
            sport, dport = _port(parts[4]), _port(parts[5])
        except ValueError:
            raise ProxyError(f"malformed v1 header {line!r}") from None
        return ProxyHeader(1, (str(src), sport), (str(dst), dport))


def _port(text: str) -> int:
    # The spec: decimal, no leading zeros or signs, 0..65535.
    if not text.isdigit() or (len(text) > 1 and text[0] == "0") or int(text) > 65535:
        raise ValueError(text)
    return int(text)


def encode_v1(source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    """A v1 header (what a balancer sends; clients and tests use it)."""
    kind = "TCP6" if ":" in source[0] else "TCP4"
    return f"PROXY {kind} {source[0]} {destination[0]} {source[1]} {destination[1]}\r\n".encode("ascii")


def encode_v2(source: tuple[str, int] | None, destination: tuple[str, int] | None = None) -> bytes:
    """A v2 header: PROXY over TCP for ``source`` (LOCAL when None)."""
    if source is None:
        return SIGNATURE_V2 + bytes([0x20, 0x00]) + struct.pack(">H", 0)
    destination = destination or (("::" if ":" in source[0] else "0.0.0.0"), 0)
    src, dst = ipaddress.ip_address(source[0]), ipaddress.ip_address(destination[0])
    family = 0x11 if src.version == 4 else 0x21
    body = src.packed + dst.packed + struct.pack(">HH", source[1], destination[1])
    return SIGNATURE_V2 + bytes([0x21, family]) + struct.pack(">H", len(body)) + body
