"""Framing, sans-IO: one connection's inbound bytes -> frame bodies -> messages (`FrameDecoder`).

Theory of operation
-------------------
A frame is a 4-byte big-endian length N and N bytes of msgpack body (see `codec`). `FrameDecoder` owns one
connection's inbound bytes. `receive_data(chunk)` stores the chunk (no copy when nothing is pending: the
decoder keeps a reference to the caller's `bytes` and a read offset), and each `next_event()` call returns
the next message, or `NEED_DATA` when no complete frame is buffered:

1. fewer than 4 bytes pending -> NEED_DATA;
2. read N; if N > max_frame raise `too_large` at once, so an oversized body is never retained;
3. fewer than N bytes of body pending -> NEED_DATA (only the partial frame, at most max_frame + 4 bytes, is
   kept, copied out of the chunk it arrived in; later chunks append to a bytearray in amortised O(1));
4. take the body, advance the offset (frames in one big chunk are consumed in place: no O(n^2) copying), and
   - if the body is the canonical ping (pong, in clients), return the shared `PING` (`PONG`) without
     calling msgpack at all: the hot path,
   - else hand it to the codec's body decoder (`decode_client_body` on the server, `decode_server_body` in
     clients), which unpacks it, enforces the frame-level rules and validates every field.

When everything is consumed the buffer is reset to the shared empty `b""`, so an idle decoder is five slots
(~80 bytes) and holds no buffer memory. Any error raises `ProtocolError(code, reason)` from `next_event()`
only, and the decoder then stays failed: the buffer is dropped, further data is ignored, and every later
`next_event()` raises the same code. The connection is to be closed (after sending an `error` frame).

Error codes: `bad_frame` -- the body is not exactly one msgpack value of the accepted subset (empty,
truncated, trailing bytes, invalid UTF-8, ext types, nesting deeper than msgpack's 1024-level stack,
non-string map keys, duplicate map keys); `too_large` -- the length prefix exceeds max_frame; `bad_message`
-- well-formed msgpack that is not a valid message (not a map, missing/unknown op, unknown field, field of
the wrong type or range).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final, NoReturn, TypeAlias

from idled.protocol.codec import (
    HEADER, PING_FRAME, PONG_FRAME, QUIET_FRAME, body_decoder, decode_client_body, decode_server_body,
)
from idled.protocol.messages import (
    DEFAULT_MAX_FRAME, MAX_FRAME_LIMIT, NEED_DATA, PING, PONG, QUIET, ErrorCode, NeedData, ProtocolError,
)
from idled.protocol.parse import parse_client_message, parse_server_message

__all__ = ["FrameDecoder", "KEEPALIVE_FRAMES"]

Parse: TypeAlias = Callable[[Any], Any]
_unpack_header = HEADER.unpack_from

# A client's keepalives, frame -> message: ping and the quiet keepalive. Recognised by one dict lookup of their
# bytes, without calling msgpack at all (here, and by the user plane on a read that is one of them).
KEEPALIVE_FRAMES: Final = {PING_FRAME: PING, QUIET_FRAME: QUIET}


def _profile(frames: dict[bytes, Any], decode: Callable[[bytes], Any]) -> tuple[Any, ...]:
    """(canonical frames -> messages, their bodies -> messages, body decoder)."""
    return frames, {frame[4:]: message for frame, message in frames.items()}, decode


# parse function -> its profile: the keepalives of each direction (a client's, a server's pong) by their bytes
_PROFILES: Final[dict[Parse, tuple[Any, ...]]] = {
    parse_client_message: _profile(KEEPALIVE_FRAMES, decode_client_body),
    parse_server_message: _profile({PONG_FRAME: PONG}, decode_server_body),
}


@functools.lru_cache(maxsize=32)
def _profile_for(parse: Parse) -> tuple[Any, ...]:
    """A custom parse function gets no fast path; its decoder is built once, not per connection."""
    return _profile({}, body_decoder(parse))


class FrameDecoder:
    """One connection's inbound frames: `receive_data(bytes)`, then `next_event()` until `NEED_DATA`.

    Call `next_event()` until it returns NEED_DATA before the next `receive_data()`: then the decoder never
    retains more than one partial frame (<= max_frame + 4 bytes). `max_frame` may be changed at any time
    (e.g. raised after a gateway logs in); it applies to every header not yet consumed.
    """

    __slots__ = ("_buf", "_pos", "_max_frame", "_profile", "_failed")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, parse: Parse = parse_client_message) -> None:
        # Unconsumed bytes are _buf[_pos:]. Idle: _buf is the shared b"" and _pos 0. _buf is the caller's
        # bytes while frames are consumed in place, or a private bytearray while a partial frame grows.
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self.max_frame = max_frame
        # One shared tuple instead of four slots: 8 bytes per connection, one attribute load per frame.
        self._profile = _PROFILES.get(parse) or _profile_for(parse)
        self._failed: tuple[ErrorCode, str] | None = None

    @property
    def max_frame(self) -> int:
        return self._max_frame

    @max_frame.setter
    def max_frame(self, value: int) -> None:
        if type(value) is not int or not 0 < value <= MAX_FRAME_LIMIT:
            raise ValueError(f"max_frame must be an int in 1..{MAX_FRAME_LIMIT}, got {value!r}")
        self._max_frame = value

    @property
    def failed(self) -> bool:
        """True once a ProtocolError was raised: the connection must be closed."""
        return self._failed is not None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed."""
        return len(self._buf) - self._pos

    def unconsumed(self) -> bytes:
        """A copy of the bytes received but not yet consumed (a relay forwards them after the login frame)."""
        return bytes(memoryview(self._buf)[self._pos:])

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes from the peer. Never raises; after a failure the bytes are dropped."""
        if self._failed is not None or not data:
            return
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse its buffer
        buf = self._buf
        if not buf:
            self._buf = data  # no copy: frames are consumed in place by advancing _pos
            return
        if isinstance(buf, bytearray):  # (not `type(buf) is bytes`: mypy narrows only this way round)
            if self._pos:
                del buf[: self._pos]
        else:
            buf = bytearray(memoryview(buf)[self._pos:])
            self._buf = buf
        self._pos = 0
        buf += data

    def next_event(self) -> Any:
        """The next message, or NEED_DATA. Raises ProtocolError (then stays failed)."""
        if self._failed is not None:
            raise ProtocolError(*self._failed)
        buf = self._buf
        if not buf:  # idle (then _pos is 0 too): the second call after every packet
            return NEED_DATA
        pos = self._pos
        fast_frames, fast_bodies, decode = self._profile
        # A lone keepalive (or pong): the commonest packet of all. (A bytearray -- a frame that arrived in
        # pieces -- is not hashable: it takes the slow path, which gives the same message.)
        if pos == 0 and type(buf) is bytes and (message := fast_frames.get(buf)) is not None:
            self._buf = b""
            return message
        size = len(buf)
        if size - pos < 4:
            return self._need_data(buf, pos)
        n = _unpack_header(buf, pos)[0]
        if n > self._max_frame:
            self._fail(ErrorCode.TOO_LARGE, f"frame of {n} bytes exceeds the limit of {self._max_frame}")
        end = pos + 4 + n
        if end > size:
            return self._need_data(buf, pos)
        body = buf[pos + 4 : end]
        if end == size:
            self._buf = b""
            self._pos = 0
        else:
            self._pos = end
        if type(body) is bytes and (message := fast_bodies.get(body)) is not None:
            return message
        if not n:
            self._fail(ErrorCode.BAD_FRAME, "empty frame")
        try:
            return decode(body)
        except ProtocolError as exc:
            self._fail(exc.code, exc.reason)

    def _need_data(self, buf: bytes | bytearray, pos: int) -> NeedData:
        # Keep only the partial frame, not the whole chunk it arrived in.
        if pos:
            if isinstance(buf, bytearray):
                del buf[:pos]
            else:
                self._buf = buf[pos:]
            self._pos = 0
        return NEED_DATA

    def _fail(self, code: ErrorCode, reason: str) -> NoReturn:
        self._failed = (code, reason)
        self._buf = b""
        self._pos = 0
        raise ProtocolError(code, reason)
