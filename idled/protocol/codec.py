"""Sans-IO wire codec: bytes in -> typed messages out, messages in -> bytes out.

Theory of operation
-------------------
Every frame, in both directions, is a 4-byte big-endian unsigned length N followed by N bytes of msgpack
that encode one map with string keys; its "op" names the message::

    00 00 00 09 | 81 a2 6f 70 a4 70 69 6e 67        {"op": "ping"}  (13 bytes on the wire)

`FrameDecoder` owns one connection's inbound bytes. `receive_data(chunk)` stores the chunk (no copy when
nothing is pending: the decoder keeps a reference to the caller's `bytes` and a read offset), and each
`next_event()` call returns the next message, or `NEED_DATA` when no complete frame is buffered:

1. fewer than 4 bytes pending -> NEED_DATA;
2. read N; if N > max_frame raise `too_large` at once, so an oversized body is never retained;
3. fewer than N bytes of body pending -> NEED_DATA (only the partial frame, at most max_frame + 4 bytes, is
   kept, copied out of the chunk it arrived in; later chunks append to a bytearray in amortised O(1));
4. take the body, advance the offset (frames in one big chunk are consumed in place: no O(n^2) copying), and
   - if the body is the canonical ping (pong, in clients), return the shared `PING` (`PONG`) without
     calling msgpack at all: the hot path,
   - else decode it with `msgpack.unpackb` -- never a streaming `Unpacker` per connection, which costs ~41 KiB
     each -- and hand the object to `parse` (`parse_client_message` on the server, `parse_server_message` in
     clients), which validates every field and builds a frozen slots dataclass.

When everything is consumed the buffer is reset to the shared empty `b""`, so an idle decoder is five slots
(~80 bytes) and holds no buffer memory. Any error raises `ProtocolError(code, reason)` from `next_event()`
only, and the decoder then stays failed: the buffer is dropped, further data is ignored, and every later
`next_event()` raises the same code. The connection is to be closed (after sending an `error` frame).

Error codes: `bad_frame` -- the body is not exactly one msgpack value of the accepted subset (truncated,
trailing bytes, invalid UTF-8, ext types, nesting deeper than msgpack's 1024-level stack, non-string map
keys, ...); `too_large` -- the length prefix exceeds max_frame; `bad_message` -- well-formed msgpack that is
not a valid message (not a map, missing/unknown op, unknown field, field of the wrong type or range).

The server is strict (unknown fields are an error: a misspelt "keepalive" must not silently fall back to a
default); clients are lenient (unknown fields are ignored, unknown fields of `event` are kept in `extra`), so
the server can add fields without breaking deployed clients.

`encode(msg)` returns the whole frame (prefix + msgpack). It trusts its input: encoding a message that
`parse_*` would reject is a caller bug. Constant replies are precomputed (`PONG_FRAME`, ...).
"""

from __future__ import annotations

import enum
import functools
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NoReturn, TypeAlias

import msgpack

__all__ = [
    "DEFAULT_MAX_FRAME", "MAX_FRAME_LIMIT", "MAX_UID_BYTES", "MAX_NAME_BYTES", "MAX_TOKEN_CHARS",
    "MAX_KEEPALIVE", "MAX_INT_UID", "MAX_SEQ", "MAX_DATA_DEPTH", "ROLES",
    "ErrorCode", "ProtocolError", "NEED_DATA", "NeedData", "Uid", "Role",
    "Login", "Ping", "Msg", "Bye", "Attach", "Touch", "Detach", "Subscribe", "Query",
    "Welcome", "Pong", "Event", "Status", "Error", "Ended", "ENDED_REASONS", "DETACH_REASONS",
    "PING", "BYE", "PONG", "PING_FRAME", "BYE_FRAME", "PONG_FRAME",
    "ClientMessage", "ServerMessage", "Message",
    "FrameDecoder", "encode", "parse_client_message", "parse_server_message", "check_uid",
]

# ---------------------------------------------------------------------------------------------- limits

DEFAULT_MAX_FRAME: Final = 4096  # bytes of msgpack body (the 4-byte prefix is not counted)
MAX_FRAME_LIMIT: Final = 0xFFFF_FFFF  # what a 4-byte prefix can express
MAX_UID_BYTES: Final = 256  # string uids: 1..256 bytes of UTF-8
MAX_NAME_BYTES: Final = 128  # gateway / observer names: 1..128 bytes of UTF-8
MAX_TOKEN_CHARS: Final = 1024
MAX_KEEPALIVE: Final = 86400.0  # seconds
MAX_INT_UID: Final = 2**63 - 1  # int uids: 0..2**63-1 (fits a signed 64-bit column everywhere)
MAX_SEQ: Final = 2**63 - 1
# `msg` data may nest at most this deep (a scalar is depth 0). msgpack alone would allow 1024 levels, which
# then breaks repr(), == and json in Python (recursion limit ~1000) wherever the data travels next.
MAX_DATA_DEPTH: Final = 32

Uid: TypeAlias = str | int
Role: TypeAlias = Literal["uid", "gateway", "observer"]
ROLES: Final[tuple[Role, ...]] = ("uid", "gateway", "observer")


class ErrorCode(enum.StrEnum):
    """Machine-readable codes carried by `ProtocolError.code` and by `error` frames (plain strings on the wire)."""

    BAD_FRAME = "bad_frame"  # body is not one well-formed msgpack value of the accepted subset
    TOO_LARGE = "too_large"  # length prefix exceeds the connection's max_frame
    BAD_MESSAGE = "bad_message"  # valid msgpack, but not a valid message (shape, op, field type or range)
    AUTH_FAILED = "auth_failed"  # token missing, malformed, forged, expired, or for another role/name
    LOGIN_TIMEOUT = "login_timeout"  # no login within the server's login deadline
    NOT_LOGGED_IN = "not_logged_in"  # a message other than login before login
    NOT_ALLOWED = "not_allowed"  # op not valid for this connection's role or state (e.g. attach from a user)
    IDLE_TIMEOUT = "idle_timeout"  # the connection was silent past its timeout
    KICKED = "kicked"  # a newer login for the same identity replaced this connection
    BUSY = "busy"  # the server refuses the connection or request for lack of capacity
    SERVER_SHUTDOWN = "server_shutdown"  # the server is stopping
    GONE = "gone"  # the requested thing no longer exists (server-defined, e.g. events pruned before `from`)


class ProtocolError(Exception):
    """The peer broke the protocol. `code` is an ErrorCode, `reason` a short human-readable explanation."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class NeedData:
    """Type of the `NEED_DATA` sentinel: no complete frame is buffered yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()

# ------------------------------------------------------------------------------------ client -> server


@dataclass(frozen=True, slots=True)
class Login:
    """`{"op":"login", <role>: name, "token"?: str, "keepalive"?: seconds, "ended"?: bool}`; keepalive only for
    role "uid"; `ended` only for role "gateway": it asks the server for `Ended` notices (opt-in, so gateways
    that do not know the message never receive it)."""

    role: Role
    name: Uid  # a uid (str or int) for role "uid", else a str name
    token: str | None = None
    keepalive: float | None = None
    ended: bool = False


@dataclass(frozen=True, slots=True)
class Ping:
    """`{"op":"ping"}`: keepalive. Parsed as the shared `PING` instance."""


@dataclass(frozen=True, slots=True)
class Msg:
    """`{"op":"msg","data":ANY}`: application payload (counts as activity). Arrays arrive as tuples."""

    data: Any = None


@dataclass(frozen=True, slots=True)
class Bye:
    """`{"op":"bye"}`: orderly logout. Parsed as the shared `BYE` instance."""


@dataclass(frozen=True, slots=True)
class Attach:
    """Gateway: these uids are now connected through me. `keepalive` applies to all of them."""

    uids: tuple[Uid, ...]
    keepalive: float | None = None


@dataclass(frozen=True, slots=True)
class Touch:
    """Gateway: activity from these uids."""

    uids: tuple[Uid, ...]


@dataclass(frozen=True, slots=True)
class Detach:
    """Gateway: these uids disconnected. `reason` (optional, one of `DETACH_REASONS`) is the offline reason
    to record, so an edge's users leave the same record as direct ones; absent: "detach"."""

    uids: tuple[Uid, ...]
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Observer: stream events, from sequence number `from_seq` (wire key "from") or from now when None."""

    from_seq: int | None = None


@dataclass(frozen=True, slots=True)
class Query:
    """Observer: which of these uids are online? Answered by `Status`."""

    uids: tuple[Uid, ...]


# ------------------------------------------------------------------------------------ server -> client


@dataclass(frozen=True, slots=True)
class Welcome:
    """Login accepted. `timeout` (seconds): a user's own timeout, or for a gateway the server's default;
    `max_frame` optionally tells a peer its new limit. A gateway's welcome also carries the server's `tick`
    and `max_timeout`, so an edge can answer its users' logins exactly as the server would."""

    role: Role
    name: Uid
    timeout: float | None = None
    max_frame: int | None = None
    tick: float | None = None
    max_timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Pong:
    """`{"op":"pong"}`. Encodes to the precomputed `PONG_FRAME`."""


@dataclass(frozen=True, slots=True)
class Event:
    """A presence change. `extra` carries optional additional fields (e.g. "timeout", "detector")."""

    seq: int
    kind: Literal["online", "offline"]
    uid: Uid
    ts: float  # wall-clock unix seconds of the event
    reason: str
    last_seen: float
    deadline: float
    extra: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """Answer to `Query`: uid -> online?"""

    online: Mapping[Uid, bool]


@dataclass(frozen=True, slots=True)
class Error:
    """`{"op":"error","code":C,"reason":TEXT}`, sent before the server closes a connection."""

    code: str
    reason: str


DETACH_REASONS: Final = ("logout", "closed", "shutdown")

# Why the server ended sessions a gateway carried (`Ended.reason`).
ENDED_REASONS: Final = ("idle", "kicked", "shutdown")


@dataclass(frozen=True, slots=True)
class Ended:
    """`{"op":"ended","uids":[...],"reason":R}`: the server ended these sessions of the gateway (R in
    `ENDED_REASONS`). Sent only to gateways that logged in with `"ended": true`."""

    uids: tuple[Uid, ...]
    reason: str


ClientMessage: TypeAlias = Login | Ping | Msg | Bye | Attach | Touch | Detach | Subscribe | Query
ServerMessage: TypeAlias = Welcome | Pong | Event | Status | Error | Ended
Message: TypeAlias = ClientMessage | ServerMessage

PING: Final = Ping()
BYE: Final = Bye()
PONG: Final = Pong()

# -------------------------------------------------------------------------------------------- encoding

_HEADER = struct.Struct(">I")
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from
_packb = msgpack.packb


def _frame(obj: dict[str, Any]) -> bytes:
    body = _packb(obj)
    return _pack_header(len(body)) + body


_PING_BODY: Final = _packb({"op": "ping"})
PING_FRAME: Final = _frame({"op": "ping"})
BYE_FRAME: Final = _frame({"op": "bye"})
PONG_FRAME: Final = _frame({"op": "pong"})


def _encode_login(m: Login) -> bytes:
    d: dict[str, Any] = {"op": "login", m.role: m.name}
    if m.token is not None:
        d["token"] = m.token
    if m.keepalive is not None:
        d["keepalive"] = m.keepalive
    if m.ended:
        d["ended"] = True
    return _frame(d)


def _encode_attach(m: Attach) -> bytes:
    d: dict[str, Any] = {"op": "attach", "uids": m.uids}
    if m.keepalive is not None:
        d["keepalive"] = m.keepalive
    return _frame(d)


def _encode_subscribe(m: Subscribe) -> bytes:
    if m.from_seq is None:
        return _frame({"op": "subscribe"})
    return _frame({"op": "subscribe", "from": m.from_seq})


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
    return _frame(d)


_EVENT_KEYS: Final = frozenset({"op", "seq", "kind", "uid", "ts", "reason", "last_seen", "deadline"})


def _encode_event(m: Event) -> bytes:
    d: dict[str, Any] = {
        "op": "event", "seq": m.seq, "kind": m.kind, "uid": m.uid, "ts": m.ts, "reason": m.reason,
        "last_seen": m.last_seen, "deadline": m.deadline,
    }
    if m.extra:
        clash = _EVENT_KEYS.intersection(m.extra)
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
    Touch: lambda m: _frame({"op": "touch", "uids": m.uids}),
    Detach: lambda m: _frame({"op": "detach", "uids": m.uids} if m.reason is None
                             else {"op": "detach", "uids": m.uids, "reason": m.reason}),
    Subscribe: _encode_subscribe,
    Query: lambda m: _frame({"op": "query", "uids": m.uids}),
    Welcome: _encode_welcome,
    Event: _encode_event,
    Status: lambda m: _frame({"op": "status", "online": dict(m.online)}),
    Error: lambda m: _frame({"op": "error", "code": str(m.code), "reason": m.reason}),
    Ended: lambda m: _frame({"op": "ended", "uids": m.uids, "reason": m.reason}),
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
# randomised -- int or tuple keys would let a peer craft hash collisions (O(n^2) dict build). The max_*_len
# limits default to len(body), so no header can make unpackb preallocate more than the frame (msgpack>=1.2.4).
_unpack_strict = functools.partial(
    msgpack.unpackb, raw=False, use_list=False, strict_map_key=True, ext_hook=_reject_ext)
# Clients decode `status`, whose keys may be int uids; the server is trusted not to flood them.
_unpack_lenient = functools.partial(
    msgpack.unpackb, raw=False, use_list=False, strict_map_key=False, ext_hook=_reject_ext)


def _unpack_failure(exc: Exception) -> str:
    """A short reason for why msgpack.unpackb rejected a body."""
    if isinstance(exc, _ExtRejected):
        return f"msgpack ext types are not allowed (ext type {exc.args[0]})"
    if isinstance(exc, msgpack.ExtraData):
        return "trailing bytes after the msgpack value"
    if isinstance(exc, msgpack.StackError):
        return "msgpack nesting too deep"
    if isinstance(exc, msgpack.FormatError):
        return "invalid msgpack (reserved type byte)"
    if isinstance(exc, UnicodeDecodeError):
        return "string is not valid UTF-8"
    text = str(exc)
    if "incomplete input" in text:
        return "truncated msgpack value"
    if isinstance(exc, TypeError):
        return "unhashable map key"
    if "map key" in text:
        return "map keys must be strings"
    return f"undecodable msgpack: {text[:80]}"


def _short(value: Any) -> str:
    """repr() for error reasons, bounded so that a reason never echoes a whole frame back."""
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None), bytes)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(reason: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, reason)


def check_uid(value: Any, what: str = "uid") -> Uid:
    """Return `value` if it is a valid uid, else raise ProtocolError(bad_message).

    A uid is a str of 1..256 UTF-8 bytes or an int 0..2**63-1, kept as given: 42 and "42" are distinct.
    bool is rejected although it subclasses int (True would otherwise alias uid 1).
    """
    t = type(value)
    if t is int:
        if 0 <= value <= MAX_INT_UID:
            return value
        raise _bad(f"{what}: int uid out of range 0..2**63-1")
    if t is str:
        n = len(value)
        # <= 64 code points cannot exceed 256 UTF-8 bytes: skip the encode() on the common path
        if n and (n <= MAX_UID_BYTES // 4 or len(value.encode()) <= MAX_UID_BYTES):
            return value
        raise _bad(f"{what}: str uid must be 1..{MAX_UID_BYTES} UTF-8 bytes")
    raise _bad(f"{what}: uid must be str or int, got {t.__name__}")


def _uid_list(value: Any, what: str = "uids") -> tuple[Uid, ...]:
    if type(value) is not tuple:
        raise _bad(f"{what} must be an array, got {type(value).__name__}")
    # inlined check_uid: gateway frames carry thousands of uids
    for i, u in enumerate(value):
        t = type(u)
        if t is int:
            if 0 <= u <= MAX_INT_UID:
                continue
        elif t is str:
            n = len(u)
            if n and (n <= MAX_UID_BYTES // 4 or len(u.encode()) <= MAX_UID_BYTES):
                continue
        check_uid(u, f"{what}[{i}]")  # raises with the precise reason
    return value


def _name(value: Any, what: str) -> str:
    if type(value) is str and value and len(value.encode()) <= MAX_NAME_BYTES:
        return value
    raise _bad(f"{what} must be a str of 1..{MAX_NAME_BYTES} UTF-8 bytes")


def _number(value: Any, what: str, lo_exclusive: float, hi: float) -> float:
    t = type(value)
    if (t is float or t is int) and lo_exclusive < value <= hi:  # NaN fails every comparison
        return float(value)
    raise _bad(f"{what} must be a number in ({lo_exclusive:g}, {hi:g}], got {_short(value)}")


def _finite(value: Any, what: str) -> float:
    t = type(value)
    if (t is float and math.isfinite(value)) or t is int:
        return float(value)
    raise _bad(f"{what} must be a finite number, got {_short(value)}")


def _seq(value: Any, what: str) -> int:
    if type(value) is int and 0 <= value <= MAX_SEQ:
        return value
    raise _bad(f"{what} must be an int in 0..2**63-1, got {_short(value)}")


def _text(value: Any, what: str) -> str:
    if type(value) is str:
        return value
    raise _bad(f"{what} must be a str, got {type(value).__name__}")


def _check_data(value: Any, depth: int) -> None:
    """Reject what `msg` data may not contain: timestamps (the one ext unpackb decodes itself), deep nesting."""
    t = type(value)
    if t is tuple:
        if depth >= MAX_DATA_DEPTH:
            raise _bad(f"msg data nests deeper than {MAX_DATA_DEPTH} levels")
        for item in value:
            _check_data(item, depth + 1)
    elif t is dict:
        if depth >= MAX_DATA_DEPTH:
            raise _bad(f"msg data nests deeper than {MAX_DATA_DEPTH} levels")
        for item in value.values():
            _check_data(item, depth + 1)
    elif t is msgpack.Timestamp:
        raise ProtocolError(ErrorCode.BAD_FRAME, "msgpack ext types are not allowed (ext type -1)")


def _only(obj: dict[Any, Any], allowed: frozenset[str], op: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _bad(f"unknown field {_short(key)} in {op}")


_IDENTITY_KEYS: Final = ("uid", "gateway", "observer")
_LOGIN_KEYS: Final = frozenset({"op", "uid", "gateway", "observer", "token", "keepalive", "ended"})
_MSG_KEYS: Final = frozenset({"op", "data"})
_ATTACH_KEYS: Final = frozenset({"op", "uids", "keepalive"})
_UIDS_KEYS: Final = frozenset({"op", "uids"})
_DETACH_KEYS: Final = frozenset({"op", "uids", "reason"})
_SUBSCRIBE_KEYS: Final = frozenset({"op", "from"})


def _identity(obj: dict[str, Any], op: str) -> tuple[Role, Uid]:
    """Exactly one of uid / gateway / observer (nil counts as absent)."""
    present = [key for key in _IDENTITY_KEYS if obj.get(key) is not None]
    if len(present) != 1:
        raise _bad(f"{op} needs exactly one of uid, gateway, observer (got {len(present)})")
    role: Role = present[0]  # type: ignore[assignment]
    value = obj[role]
    return role, (check_uid(value) if role == "uid" else _name(value, role))


def _parse_login(obj: dict[str, Any]) -> Login:
    _only(obj, _LOGIN_KEYS, "login")
    role, name = _identity(obj, "login")
    token = obj.get("token")
    if token is not None and (type(token) is not str or len(token) > MAX_TOKEN_CHARS):
        raise _bad(f"token must be a str of at most {MAX_TOKEN_CHARS} characters")
    keepalive = obj.get("keepalive")
    if keepalive is not None:
        if role != "uid":
            raise _bad("keepalive applies only to uid logins (gateways give it per attach)")
        keepalive = _number(keepalive, "keepalive", 0.0, MAX_KEEPALIVE)
    ended = obj.get("ended")
    if ended is not None:
        if type(ended) is not bool:
            raise _bad("ended must be a bool")
        if role != "gateway":
            raise _bad("ended applies only to gateway logins")
    return Login(role, name, token, keepalive, bool(ended))


def _parse_ping(obj: dict[str, Any]) -> Ping:
    if len(obj) != 1:
        _only(obj, frozenset({"op"}), "ping")
    return PING


def _parse_bye(obj: dict[str, Any]) -> Bye:
    if len(obj) != 1:
        _only(obj, frozenset({"op"}), "bye")
    return BYE


def _parse_msg(obj: dict[str, Any]) -> Msg:
    if len(obj) > 1:
        _only(obj, _MSG_KEYS, "msg")
    data = obj.get("data")
    t = type(data)
    if t is tuple or t is dict or t is msgpack.Timestamp:
        _check_data(data, 0)
    return Msg(data)


def _parse_attach(obj: dict[str, Any]) -> Attach:
    _only(obj, _ATTACH_KEYS, "attach")
    if "uids" not in obj:
        raise _bad("attach needs uids")
    keepalive = obj.get("keepalive")
    if keepalive is not None:
        keepalive = _number(keepalive, "keepalive", 0.0, MAX_KEEPALIVE)
    return Attach(_uid_list(obj["uids"]), keepalive)


def _uids_of(obj: dict[str, Any], op: str) -> tuple[Uid, ...]:
    _only(obj, _UIDS_KEYS, op)
    if "uids" not in obj:
        raise _bad(f"{op} needs uids")
    return _uid_list(obj["uids"])


def _parse_detach(obj: dict[str, Any]) -> Detach:
    reason = obj.get("reason")
    if reason is None:
        return Detach(_uids_of(obj, "detach"))
    if type(reason) is not str or reason not in DETACH_REASONS:
        raise _bad(f"detach reason must be one of {', '.join(DETACH_REASONS)}")
    _only(obj, _DETACH_KEYS, "detach")
    if "uids" not in obj:
        raise _bad("detach needs uids")
    return Detach(_uid_list(obj["uids"]), reason)


def _parse_subscribe(obj: dict[str, Any]) -> Subscribe:
    _only(obj, _SUBSCRIBE_KEYS, "subscribe")
    start = obj.get("from")
    return Subscribe(None if start is None else _seq(start, "from"))


_CLIENT_PARSERS: Final[dict[str, Callable[[dict[str, Any]], ClientMessage]]] = {
    "ping": _parse_ping,
    "msg": _parse_msg,
    "login": _parse_login,
    "bye": _parse_bye,
    "attach": _parse_attach,
    "touch": lambda obj: Touch(_uids_of(obj, "touch")),
    "detach": _parse_detach,
    "subscribe": _parse_subscribe,
    "query": lambda obj: Query(_uids_of(obj, "query")),
}


def _op_of(obj: Any) -> str:
    if type(obj) is not dict:
        raise _bad(f"a message must be a map, got {type(obj).__name__}")
    op = obj.get("op")
    if type(op) is not str:
        raise _bad("missing op" if op is None else "op must be a str")
    return op


def parse_client_message(obj: Any) -> ClientMessage:
    """Validate a decoded client -> server map and build its message; ProtocolError(bad_message) otherwise."""
    op = _op_of(obj)
    parser = _CLIENT_PARSERS.get(op)
    if parser is None:
        raise _bad(f"unknown op {_short(op)}")
    return parser(obj)


# Server -> client parsing is lenient about unknown fields (see the module docstring).


def _parse_welcome(obj: dict[Any, Any]) -> Welcome:
    role, name = _identity(obj, "welcome")
    timeout = obj.get("timeout")
    max_frame = obj.get("max_frame")
    if max_frame is not None and not (type(max_frame) is int and 0 < max_frame <= MAX_FRAME_LIMIT):
        raise _bad("max_frame must be an int in 1..2**32-1")
    tick, max_timeout = obj.get("tick"), obj.get("max_timeout")
    return Welcome(
        role, name, None if timeout is None else _number(timeout, "timeout", 0.0, math.inf), max_frame,
        None if tick is None else _number(tick, "tick", 0.0, math.inf),
        None if max_timeout is None else _number(max_timeout, "max_timeout", 0.0, math.inf))


def _parse_ended(obj: dict[Any, Any]) -> Ended:
    reason = obj.get("reason")
    if type(reason) is not str:
        raise _bad("ended needs a str reason")
    # An unknown reason is kept as given (lenient): a gateway treats it like the session simply ending.
    return Ended(_uid_list(obj.get("uids"), "ended uids"), reason)


def _parse_event(obj: dict[Any, Any]) -> Event:
    for key in ("seq", "kind", "uid", "ts", "reason", "last_seen", "deadline"):
        if key not in obj:
            raise _bad(f"event needs {key}")
    kind = obj["kind"]
    if type(kind) is not str or kind not in ("online", "offline"):
        raise _bad(f"event kind must be 'online' or 'offline', got {_short(kind)}")
    extra = None
    if len(obj) > len(_EVENT_KEYS):
        extra = {}
        for key, value in obj.items():
            if key not in _EVENT_KEYS:
                if type(key) is not str:
                    raise _bad("map keys must be strings")
                extra[key] = value
    return Event(
        _seq(obj["seq"], "seq"), kind, check_uid(obj["uid"]), _finite(obj["ts"], "ts"),
        _text(obj["reason"], "reason"), _finite(obj["last_seen"], "last_seen"),
        _finite(obj["deadline"], "deadline"), extra)


def _parse_status(obj: dict[Any, Any]) -> Status:
    online = obj.get("online")
    if type(online) is not dict:
        raise _bad("status needs an online map")
    for uid, flag in online.items():
        check_uid(uid, "status uid")
        if type(flag) is not bool:
            raise _bad("status values must be booleans")
    return Status(online)


def _parse_error(obj: dict[Any, Any]) -> Error:
    return Error(_text(obj.get("code"), "code"), _text(obj.get("reason", ""), "reason"))


_SERVER_PARSERS: Final[dict[str, Callable[[dict[Any, Any]], ServerMessage]]] = {
    "pong": lambda obj: PONG,
    "event": _parse_event,
    "welcome": _parse_welcome,
    "status": _parse_status,
    "error": _parse_error,
    "ended": _parse_ended,
}


def parse_server_message(obj: Any) -> ServerMessage:
    """Validate a decoded server -> client map; unknown fields are ignored (kept in Event.extra)."""
    op = _op_of(obj)
    parser = _SERVER_PARSERS.get(op)
    if parser is None:
        raise _bad(f"unknown op {_short(op)}")
    return parser(obj)


# ---------------------------------------------------------------------------------------- frame decoder

Parse: TypeAlias = Callable[[Any], Any]

_PONG_BODY: Final = _packb({"op": "pong"})
# parse function -> (canonical frame, its body, its message, unpackb flavour, parse): the canonical
# keepalive of each direction is recognised by comparing bytes, without calling msgpack at all.
_PROFILES: Final[dict[Parse, tuple[Any, ...]]] = {
    parse_client_message: (PING_FRAME, _PING_BODY, PING, _unpack_strict, parse_client_message),
    parse_server_message: (PONG_FRAME, _PONG_BODY, PONG, _unpack_lenient, parse_server_message),
}


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
        # One shared tuple instead of five slots: 8 bytes per connection, one attribute load per frame.
        self._profile = _PROFILES.get(parse) or (None, None, None, _unpack_strict, parse)
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
        if type(buf) is bytes:
            buf = bytearray(memoryview(buf)[self._pos:])
            self._buf = buf
        elif self._pos:
            del buf[: self._pos]
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
        fast_frame, fast_body, fast_message, unpack, parse = self._profile
        if pos == 0 and buf == fast_frame:  # a lone keepalive (or pong): the commonest packet of all
            self._buf = b""
            return fast_message
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
        if body == fast_body:
            return fast_message
        if not n:
            self._fail(ErrorCode.BAD_FRAME, "empty frame")
        try:
            obj = unpack(body)
        except Exception as exc:  # unpackb over untrusted bytes: any failure means a bad frame
            self._fail(ErrorCode.BAD_FRAME, _unpack_failure(exc))
        try:
            return parse(obj)
        except ProtocolError as exc:
            self._fail(exc.code, exc.reason)

    def _need_data(self, buf: bytes | bytearray, pos: int) -> NeedData:
        # Keep only the partial frame, not the whole chunk it arrived in.
        if pos:
            if type(buf) is bytes:
                self._buf = buf[pos:]
            else:
                del buf[:pos]
            self._pos = 0
        return NEED_DATA

    def _fail(self, code: ErrorCode, reason: str) -> NoReturn:
        self._failed = (code, reason)
        self._buf = b""
        self._pos = 0
        raise ProtocolError(code, reason)
