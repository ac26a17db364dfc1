"""Validation: a decoded msgpack object in, a typed message out, or `ProtocolError(bad_message)`.

Theory of operation
-------------------
`parse_client_message(obj)` (server side) and `parse_server_message(obj)` (client side) take what
`msgpack.unpackb` returned for one frame body -- a dict with str keys, arrays as tuples -- read its "op" and
hand it to that op's parser, which checks every field's type and range and builds the frozen message.

The server is strict (unknown fields are an error: a misspelt "keepalive" must not silently fall back to a
default); clients are lenient (unknown fields are ignored, unknown fields of `event` are kept in `extra`), so
the server can add fields without breaking deployed clients. Numbers are checked with `type(x) is int/float`
(bool subclasses int and is never a number here) and must be finite wherever they are read: NaN fails every
comparison and would otherwise slip through range checks, inf is no time and no duration.

Gateway frames (`attach`, `touch`, `detach`, and the server's `ended`) carry *session keys*: each element
of `uids` is a uid or a 2-array [uid, device]. unpackb already made that array a tuple, so the validated
element is returned as the key itself (no conversion on the touch path); `query` takes plain uids only.

Reasons name the field and the accepted range, and never echo more than ~40 characters of the peer's value.
Frame-level rules (ext types, duplicate map keys) are not visible in a decoded object: `codec` enforces
them on the bytes before and after calling these functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import msgpack

from idled.protocol.messages import (
    BYE, DETACH_REASONS, MAX_DATA_DEPTH, MAX_DEVICE_BYTES, MAX_FRAME_LIMIT, MAX_INT_UID, MAX_KEEPALIVE, MAX_NAME_BYTES, MAX_TOUCH_AGO, MAX_SEQ, MAX_TOKEN_CHARS,
    MAX_UID_BYTES, MIN_KEEPALIVE, PING, PONG, Attach, Bye, ClientMessage, Detach, Error, ErrorCode, Event,
    EventKind, Ended, Login, Mark, Marked, Msg, Ping, ProtocolError, Query, Role, ServerMessage, SessionKey, Status, Subscribe, Touch,
    Uid, Welcome,
)
from idled.protocol.messages import ROLES, Replicate, Unwatch, Watch
from idled.protocol.replicate import parse_replicate

__all__ = ["parse_client_message", "parse_server_message", "check_uid", "check_device", "check_key"]

EVENT_KEYS: Final = frozenset({"op", "seq", "kind", "uid", "ts", "reason", "last_seen", "deadline"})
_EVENT_KINDS: Final[dict[str, EventKind]] = {"online": "online", "offline": "offline"}
_MAX_LEADER_CHARS: Final = 300  # an error's leader: a DNS name (253) or [IPv6], a colon and a port


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


def check_device(value: Any, what: str = "device") -> str:
    """Return `value` if it is a valid device name (a str of 1..64 UTF-8 bytes), else ProtocolError."""
    if type(value) is str:
        n = len(value)
        if n and (n <= MAX_DEVICE_BYTES // 4 or len(value.encode()) <= MAX_DEVICE_BYTES):
            return value
    raise _bad(f"{what} must be a str of 1..{MAX_DEVICE_BYTES} UTF-8 bytes")


def check_key(value: Any, what: str = "uids element") -> SessionKey:
    """Return `value` if it is a valid session key (a uid, or a 2-tuple (uid, device)), else ProtocolError."""
    if type(value) is tuple:
        if len(value) != 2:
            raise _bad(f"{what}: a session key array must be [uid, device], got {len(value)} elements")
        check_uid(value[0], what)
        check_device(value[1], f"{what} device")
        return value
    return check_uid(value, what)


def _uid_list(value: Any, what: str = "uids") -> tuple[Uid, ...]:
    """Plain uids only (query): `_key_list`'s loop, with a [uid, device] element refused like any other
    element that is not a uid (`check_uid`'s message, ``uid must be str or int, got tuple``)."""
    return _key_list(value, what, False)  # type: ignore[return-value]  # pairs=False: every element a uid


def _key_list(value: Any, what: str = "uids", pairs: bool = True) -> tuple[SessionKey, ...]:
    """Session keys (gateway frames): each element a uid or a 2-array [uid, device], which msgpack decoded
    as a tuple -- the key itself, returned as is (``pairs=False``: plain uids only, see `_uid_list`). The
    plain uid branches come first: a frame of plain uids costs exactly what it did before devices, and the
    ``pairs`` test is only read for a tuple element."""
    if type(value) is not tuple:
        raise _bad(f"{what} must be an array, got {type(value).__name__}")
    # inlined check_uid / check_key: gateway frames carry thousands of keys
    for i, u in enumerate(value):
        t = type(u)
        if t is int:
            if 0 <= u <= MAX_INT_UID:
                continue
        elif t is str:
            n = len(u)
            if n and (n <= MAX_UID_BYTES // 4 or len(u.encode()) <= MAX_UID_BYTES):
                continue
        elif t is tuple and pairs and len(u) == 2:
            uid, device = u
            t = type(uid)
            if ((t is int and 0 <= uid <= MAX_INT_UID)
                    or (t is str and uid and (len(uid) <= MAX_UID_BYTES // 4 or len(uid.encode()) <= MAX_UID_BYTES))) \
                    and type(device) is str and device \
                    and (len(device) <= MAX_DEVICE_BYTES // 4 or len(device.encode()) <= MAX_DEVICE_BYTES):
                continue
        (check_key if pairs else check_uid)(u, f"{what}[{i}]")  # raises with the precise reason
    return value


def _name(value: Any, what: str) -> str:
    if type(value) is str and value and len(value.encode()) <= MAX_NAME_BYTES:
        return value
    raise _bad(f"{what} must be a str of 1..{MAX_NAME_BYTES} UTF-8 bytes")


def _keepalive(value: Any) -> float:
    t = type(value)
    if (t is float or t is int) and MIN_KEEPALIVE <= value <= MAX_KEEPALIVE:  # NaN fails every comparison
        return float(value)
    raise _bad(f"keepalive must be a number of seconds in {MIN_KEEPALIVE:g}..{MAX_KEEPALIVE:g}, got {_short(value)}")


def _touch_ago(value: Any) -> float:
    t = type(value)
    if (t is float or t is int) and 0 <= value <= MAX_TOUCH_AGO:  # NaN fails every comparison
        return float(value)
    raise _bad(f"ago must be a number of seconds in 0..{MAX_TOUCH_AGO:g}, got {_short(value)}")


def _positive(value: Any, what: str) -> float:
    t = type(value)
    if (t is float or t is int) and 0 < value < math.inf:  # NaN fails every comparison
        return float(value)
    raise _bad(f"{what} must be a finite number > 0, got {_short(value)}")


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


_IDENTITY_KEYS: Final = ROLES  # a login names itself by its role: {"uid": U}, {"gateway": NAME}...
_LOGIN_KEYS: Final = frozenset({"op", *_IDENTITY_KEYS, "token", "keepalive", "ended", "marks", "device"})
_MARK_KEYS: Final = frozenset({"op", "t"})
_DETACH_KEYS: Final = frozenset({"op", "uids", "reason"})
_MSG_KEYS: Final = frozenset({"op", "data"})
_ATTACH_KEYS: Final = frozenset({"op", "uids", "keepalive"})
_UIDS_KEYS: Final = frozenset({"op", "uids"})
_TOUCH_KEYS: Final = frozenset({"op", "uids", "ago"})
_SUBSCRIBE_KEYS: Final = frozenset({"op", "from", "durable", "uids"})
_QUERY_KEYS: Final = frozenset({"op", "uids", "last_seen"})


def _identity(obj: dict[str, Any], op: str) -> tuple[Role, Uid]:
    """Exactly one of uid / gateway / observer / standby (nil counts as absent)."""
    present = [key for key in _IDENTITY_KEYS if obj.get(key) is not None]
    if len(present) != 1:
        raise _bad(f"{op} needs exactly one of {', '.join(_IDENTITY_KEYS)} (got {len(present)})")
    role: Role = present[0]
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
        keepalive = _keepalive(keepalive)
    ended, marks = _gateway_flag(obj, "ended", role), _gateway_flag(obj, "marks", role)
    device = obj.get("device")
    if device is not None:
        if role != "uid":
            raise _bad("device applies only to uid logins")
        device = check_device(device)
    return Login(role, name, token, keepalive, ended, marks, device)


def _gateway_flag(obj: dict[str, Any], key: str, role: Role) -> bool:
    value = obj.get(key)
    if value is None:
        return False
    if type(value) is not bool:
        raise _bad(f"{key} must be a bool")
    if role != "gateway":
        raise _bad(f"{key} applies only to gateway logins")
    return value


def _parse_marked(obj: dict[str, Any]) -> Marked:
    _only(obj, _MARK_KEYS, "marked")
    return Marked(_finite(obj.get("t"), "t"))


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
        keepalive = _keepalive(keepalive)
    return Attach(_key_list(obj["uids"]), keepalive)


def _uids_of(obj: dict[str, Any], op: str) -> tuple[Uid, ...]:
    """`uids` of watch / unwatch: plain uids only (never session keys), like query's."""
    _only(obj, _UIDS_KEYS, op)
    if "uids" not in obj:
        raise _bad(f"{op} needs uids")
    return _uid_list(obj["uids"])


def _keys_of(obj: dict[str, Any], op: str, allowed: frozenset[str] = _UIDS_KEYS) -> tuple[SessionKey, ...]:
    _only(obj, allowed, op)
    if "uids" not in obj:
        raise _bad(f"{op} needs uids")
    return _key_list(obj["uids"])


def _parse_touch(obj: dict[str, Any]) -> Touch:
    uids = _keys_of(obj, "touch", _TOUCH_KEYS)
    ago = obj.get("ago")  # nil counts as absent, as everywhere
    return Touch(uids, 0.0 if ago is None else _touch_ago(ago))


def _parse_detach(obj: dict[str, Any]) -> Detach:
    reason = obj.get("reason")
    if reason is None:
        return Detach(_keys_of(obj, "detach"))
    if type(reason) is not str or reason not in DETACH_REASONS:
        raise _bad(f"detach reason must be one of {', '.join(DETACH_REASONS)}")
    _only(obj, _DETACH_KEYS, "detach")
    if "uids" not in obj:
        raise _bad("detach needs uids")
    return Detach(_key_list(obj["uids"]), reason)


def _parse_subscribe(obj: dict[str, Any]) -> Subscribe:
    _only(obj, _SUBSCRIBE_KEYS, "subscribe")
    start = obj.get("from")
    durable = obj.get("durable")
    if durable is not None and type(durable) is not bool:
        raise _bad("durable must be a bool")
    uids = obj.get("uids")
    return Subscribe(None if start is None else _seq(start, "from"), durable is True,
                     None if uids is None else _uid_list(uids))


def _parse_query(obj: dict[str, Any]) -> Query:
    _only(obj, _QUERY_KEYS, "query")
    if "uids" not in obj:
        raise _bad("query needs uids")
    last_seen = obj.get("last_seen")  # nil counts as absent, as everywhere
    if last_seen is not None and type(last_seen) is not bool:
        raise _bad("last_seen must be a bool")
    return Query(_uid_list(obj["uids"]), last_seen is True)


_CLIENT_PARSERS: Final[dict[str, Callable[[dict[str, Any]], ClientMessage]]] = {
    "ping": _parse_ping,
    "msg": _parse_msg,
    "login": _parse_login,
    "bye": _parse_bye,
    "attach": _parse_attach,
    "touch": _parse_touch,
    "detach": _parse_detach,
    "marked": _parse_marked,
    "subscribe": _parse_subscribe,
    "query": _parse_query,
    "watch": lambda obj: Watch(_uids_of(obj, "watch")),
    "unwatch": lambda obj: Unwatch(_uids_of(obj, "unwatch")),
    "replicate": lambda obj: _parse_replicate(obj),
}


def _parse_replicate(obj: dict[str, Any]) -> Replicate:
    return parse_replicate(obj)  # with its optional check: idled.protocol.replicate


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
        role, name, None if timeout is None else _positive(timeout, "timeout"), max_frame,
        None if tick is None else _positive(tick, "tick"),
        None if max_timeout is None else _positive(max_timeout, "max_timeout"), obj.get("ages") is True)


def _parse_ended(obj: dict[Any, Any]) -> Ended:
    reason = obj.get("reason")
    if type(reason) is not str:
        raise _bad("ended needs a str reason")
    # An unknown reason is kept as given (lenient): a gateway treats it like the session simply ending.
    return Ended(_key_list(obj.get("uids"), "ended uids"), reason)


def _parse_event(obj: dict[Any, Any]) -> Event:
    for key in ("seq", "kind", "uid", "ts", "reason", "last_seen", "deadline"):
        if key not in obj:
            raise _bad(f"event needs {key}")
    raw_kind = obj["kind"]
    kind = _EVENT_KINDS.get(raw_kind) if type(raw_kind) is str else None  # typed EventKind, unlike `in`
    if kind is None:
        raise _bad(f"event kind must be 'online' or 'offline', got {_short(raw_kind)}")
    extra = None
    if len(obj) > len(EVENT_KEYS):
        extra = {}
        for key, value in obj.items():
            if key not in EVENT_KEYS:
                if type(key) is not str:
                    raise _bad("map keys must be strings")
                extra[key] = value
        if "timeout" in extra:  # the one documented optional number
            _finite(extra["timeout"], "timeout")
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
    last_seen = _uid_map(obj.get("last_seen"), "last_seen", _last_seen_value)
    if last_seen is not None:
        last_seen = {uid: None if value is None else float(value) for uid, value in last_seen.items()}
    return Status(online, last_seen, _uid_map(obj.get("devices"), "devices", _device_names))


def _uid_map(value: Any, field: str, check: Callable[[Any], object]) -> dict[Uid, Any] | None:
    """An optional map of a status (``field``): uid -> a value ``check`` accepts (it raises otherwise)."""
    if value is None:
        return None
    if type(value) is not dict:
        raise _bad(f"status {field} must be a map")
    for uid, item in value.items():
        check_uid(uid, f"status {field} uid")
        check(item)
    return value


def _last_seen_value(value: Any) -> None:
    if value is not None:
        _finite(value, "status last_seen")


def _device_names(names: Any) -> None:
    if type(names) is not tuple or any(type(name) is not str for name in names):
        raise _bad("status devices values must be arrays of str")


def _parse_error(obj: dict[Any, Any]) -> Error:
    leader = obj.get("leader")
    if leader is not None and (type(leader) is not str or not leader or len(leader) > _MAX_LEADER_CHARS):
        raise _bad(f"error leader must be a HOST:PORT str, got {_short(leader)}")
    return Error(_text(obj.get("code"), "code"), _text(obj.get("reason", ""), "reason"), leader)


_SERVER_PARSERS: Final[dict[str, Callable[[dict[Any, Any]], ServerMessage]]] = {
    "pong": lambda obj: PONG,
    "event": _parse_event,
    "welcome": _parse_welcome,
    "status": _parse_status,
    "error": _parse_error,
    "ended": _parse_ended,
    "mark": lambda obj: Mark(_finite(obj.get("t"), "t")),
}


def parse_server_message(obj: Any) -> ServerMessage:
    """Validate a decoded server -> client map; unknown fields are ignored (kept in Event.extra)."""
    op = _op_of(obj)
    parser = _SERVER_PARSERS.get(op)
    if parser is None:
        raise _bad(f"unknown op {_short(op)}")
    return parser(obj)

