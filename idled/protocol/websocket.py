"""WebSocket framing (RFC 6455), sans-IO and lean: client frames in -> idled messages out; idled frames -> messages.

Theory of operation
-------------------
Over WebSocket the contract is TCP's with another envelope: one msgpack map per *binary message* instead of
one per length-prefixed frame. The handshake (HTTP/1.1 Upgrade) is wsproto's (``idled.door.websocket``); what
follows it, on the per-packet path of every WebSocket user, is this module, not wsproto's ``Connection``:
measured here (``tests/protocol/bench_websocket.py``), wsproto spends ~8.9 us and ~1.8 KiB per connection on
a keepalive message where this decoder spends ~0.8 us and ~0.2 KiB (TCP's ``FrameDecoder``: 0.15 us, 81 bytes)
-- against a whole keepalive's ~23 us of server CPU on TCP, wsproto alone would cost WebSocket ~40 % more, and
its per-connection state more than idled's whole ~1 KiB per connection.

``WsDecoder`` has ``FrameDecoder``'s interface (``receive_data``, ``next_event``, ``buffered``, ``max_frame``,
``failed``), so the doorway, the roles and the user plane read WebSocket connections with the code they read
TCP with. Inside, it cuts client frames: ``FIN|RSV|opcode``, ``MASK|len7`` (126: 16-bit, 127: 64-bit length),
the 4-byte mask, the payload. Each complete data message (binary; fragments reassembled) is handed, with a
4-byte length prefix, to an inner ``FrameDecoder`` -- which validates the msgpack exactly as on TCP and
recognises the canonical ``ping`` without msgpack. The commonest packet, one small unfragmented binary frame
arriving alone, takes a fast path: one integer XOR unmasks it.

* **Limits.** A data frame or message longer than ``max_frame`` is ``too_large`` at its header, before any of
  it is kept; a control frame's payload is at most 125 bytes (RFC 6455 5.5). So a connection holds at most
  one partial frame and one partial message: ~2 x ``max_frame`` (the login's ``MAX_LOGIN_FRAME`` before auth).
* **Control frames.** A ``ping`` is answered: the ``pong`` frame with its payload is appended to ``replies``
  (bytes the owner sends before it next reads; bounded: a peer that floods pings without reading stops being
  answered past ``MAX_REPLIES``). With ``report_pings`` (a user: a control ping is activity), a batch holding
  one yields the ``ACTIVITY`` sentinel from ``next_event``, which the user role counts and does not answer. A
  ``pong`` is ignored. A ``close`` ends the input: ``closed`` holds its code, the echo is in ``replies``, and
  ``next_event`` returns ``NEED_DATA`` with nothing ``buffered`` (a clean end, like TCP's EOF).
* **Errors** (raised by ``next_event`` only, after the messages decoded before them; the decoder then stays
  failed): a text message, RSV bits, an unknown opcode, an unmasked frame, a fragmented control frame, a
  continuation with nothing to continue, a new message inside a fragmented one: ``bad_frame``; sizes:
  ``too_large``; then whatever the inner decoder says of the msgpack.

Outbound (server -> client, never masked): ``message(body)`` one binary message; ``wrap(frames)`` the idled
frames ``encode`` produced, each as a message; ``close_frame(code, reason)``. An error frame is followed by a
close whose reason is the error code and whose status is RFC 6455's where it has one (``close_code``).

Worked example: a browser's keepalive ``82 89 m0 m1 m2 m3`` + the 9 bytes of ``{"op": "ping"}`` XOR the mask:
FIN + binary, masked, length 9, 15 bytes in all: the fast path unmasks it to ``81 a2 6f 70 a4 70 69 6e 67``
and gives the inner decoder ``00 00 00 09`` + that: the canonical ping frame, ``PING``.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgpack

from idled.protocol.codec import HEADER
from idled.protocol.framing import FrameDecoder
from idled.protocol.messages import DEFAULT_MAX_FRAME, NEED_DATA, ErrorCode, ProtocolError

__all__ = [
    "ACTIVITY", "CLOSE_CODES", "MAX_CONTROL", "MAX_REPLIES", "SUBPROTOCOL", "WsDecoder", "close_code",
    "close_frame", "error_of", "message", "wrap",
]

SUBPROTOCOL: Final = "idled.v1"  # Sec-WebSocket-Protocol (optional: a client offering none is served too)
MAX_CONTROL: Final = 125  # RFC 6455 5.5: a control frame's payload
MAX_REPLIES: Final = 4096  # bytes of pongs/close echo owed to a peer that does not read: beyond, no more answers
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
# idled error code -> RFC 6455 close status (7.4.1); every other error closes with 4000 (private use).
CLOSE_CODES: Final = {ErrorCode.TOO_LARGE: 1009, ErrorCode.BAD_FRAME: 1002, ErrorCode.SERVER_SHUTDOWN: 1001}
APPLICATION_CLOSE: Final = 4000
NORMAL_CLOSE: Final = 1000
_CODES: Final = frozenset(code.value for code in ErrorCode)
_ERROR_HEAD: Final = b"\xa2op\xa5error"  # an encoded error map: its op comes first (codec._frame)
_pack_header = HEADER.pack
_unpack_header = HEADER.unpack_from
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_from_bytes = int.from_bytes


class _Activity:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ACTIVITY"


ACTIVITY: Final = _Activity()  # a control ping arrived (report_pings): activity, nothing to answer in msgpack


def _unmask(payload: bytes | bytearray | memoryview, mask: bytes | bytearray | memoryview) -> bytes:
    n = len(payload)
    if not n:
        return b""
    key = (bytes(mask) * (n // 4 + 1))[:n]
    return (_from_bytes(payload, "big") ^ _from_bytes(key, "big")).to_bytes(n, "big")


class WsDecoder(FrameDecoder):
    """One WebSocket connection's inbound frames after the handshake (see the module docstring). A
    ``FrameDecoder`` to whoever reads it (the receive loop, the roles, the user plane); none of the parent's
    state is used."""

    __slots__ = ("_raw", "_inner", "_max", "_frag", "_error", "replies", "closed", "report_pings", "_pinged")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:  # (not the parent's: its state is unused)
        self._raw: bytes | bytearray = b""  # raw bytes of an incomplete frame
        self._inner = FrameDecoder(max_frame)
        self._max = max_frame
        self._frag: bytearray | None = None  # a fragmented binary message being reassembled
        self._error: ProtocolError | None = None
        self.replies = b""  # pongs and the close echo, for the owner to send
        self.closed: int | None = None  # the peer's close status (1005: none given) once it closed
        self.report_pings = False
        self._pinged = False

    @property
    def max_frame(self) -> int:
        return self._max

    @max_frame.setter
    def max_frame(self, value: int) -> None:
        self._inner.max_frame = value  # (validates it)
        self._max = value

    def unconsumed(self) -> bytes:
        """The messages received and not yet taken, as idled frames (``take_frames``, without the error)."""
        return self._inner.unconsumed()

    @property
    def failed(self) -> bool:
        return self._error is not None or self._inner.failed

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed: partial frames, a partial message, messages not yet taken."""
        return len(self._raw) + (len(self._frag) if self._frag is not None else 0) + self._inner.buffered

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Cut ``data`` into frames; never raises (an error is raised by ``next_event``)."""
        if self._error is not None or self.closed is not None or not data:
            return
        if type(data) is not bytes:
            data = bytes(data)
        if not self._raw and self._frag is None and len(data) >= 6 and data[0] == 0x82:
            n = data[1] ^ 0x80  # masked (0x80 set), length below 126: the keepalive's shape
            if n < 126 and len(data) == 6 + n and n <= self._max:
                self._inner.receive_data(_pack_header(n) + _unmask(data[6:], data[2:6]))
                return
        # A partial frame is one bytearray, appended to in place: re-concatenating it per read made a large
        # frame's reassembly quadratic in its pieces (a gateway's 1 MiB in 100-byte reads: ~80 ms, TCP ~2).
        raw = self._raw
        if raw:
            if type(raw) is not bytearray:
                raw = self._raw = bytearray(raw)
            raw += data
            buf: bytes | bytearray = raw
        else:
            buf = data
        try:
            pos = self._frames(buf)
        except ProtocolError as exc:
            self._error = exc
            self._raw = b""
            self._frag = None
            return
        if pos >= len(buf) or self.closed is not None:
            self._raw = b""
        elif isinstance(buf, bytearray):  # (the held frame: trim what was consumed, in place)
            if pos:
                del buf[:pos]
        else:
            self._raw = buf[pos:]  # (the rest of this read: one copy, appended to in place from the next)

    def _frames(self, buf: bytes | bytearray) -> int:
        """Consume every complete frame of ``buf``; return where the rest (an incomplete frame) begins."""
        pos, size = 0, len(buf)
        while self.closed is None:
            if size - pos < 2:
                break
            b0, b1 = buf[pos], buf[pos + 1]
            opcode, length, at = b0 & 0x0F, b1 & 0x7F, pos + 2
            if b0 & 0x70:
                raise ProtocolError(ErrorCode.BAD_FRAME, "websocket: RSV bits set (no extension was negotiated)")
            if not b1 & 0x80:
                raise ProtocolError(ErrorCode.BAD_FRAME, "websocket: a client frame must be masked")
            control = opcode >= OP_CLOSE
            if length == 126:
                if size - at < 2:
                    break
                length, at = _U16.unpack_from(buf, at)[0], at + 2
            elif length == 127:
                if size - at < 8:
                    break
                length, at = _U64.unpack_from(buf, at)[0], at + 8
            if control and (length > MAX_CONTROL or not b0 & 0x80):
                raise ProtocolError(ErrorCode.BAD_FRAME, "websocket: a control frame must be whole and at most 125 bytes")
            held = len(self._frag) if self._frag is not None and not control else 0
            if held + length > self._max:
                raise ProtocolError(ErrorCode.TOO_LARGE, f"message of {held + length} bytes or more exceeds the limit "
                                    f"of {self._max}")
            end = at + 4 + length
            if end > size:
                break
            payload = _unmask(memoryview(buf)[at + 4:end], memoryview(buf)[at:at + 4])
            pos = end
            if control:
                self._control(opcode, payload)
            else:
                self._data(opcode, bool(b0 & 0x80), payload)
        return pos

    def _data(self, opcode: int, fin: bool, payload: bytes) -> None:
        if opcode == OP_CONT:
            if self._frag is None:
                raise ProtocolError(ErrorCode.BAD_FRAME, "websocket: a continuation frame with no message to continue")
            self._frag += payload
            if fin:
                payload, self._frag = bytes(self._frag), None
                self._inner.receive_data(_pack_header(len(payload)) + payload)
            return
        if self._frag is not None:
            raise ProtocolError(ErrorCode.BAD_FRAME, "websocket: a new message inside a fragmented one")
        if opcode == OP_TEXT:
            raise ProtocolError(ErrorCode.BAD_FRAME, "websocket: text message: send one msgpack map per binary message")
        if opcode != OP_BINARY:
            raise ProtocolError(ErrorCode.BAD_FRAME, f"websocket: unknown opcode {opcode}")
        if fin:
            self._inner.receive_data(_pack_header(len(payload)) + payload)
        else:
            self._frag = bytearray(payload)

    def _control(self, opcode: int, payload: bytes) -> None:
        if opcode == OP_PING:
            self._pinged = True
            if len(self.replies) < MAX_REPLIES:
                self.replies += _header(OP_PONG, len(payload)) + payload
        elif opcode == OP_CLOSE:
            code = _U16.unpack_from(payload)[0] if len(payload) >= 2 else 1005
            self.closed = code
            self.replies += close_frame(_close_answer(payload))
        elif opcode != OP_PONG:
            raise ProtocolError(ErrorCode.BAD_FRAME, f"websocket: unknown opcode {opcode}")

    def next_event(self) -> Any:
        """The next message (``ACTIVITY`` for control pings, with ``report_pings``), or NEED_DATA; raises
        ProtocolError once the frames before the error are taken."""
        event = self._inner.next_event()
        if event is not NEED_DATA:
            return event
        if self._pinged:
            self._pinged = False
            if self.report_pings:
                return ACTIVITY
        if self._error is not None:
            raise self._error
        return NEED_DATA

    def take_frames(self) -> bytes:
        """The messages decoded so far as idled frames, undecoded (a relay passes them on to the core, which
        validates them); raises the WebSocket error if there was one."""
        frames = self._inner.unconsumed()
        if frames:
            self._inner = FrameDecoder(self._max)
        if self._error is not None:
            raise self._error
        return frames

    def take_replies(self) -> bytes:
        """The control replies owed (and forget them)."""
        replies, self.replies = self.replies, b""
        return replies


def _header(opcode: int, n: int) -> bytes:
    if n < 126:
        return bytes((0x80 | opcode, n))
    if n < 0x10000:
        return bytes((0x80 | opcode, 126)) + _U16.pack(n)
    return bytes((0x80 | opcode, 127)) + _U64.pack(n)


def message(body: bytes) -> bytes:
    """One binary message (server side: unmasked) carrying ``body``."""
    return _header(OP_BINARY, len(body)) + body


def wrap(frames: bytes | bytearray | memoryview) -> tuple[bytes, bytes]:
    """Idled frames (4-byte prefix + body, as ``encode`` makes them), each as one binary message; and what
    is left of a frame cut short (a relay's chunk of the core's stream: prepended to the next one)."""
    view = memoryview(frames)
    out = bytearray()
    pos, size = 0, len(view)
    while size - pos >= 4:
        n = _unpack_header(view, pos)[0]
        if pos + 4 + n > size:
            break
        out += _header(OP_BINARY, n)
        out += view[pos + 4:pos + 4 + n]
        pos += 4 + n
    return bytes(out), bytes(view[pos:])


def error_of(frames: bytes | bytearray) -> str | None:
    """The code of the last error frame among ``frames`` (idled frames), or None: what the close will carry.
    Only a frame whose body begins like an error map is unpacked (an observer's batches of events are not)."""
    found = None
    pos, size, mark = 0, len(frames), len(_ERROR_HEAD)
    while pos + 4 <= size:
        n = _unpack_header(frames, pos)[0]
        if frames[pos + 5:pos + 5 + mark] == _ERROR_HEAD:
            try:
                code = msgpack.unpackb(bytes(frames[pos + 4:pos + 4 + n])).get("code")
            except Exception:  # (our own encoding: cannot fail, but a close must still be sent)
                code = None
            found = code if isinstance(code, str) else found
        pos += 4 + n
    return found


def _close_answer(payload: bytes) -> int | None:
    """The status that answers a peer's close (RFC 6455 5.5.1, 7.4, 8.1): none to a close without one; 1002 to
    one byte, or to a status that may not be sent (below 1000, the reserved 1004-1006 and 1015, 1016-2999, and
    above 4999); 1007 to a reason that is not UTF-8; else a normal close."""
    if not payload:
        return None
    if len(payload) == 1:
        return 1002
    code = _U16.unpack_from(payload)[0]
    if not (1000 <= code <= 1014 and code not in (1004, 1005, 1006) or 3000 <= code <= 4999):
        return 1002
    try:
        payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        return 1007
    return NORMAL_CLOSE


def close_code(code: str | None) -> int:
    """The close status for an idled error code (None: a normal close)."""
    if code is None:
        return NORMAL_CLOSE
    return CLOSE_CODES.get(ErrorCode(code), APPLICATION_CLOSE) if code in _CODES else APPLICATION_CLOSE


def close_frame(status: int | None, reason: str = "") -> bytes:
    """A close frame (server side); ``status`` None: one with no status (the answer to a close without one)."""
    if status is None:
        return _header(OP_CLOSE, 0)
    payload = _U16.pack(status) + reason.encode()[:MAX_CONTROL - 2]
    return _header(OP_CLOSE, len(payload)) + payload
