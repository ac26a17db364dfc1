"""The codec: messages -> frame bytes (`encode`), and one frame body -> a message (`decode_*_body`).

Theory of operation
-------------------
Every frame, in both directions, is a 4-byte big-endian unsigned length N followed by N bytes of msgpack
that encode one map with string keys; its "op" names the message::

    00 00 00 09 | 81 a2 6f 70 a4 70 69 6e 67        {"op": "ping"}  (13 bytes on the wire)

`encode(msg)` returns the whole frame (prefix + msgpack). It trusts its input: encoding a message that
`parse_*` would reject is a caller bug. Constant frames are precomputed (`PING_FRAME`, `PONG_FRAME`, ...).

Decoding a body (`framing.FrameDecoder` cuts the stream into bodies) happens in three steps:

1. `msgpack.unpackb` -- never a streaming `Unpacker` per connection, which costs ~41 KiB each -- with the
   options below. Any failure is `bad_frame`: truncated, trailing bytes, reserved byte, invalid UTF-8,
   non-string map key, nesting beyond msgpack's 1024-level stack, and every ext type: `max_ext_len=0`
   makes unpackb refuse any ext with a payload *before* it would decode a timestamp (type -1) itself (it
   has no hook for that), and `ext_hook` refuses the payload-less rest.
2. Duplicate map keys are `bad_frame` at any depth (unpackb would silently keep the last value, so that
   `{"uid": "alice", "uid": "mallory"}` means whatever the last parser to read it decides). Checking every
   map with an `object_pairs_hook` costs ~0.35 us per map on every frame, so the check is split:
   - the top-level map: its header says how many entries it holds; fewer keys in the dict means a
     duplicate. One byte read for the usual fixmap.
   - nested maps: only re-decoded with the pairs hook (exactly) when they can survive validation --
     inside `msg` data on the server; inside `event` extras, `status` and ignored fields on clients --
     and whenever validation fails, so that a frame-level error always wins over `bad_message`.
   A `touch` of 1000 uids or a `login` holds no nested map: it pays only the header comparison.
3. `parse_client_message` / `parse_server_message` validate fields (`bad_message`).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgpack

from idled.protocol.messages import (
    Attach, Bye, ClientMessage, Detach, Ended, Error, ErrorCode, Event, Login, Mark, Marked, Message, Msg, Ping, Pong,
    ProtocolError, Query, ServerMessage, Status, Subscribe, Touch, Welcome,
)
from idled.protocol.messages import Replicate, Unwatch, Watch
from idled.protocol.parse import EVENT_KEYS, _short, parse_client_message, parse_server_message

__all__ = [
    "PING_FRAME", "BYE_FRAME", "PONG_FRAME", "QUIET_FRAME", "encode", "decode_client_body", "decode_server_body",
]

# -------------------------------------------------------------------------------------------- encoding

HEADER: Final = struct.Struct(">I")  # the length prefix
_pack_header = HEADER.pack
_unpack_header = HEADER.unpack_from
_packb = msgpack.packb


def _frame(obj: dict[str, Any]) -> bytes:
    body = _packb(obj)
    return _pack_header(len(body)) + body


PING_BODY: Final = _packb({"op": "ping"})
PONG_BODY: Final = _packb({"op": "pong"})
PING_FRAME: Final = _frame({"op": "ping"})
BYE_FRAME: Final = _frame({"op": "bye"})
PONG_FRAME: Final = _frame({"op": "pong"})
# The quiet keepalive: a msg without data -- activity that asks for no answer (protocol.md, "Keepalives").
QUIET_FRAME: Final = _frame({"op": "msg"})
def _encode_login(m: Login) -> bytes:
    d: dict[str, Any] = {"op": "login", m.role: m.name}
    if m.token is not None:
        d["token"] = m.token
    if m.keepalive is not None:
        d["keepalive"] = m.keepalive
    if m.ended:
        d["ended"] = True
    if m.marks:
        d["marks"] = True
    if m.device is not None:
        d["device"] = m.device
    return _frame(d)


def _encode_attach(m: Attach) -> bytes:
    d: dict[str, Any] = {"op": "attach", "uids": m.uids}
    if m.keepalive is not None:
        d["keepalive"] = m.keepalive
    return _frame(d)


def _encode_subscribe(m: Subscribe) -> bytes:
    d: dict[str, Any] = {"op": "subscribe"}
    if m.from_seq is not None:
        d["from"] = m.from_seq
    if m.durable:
        d["durable"] = True
    if m.uids is not None:
        d["uids"] = m.uids
    return _frame(d)


def _encode_status(m: Status) -> bytes:
    d: dict[str, Any] = {"op": "status", "online": dict(m.online)}
    if m.last_seen is not None:
        d["last_seen"] = dict(m.last_seen)
    if m.devices is not None:
        d["devices"] = dict(m.devices)
    return _frame(d)


def _encode_welcome(m: Welcome) -> bytes:
    d: dict[str, Any] = {"op": "welcome", m.role: m.name}
    if m.timeout is not None:
        d["timeout"] = m.timeout
    if m.max_frame is not None:
        d["max_frame"] = m.max_frame
    if m.tick is not None:
        d["tick"] = m.tick
    if m.max_timeout is not None:
        d["max_timeout"] = m.max_timeout
    if m.ages:
        d["ages"] = True
    return _frame(d)


def _encode_event(m: Event) -> bytes:
    d: dict[str, Any] = {
        "op": "event", "seq": m.seq, "kind": m.kind, "uid": m.uid, "ts": m.ts, "reason": m.reason,
        "last_seen": m.last_seen, "deadline": m.deadline,
    }
    if m.extra:
        clash = EVENT_KEYS.intersection(m.extra)
        if clash:
            raise ValueError(f"Event.extra must not redefine {sorted(clash)}")
        d.update(m.extra)
    return _frame(d)


_ENCODERS: Final[dict[type, Callable[[Any], bytes]]] = {
    Ping: lambda m: PING_FRAME,
    Bye: lambda m: BYE_FRAME,
    Pong: lambda m: PONG_FRAME,
    Login: _encode_login,
    Msg: lambda m: _frame({"op": "msg", "data": m.data}),
    Attach: _encode_attach,
    Touch: lambda m: _frame({"op": "touch", "uids": m.uids} if not m.ago
                            else {"op": "touch", "uids": m.uids, "ago": m.ago}),
    Detach: lambda m: _frame({"op": "detach", "uids": m.uids} if m.reason is None
                             else {"op": "detach", "uids": m.uids, "reason": m.reason}),
    Subscribe: _encode_subscribe,
    Query: lambda m: _frame({"op": "query", "uids": m.uids, "last_seen": True} if m.last_seen
                            else {"op": "query", "uids": m.uids}),
    Watch: lambda m: _frame({"op": "watch", "uids": m.uids}),
    Unwatch: lambda m: _frame({"op": "unwatch", "uids": m.uids}),
    Replicate: lambda m: _frame({"op": "replicate", "from": m.from_seq}),
    Welcome: _encode_welcome,
    Event: _encode_event,
    Status: _encode_status,
    Error: lambda m: _frame({"op": "error", "code": str(m.code), "reason": m.reason} if m.leader is None
                            else {"op": "error", "code": str(m.code), "reason": m.reason, "leader": m.leader}),
    Ended: lambda m: _frame({"op": "ended", "uids": m.uids, "reason": m.reason}),
    Mark: lambda m: _frame({"op": "mark", "t": m.t}),
    Marked: lambda m: _frame({"op": "marked", "t": m.t}),
}


def encode(msg: Message) -> bytes:
    """The complete frame (length prefix + msgpack body) for any message, either direction."""
    return _ENCODERS[type(msg)](msg)


# -------------------------------------------------------------------------------------------- decoding


class _ExtRejected(ValueError):
    pass


def _reject_ext(code: int, data: bytes) -> Any:
    raise _ExtRejected(code)


# raw=False: str is UTF-8 text (invalid UTF-8 fails); use_list=False: arrays become tuples (immutable, like
# the frozen messages that hold them); strict_map_key=True: map keys must be str/bin, whose hashes are
# randomised -- int or tuple keys would let a peer craft hash collisions (O(n^2) dict build). The other
# max_*_len limits default to len(body), so no header can make unpackb preallocate more than the frame
# (msgpack>=1.2.4). max_ext_len=0: see the module docstring.
_OPTIONS: Final[dict[str, Any]] = dict(raw=False, use_list=False, max_ext_len=0, ext_hook=_reject_ext)
_unpack_strict = functools.partial(msgpack.unpackb, strict_map_key=True, **_OPTIONS)
# Clients decode `status`, whose keys may be int uids; the server is trusted not to flood them.
_unpack_lenient = functools.partial(msgpack.unpackb, strict_map_key=False, **_OPTIONS)


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:  # name the first repeated key
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


# The exact check, used only where the cheap one cannot see (see the module docstring).
_PAIRS_UNPACKERS: Final[dict[Callable[..., Any], Callable[..., Any]]] = {
    unpack: functools.partial(unpack, object_pairs_hook=_unique_pairs) for unpack in (_unpack_strict, _unpack_lenient)
}


def _duplicate_key(body: bytes, unpack: Callable[..., Any]) -> ProtocolError | None:
    """bad_frame naming the first duplicate map key at any depth, if there is one."""
    try:
        _PAIRS_UNPACKERS[unpack](body)
    except _DuplicateKey as exc:
        return ProtocolError(ErrorCode.BAD_FRAME, f"duplicate map key {_short(exc.args[0])}")
    except Exception:  # the body decoded once already; never hide the caller's error behind another
        pass
    return None


def _top_level_duplicate(body: bytes, obj: dict[Any, Any], unpack: Callable[..., Any]) -> None:
    """Raise unless the top-level map holds as many keys as its header declared (map16 / map32 headers)."""
    first = body[0]
    if first <= 0x8F:  # fixmap
        declared = first - 0x80
    elif first == 0xDE:  # map16
        declared = body[1] << 8 | body[2]
    else:  # map32
        declared = _unpack_header(body, 1)[0]
    if len(obj) != declared:
        raise _duplicate_key(body, unpack) or ProtocolError(ErrorCode.BAD_FRAME, "duplicate map key")


def _first_ext_type(body: bytes) -> int:
    """The ext type that made unpackb fail: the first non-timestamp one, else -1 (a timestamp)."""
    try:
        msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=_reject_ext)
    except _ExtRejected as exc:
        return int(exc.args[0])
    except Exception:
        pass
    return -1


def _frame_error(exc: Exception, body: bytes) -> ProtocolError:
    """bad_frame with a short reason for why msgpack.unpackb rejected a body."""
    text = str(exc)
    if isinstance(exc, _ExtRejected):
        reason = f"msgpack ext types are not allowed (ext type {exc.args[0]})"
    elif "max_ext_len" in text or "timestamp" in text:
        reason = f"msgpack ext types are not allowed (ext type {_first_ext_type(body)})"
    elif isinstance(exc, msgpack.ExtraData):
        reason = "trailing bytes after the msgpack value"
    elif isinstance(exc, msgpack.StackError):
        reason = "msgpack nesting too deep"
    elif isinstance(exc, msgpack.FormatError):
        reason = "invalid msgpack (reserved type byte)"
    elif isinstance(exc, UnicodeDecodeError):
        reason = "string is not valid UTF-8"
    elif "incomplete input" in text:
        reason = "truncated msgpack value"
    elif isinstance(exc, TypeError):
        reason = "unhashable map key"
    elif "map key" in text:
        reason = "map keys must be strings"
    else:
        reason = f"undecodable msgpack: {text[:80]}"
    return ProtocolError(ErrorCode.BAD_FRAME, reason)


_CONTAINERS: Final = (dict, tuple)


def _holds_map(data: Any) -> bool:
    """Does `msg` data (already validated: at most MAX_DATA_DEPTH deep) contain a map?"""
    t = type(data)
    if t is dict:
        return True
    if t is tuple:
        for item in data:
            if _holds_map(item):
                return True
    return False


# `{"op": "msg", "data": ` as encoders that keep insertion order write it (fixmap header first), followed
# by the first byte of the data: a map or an array (which may hold maps).
_MSG_DATA_HEAD: Final = b"\xa2op\xa3msg\xa4data"
_CONTAINER_BYTES: Final = frozenset([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_unpack_strict_pairs: Final = _PAIRS_UNPACKERS[_unpack_strict]


def decode_client_body(body: bytes) -> ClientMessage:
    """One client -> server frame body -> its message; ProtocolError(bad_frame / bad_message) otherwise."""
    if len(body) > 13 and body[13] in _CONTAINER_BYTES and body.startswith(_MSG_DATA_HEAD, 1):
        # msg data that may hold maps: check every map as it is built, rather than decode twice
        try:
            obj = _unpack_strict_pairs(body)
        except _DuplicateKey as exc:
            raise ProtocolError(ErrorCode.BAD_FRAME, f"duplicate map key {_short(exc.args[0])}") from None
        except Exception as exc:
            raise _frame_error(exc, body) from None
        return parse_client_message(obj)
    try:
        obj = _unpack_strict(body)
    except Exception as exc:  # unpackb over untrusted bytes: any failure means a bad frame
        raise _frame_error(exc, body) from None
    if type(obj) is dict:
        # inlined for the usual fixmap (one byte read); _top_level_duplicate checks exactly
        first = body[0]
        if first > 0x8F or len(obj) != first - 0x80:
            _top_level_duplicate(body, obj, _unpack_strict)
    try:
        msg = parse_client_message(obj)
    except ProtocolError as exc:
        raise _duplicate_key(body, _unpack_strict) or exc from None
    # Validation lets a nested map through only inside msg data (here: a msg frame written in another order).
    if type(msg) is Msg and type(msg.data) in _CONTAINERS and _holds_map(msg.data):
        error = _duplicate_key(body, _unpack_strict)
        if error is not None:
            raise error
    return msg


def body_decoder(parse: Callable[[Any], Any], unpack: Callable[..., Any] = _unpack_strict) -> Callable[[bytes], Any]:
    """decode_*_body for any parse function: nested maps are checked exactly whenever a top-level value is
    a container, or the object is not a map at all (`parse` may accept anything)."""

    def decode(body: bytes) -> Any:
        try:
            obj = unpack(body)
        except Exception as exc:  # unpackb over untrusted bytes: any failure means a bad frame
            raise _frame_error(exc, body) from None
        is_map = type(obj) is dict
        if is_map:
            first = body[0]
            if first > 0x8F or len(obj) != first - 0x80:
                _top_level_duplicate(body, obj, unpack)
        try:
            msg = parse(obj)
        except ProtocolError as exc:
            raise _duplicate_key(body, unpack) or exc from None
        if not is_map:
            error = _duplicate_key(body, unpack)
            if error is not None:
                raise error
            return msg
        _check_nested(body, unpack, obj)
        return msg

    return decode


def _check_nested(body: bytes, unpack: Callable[..., Any], values: Mapping[Any, Any]) -> None:
    """If any of these values is a container, check the whole body for duplicate keys."""
    for value in values.values():
        t = type(value)
        if t is dict or t is tuple:
            error = _duplicate_key(body, unpack)
            if error is not None:
                raise error
            return


def decode_server_body(body: bytes) -> ServerMessage:
    """One server -> client frame body -> its message (lenient about unknown fields, strict about frames)."""
    try:
        obj = _unpack_lenient(body)
    except Exception as exc:  # unpackb over untrusted bytes: any failure means a bad frame
        raise _frame_error(exc, body) from None
    if type(obj) is dict:
        first = body[0]
        if first > 0x8F or len(obj) != first - 0x80:
            _top_level_duplicate(body, obj, _unpack_lenient)
    try:
        msg = parse_server_message(obj)
    except ProtocolError as exc:
        raise _duplicate_key(body, _unpack_lenient) or exc from None
    # Maps survive validation in `event` extras (the standard fields are checked scalars), in `status`, and
    # in any field a client ignores.
    if type(msg) is Event:
        if msg.extra is not None:
            _check_nested(body, _unpack_lenient, msg.extra)
    else:
        _check_nested(body, _unpack_lenient, obj)
    return msg
