"""MQTT 3.1.1, the client's side of a keepalive, sans-IO: bytes out, packets in (`idled loadtest --peer mqtt`).

Theory of operation
-------------------
The peer benchmark holds connections to an MQTT broker the way it holds them to idled: log in, send a
keepalive every K seconds, stop (the broker must disconnect a client silent for 1.5 x K, MQTT-3.1.2-24) or
say bye. That needs six packets of MQTT 3.1.1 (OASIS standard, 2014), all built or read here, no socket:

* ``CONNECT`` (client -> server): protocol name ``MQTT``, protocol level 4, connect flags with only *clean
  session* set, the keepalive as a 16-bit count of **whole seconds**, and the client identifier as the one
  payload field (`connect`);
* ``CONNACK`` (server -> client): two bytes, the session-present flag and a return code, 0 = accepted
  (`Connack`, read by `parse_packet`);
* ``PINGREQ`` / ``PINGRESP``: a fixed header and nothing else (`PINGREQ`, `PINGRESP`);
* ``DISCONNECT`` (client -> server): likewise (`DISCONNECT`); the server closes the connection;
* ``PUBLISH`` at QoS 0 (client -> server): the quiet keepalive (`publish`). Any control packet resets the
  broker's keepalive timer (MQTT-3.1.2-23), and a QoS 0 publication gets no answer: it is MQTT's counterpart
  of idled's quiet keepalive, a keepalive that asks for no reply (``--ask-one-in``).

Every packet starts with a fixed header: one byte (the packet type in the high nibble, flags in the low,
fixed per type for the packets above) and the *remaining length*, the bytes that follow, in a variable-length
encoding of 1 to 4 bytes, 7 bits each, least significant first, the high bit saying "another byte follows"
(MQTT-2.2.3). Worked by hand, from the standard's table 2.4::

    0 -> 00        127 -> 7F        128 -> 80 01        16,383 -> FF 7F        16,384 -> 80 80 01
    268,435,455 -> FF FF FF 7F (the largest; a fifth byte is a malformed packet)

`cut_packets(data, max_packet)` splits a byte string into whole packets and the incomplete tail, like the
wire protocol's `idled.tools.loadtest.frames.cut_frames`: the length is checked against ``max_packet`` as soon
as it is readable, before anything is buffered, so a tail never exceeds ``max_packet``. `parse_packet` checks
a server packet's fixed flags and, for a CONNACK, its length. `parse_connect` reads a CONNECT back (the tests
use it to check `connect` against the standard's layout). Bad bytes raise `MqttError`; the caller closes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CONNECT", "CONNACK", "PINGREQ_TYPE", "PINGRESP_TYPE", "DISCONNECT_TYPE", "PINGREQ", "PINGRESP", "DISCONNECT",
    "MAX_REMAINING_LENGTH", "MAX_KEEPALIVE", "MqttError", "Packet", "Connack", "Connect", "encode_remaining_length",
    "decode_remaining_length", "connect", "connack", "publish", "cut_packets", "parse_packet", "parse_connect",
]

# packet types (the high nibble of the first byte)
CONNECT: Final = 1
CONNACK: Final = 2
PUBLISH: Final = 3
PINGREQ_TYPE: Final = 12
PINGRESP_TYPE: Final = 13
DISCONNECT_TYPE: Final = 14

PINGREQ: Final = b"\xc0\x00"
PINGRESP: Final = b"\xd0\x00"
DISCONNECT: Final = b"\xe0\x00"

MAX_REMAINING_LENGTH: Final = 268_435_455  # four bytes of 7 bits
MAX_KEEPALIVE: Final = 65_535  # a 16-bit count of seconds
PROTOCOL_NAME: Final = b"\x00\x04MQTT"
PROTOCOL_LEVEL: Final = 4  # 3.1.1
CLEAN_SESSION: Final = 0x02
# The flags nibble each server packet must carry (MQTT-2.2.2-2): these are all 0.
_FIXED_FLAGS: Final = {CONNACK: 0, PINGRESP_TYPE: 0}
_KEEPALIVE = struct.Struct(">H")


class MqttError(ValueError):
    """Bytes that are not a well-formed packet of the kind expected (the connection is to be closed)."""


@dataclass(frozen=True, slots=True)
class Packet:
    """A server packet other than CONNACK: its type and flags nibbles and its body (after the fixed header)."""

    type: int
    flags: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Connack:
    session_present: bool
    return_code: int  # 0 accepted; 1-5 refused (version, identifier, unavailable, credentials, not authorized)


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    keepalive: int
    clean_session: bool
    flags: int


def encode_remaining_length(n: int) -> bytes:
    """The variable-length encoding of ``n`` (ValueError outside 0..268,435,455)."""
    if not 0 <= n <= MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {n} outside 0..{MAX_REMAINING_LENGTH}")
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def decode_remaining_length(data: bytes, pos: int = 1) -> tuple[int, int] | None:
    """(remaining length, offset of the first byte after it) read at ``data[pos:]``; None if the bytes end
    before it does; MqttError if a fourth byte still says "more"."""
    value = 0
    for k in range(4):
        if pos + k >= len(data):
            return None
        byte = data[pos + k]
        value |= (byte & 0x7F) << (7 * k)
        if not byte & 0x80:
            return value, pos + k + 1
    raise MqttError("malformed remaining length (more than four bytes)")


def connect(client_id: str, keepalive: int, *, clean_session: bool = True) -> bytes:
    """A CONNECT packet (3.1.1, level 4; no will, user name or password)."""
    if not 0 <= keepalive <= MAX_KEEPALIVE or int(keepalive) != keepalive:
        raise ValueError(f"an MQTT keepalive is a whole number of seconds in 0..{MAX_KEEPALIVE}, got {keepalive!r}")
    ident = client_id.encode("utf-8")
    if len(ident) > 65_535:
        raise ValueError("client identifier longer than 65,535 bytes")
    body = (PROTOCOL_NAME + bytes((PROTOCOL_LEVEL, CLEAN_SESSION if clean_session else 0))
            + _KEEPALIVE.pack(int(keepalive)) + _KEEPALIVE.pack(len(ident)) + ident)
    return bytes((CONNECT << 4,)) + encode_remaining_length(len(body)) + body


def connack(return_code: int = 0, session_present: bool = False) -> bytes:
    """A CONNACK packet (the server's; for tests and for comparing a read with the common answer)."""
    return bytes((CONNACK << 4, 2, 1 if session_present else 0, return_code))


def publish(topic: str, payload: bytes = b"") -> bytes:
    """A PUBLISH at QoS 0, not retained (flags 0): the topic as a UTF-8 string with its 2-byte length, then
    the payload; no packet identifier at QoS 0 (MQTT-3.3.2)."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + payload
    return bytes([PUBLISH << 4]) + encode_remaining_length(len(body)) + body


def cut_packets(data: bytes, max_packet: int) -> tuple[list[bytes], bytes]:
    """(whole packets, fixed header included; the incomplete tail) of ``data``. MqttError when a packet's
    length is malformed or its whole exceeds ``max_packet`` -- said as soon as the length is readable."""
    packets: list[bytes] = []
    pos, size = 0, len(data)
    while pos < size:
        head = decode_remaining_length(data, pos + 1)
        if head is None:  # (the length's bytes are not all in yet)
            break
        length, start = head
        end = start + length
        if end - pos > max_packet:
            raise MqttError(f"packet of {end - pos} bytes exceeds the limit of {max_packet}")
        if end > size:
            break
        packets.append(data[pos:end])
        pos = end
    return packets, data[pos:]


def parse_packet(packet: bytes) -> Connack | Packet:
    """One whole server packet (from `cut_packets`): a `Connack`, or the `Packet` of any other type.
    MqttError on flags a server packet of that type may not carry, or a CONNACK that is not 2 bytes of body."""
    head = decode_remaining_length(packet, 1)
    if head is None or head[1] + head[0] != len(packet):
        raise MqttError("not one whole packet")
    kind, flags = packet[0] >> 4, packet[0] & 0x0F
    body = packet[head[1]:]
    expected = _FIXED_FLAGS.get(kind)
    if expected is not None and flags != expected:
        raise MqttError(f"packet type {kind} with flags {flags:#x}")
    if kind == CONNACK:
        if len(body) != 2 or body[0] & 0xFE:
            raise MqttError("malformed CONNACK")
        return Connack(bool(body[0] & 1), body[1])
    if kind == PINGRESP_TYPE and body:
        raise MqttError("PINGRESP with a body")
    return Packet(kind, flags, body)


def parse_connect(packet: bytes) -> Connect:
    """A whole CONNECT packet read back (level 4 only; a will, user name or password is not read)."""
    head = decode_remaining_length(packet, 1)
    if packet[:1] != bytes((CONNECT << 4,)) or head is None or head[1] + head[0] != len(packet):
        raise MqttError("not one whole CONNECT packet")
    body = packet[head[1]:]
    if body[:6] != PROTOCOL_NAME or len(body) < 12 or body[6] != PROTOCOL_LEVEL:
        raise MqttError("not MQTT 3.1.1 (protocol name MQTT, level 4)")
    flags = body[7]
    keepalive = _KEEPALIVE.unpack_from(body, 8)[0]
    n = _KEEPALIVE.unpack_from(body, 10)[0]
    if len(body) < 12 + n:
        raise MqttError("client identifier cut short")
    return Connect(body[12:12 + n].decode("utf-8"), keepalive, bool(flags & CLEAN_SESSION), flags)
