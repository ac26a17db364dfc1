"""Frames of the user engine, sans-IO: bytes in, frame bodies and server messages out; login frames out.

Theory of operation
-------------------
A frame is a 4-byte big-endian length N and N bytes of msgpack (`idled.protocol.codec`). The engine keeps no
decoder per connection: a connection that has nothing pending costs nothing here. When bytes arrive it
calls ``cut_frames(pending + data, max_frame)``, which returns the complete bodies and the incomplete tail
(``b""`` when none); only a non-empty tail is stored (one ``bytes`` per connection, and only while a frame
is split across reads). The length is checked against `max_frame` as soon as its 4 bytes are in, before
anything is buffered, so a tail is never longer than ``max_frame + 4``. Worked by hand::

    cut_frames(PONG_FRAME + b"\\x00\\x00", 4096) -> ([b"\\x81\\xa2op\\xa4pong"], b"\\x00\\x00")
    cut_frames(b"\\x00\\x00" + b"\\x00\\x05ab", 4096) -> ([], b"\\x00\\x00\\x00\\x05ab")     (2 of 5 body bytes)

`server_message(body)` is the protocol's own decoder (`decode_server_body`: msgpack, the frame rules, then
`parse_server_message`), with the pong recognised by comparing bytes first: the commonest frame by far
never reaches msgpack. Before any of this the engine compares a whole read with `PONG_FRAME` (one pong,
nothing pending): the hot path, which does not even call `cut_frames`.

Outbound, a login without a token is the same bytes for every uid but the uid: `login_templates` encodes one
`Login` per device around a placeholder uid (``2**63 - 1``, msgpack ``\\xcf`` + 8 bytes, unique in the frame)
and keeps the bytes before and after it; `login_frame` patches a uid in and prefixes the length -- the bytes
``encode(Login(...))`` gives, without a Login object or an encode per login.
"""

from __future__ import annotations

import struct
from typing import Final

import msgpack

from idled.protocol import (
    BYE_FRAME, PING_FRAME, PONG, PONG_FRAME, QUIET_FRAME, ErrorCode, Login, ProtocolError, ServerMessage, decode_server_body,
    encode,
)

__all__ = [
    "PONG_BODY", "WS_BYE", "WS_PING", "WS_PONG", "WS_QUIET", "cut_frames", "cut_ws_messages", "login_frame", "login_templates",
    "past_upgrade", "server_message", "ws_client_frame", "ws_upgrade",
]

PONG_BODY: Final = PONG_FRAME[4:]
_unpack_header = struct.Struct(">I").unpack_from


def cut_frames(data: bytes, max_frame: int) -> tuple[list[bytes], bytes]:
    """(complete frame bodies, incomplete tail) of `data`; ProtocolError(too_large) on an oversized length."""
    bodies: list[bytes] = []
    pos = 0
    size = len(data)
    while size - pos >= 4:
        n = _unpack_header(data, pos)[0]
        if n > max_frame:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"frame of {n} bytes exceeds the limit of {max_frame}")
        end = pos + 4 + n
        if end > size:
            break
        bodies.append(data[pos + 4 : end])
        pos = end
    return bodies, (data[pos:] if pos < size else b"")


def server_message(body: bytes) -> ServerMessage:
    """One frame body from the server -> its message (ProtocolError: bad_frame / bad_message)."""
    if body == PONG_BODY:
        return PONG
    return decode_server_body(body)


# ------------------------------------------------------------------------------------------ outbound: login frames

_UID_MARK: Final = 2**63 - 1  # a placeholder uid, msgpack "\xcf" + 8 bytes: unique in the frame
_FRAME_HEADER: Final = struct.Struct(">I")


def login_templates(keepalive: float | None, devices: int) -> list[tuple[bytes, bytes]]:
    """Per device ("d0".., or none when `devices` is 1): the login frame's body around the uid."""
    out = []
    for d in range(devices):
        body = encode(Login("uid", _UID_MARK, None, keepalive, device=f"d{d}" if devices > 1 else None))[4:]
        mark = b"\xcf" + _UID_MARK.to_bytes(8, "big")
        assert body.count(mark) == 1
        head, _, tail = body.partition(mark)
        out.append((head, tail))
    return out


def login_frame(template: tuple[bytes, bytes], uid: int) -> bytes:
    """The login frame of `uid` (an int uid) from its device's template: the same bytes `encode(Login(...))`
    gives."""
    head, tail = template
    body = head + msgpack.packb(uid) + tail
    return _FRAME_HEADER.pack(len(body)) + body


# ------------------------------------------------------------------------------ WebSocket (--websocket)
# The same frames as binary messages (docs/protocol.md#websocket). Client frames must be masked; the mask is
# fixed here (it guards browsers' proxies against cache poisoning, nothing a loopback load test meets), so a
# keepalive is one constant. The login goes right behind the upgrade request, in the same send: RFC 6455 4.1
# tells a client to wait for the 101 first (a browser does: one round trip more per login); idled keeps bytes
# that follow the request head, and the generator saves that round trip and a state.

WS_MASK: Final = b"\x5a\xa5\x3c\xc3"
WS_HEAD_END: Final = b"\r\n\r\n"


def ws_client_frame(body: bytes) -> bytes:
    """One masked binary message carrying ``body`` (a client's)."""
    n = len(body)
    head = bytes((0x82, 0x80 | n)) if n < 126 else bytes((0x82, 0xFE)) + struct.pack(">H", n)
    key = (WS_MASK * (n // 4 + 1))[:n]
    masked = (int.from_bytes(body, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big") if n else b""
    return head + WS_MASK + masked


def ws_upgrade(host: str, port: int) -> bytes:
    """The upgrade request (no Origin: not a browser; the subprotocol offered)."""
    return (f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: aWRsZWQgbG9hZHRlc3QgIQ==\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: idled.v1\r\n\r\n").encode()


WS_PING: Final = ws_client_frame(PING_FRAME[4:])
WS_BYE: Final = ws_client_frame(BYE_FRAME[4:])
WS_QUIET: Final = ws_client_frame(QUIET_FRAME[4:])
WS_PONG: Final = bytes((0x82, len(PONG_BODY))) + PONG_BODY  # the server's (unmasked)


def cut_ws_messages(data: bytes, max_frame: int) -> tuple[list[bytes], bytes]:
    """(complete binary message bodies, incomplete tail) of the server's frames in ``data``, like `cut_frames`;
    a close frame ends the list (what follows it is dropped: the server closes), control frames are skipped."""
    bodies: list[bytes] = []
    pos, size = 0, len(data)
    while size - pos >= 2:
        opcode, n, at = data[pos] & 0x0F, data[pos + 1] & 0x7F, pos + 2
        if n == 126:
            if size - at < 2:
                break
            n, at = struct.unpack_from(">H", data, at)[0], at + 2
        elif n == 127:
            if size - at < 8:
                break
            n, at = struct.unpack_from(">Q", data, at)[0], at + 8
        if n > max_frame:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"message of {n} bytes exceeds the limit of {max_frame}")
        if at + n > size:
            break
        if opcode == 0x8:
            return bodies, b""
        if opcode == 0x2:
            bodies.append(data[at:at + n])
        pos = at + n
    return bodies, (data[pos:] if pos < size else b"")


def past_upgrade(data: bytes) -> bytes | None:
    """What follows the server's 101 answer in ``data`` (None: the head is not complete yet); ProtocolError if
    the upgrade was refused (or no head ends within 8 KiB)."""
    end = data.find(WS_HEAD_END)
    if end >= 0 and data.startswith(b"HTTP/1.1 101 "):
        return data[end + len(WS_HEAD_END):]
    if end < 0 and len(data) < 8192:
        return None
    raise ProtocolError(ErrorCode.BAD_FRAME, "upgrade refused: " + data[:40].decode("latin-1").split("\r")[0])
