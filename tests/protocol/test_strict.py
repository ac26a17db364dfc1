"""The strict protocol: ext types and duplicate map keys are bad frames, keepalive is 1..86400 s, and no
number read from the wire may be NaN or infinite. Every case is fed whole and byte by byte."""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import pytest

from idled.protocol import (
    MAX_KEEPALIVE, MAX_TOUCH_AGO, MIN_KEEPALIVE, NEED_DATA, PING, Attach, ErrorCode, Event, FrameDecoder, Login,
    Msg, ProtocolError, Status, Touch, Welcome, decode_client_body, decode_server_body, encode, parse_client_message,
    parse_server_message,
)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def pack(value: Any) -> bytes:
    return msgpack.packb(value)


def raw_map(*pairs: tuple[Any, Any], header: str = "fix") -> bytes:
    """A msgpack map written entry by entry, so that it may repeat a key. Values that are bytes are taken
    as already packed msgpack (for nesting raw maps)."""
    n = len(pairs)
    head = {"fix": bytes([0x80 | n]), "16": b"\xde" + struct.pack(">H", n), "32": b"\xdf" + struct.pack(">I", n)}
    out = head[header]
    for key, value in pairs:
        out += pack(key) + (value if isinstance(value, bytes) else pack(value))
    return out


def raw_array(*packed: bytes) -> bytes:
    assert len(packed) < 16
    return bytes([0x90 | len(packed)]) + b"".join(packed)


def outcome(data: bytes, parse: Any, chunk: int | None) -> list[Any] | ProtocolError:
    decoder = FrameDecoder(1 << 20, parse)
    out: list[Any] = []
    step = chunk or len(data)
    try:
        for i in range(0, len(data), step):
            decoder.receive_data(data[i : i + step])
            while (event := decoder.next_event()) is not NEED_DATA:
                out.append(event)
    except ProtocolError as exc:
        assert decoder.failed
        return exc
    return out


def error_of(body: bytes, parse: Any = parse_client_message) -> ProtocolError:
    """The error for one frame, the same whole and byte by byte (and after a ping in the same chunk)."""
    errors = [outcome(frame(body), parse, chunk) for chunk in (None, 1)]
    errors.append(outcome(encode(PING) + frame(body), parse_client_message, None) if parse is parse_client_message
                  else errors[0])
    for err in errors:
        assert isinstance(err, ProtocolError), err
        assert (err.code, err.reason) == (errors[0].code, errors[0].reason)
    assert len(errors[0].reason) < 200
    return errors[0]


def accepted(body: bytes, parse: Any = parse_client_message) -> Any:
    results = [outcome(frame(body), parse, chunk) for chunk in (None, 1)]
    assert results[0] == results[1] and isinstance(results[0], list) and len(results[0]) == 1, results
    return results[0][0]


EVENT = {"op": "event", "seq": 1, "kind": "online", "uid": "a", "ts": 1.7e9, "reason": "login",
         "last_seen": 1.7e9, "deadline": 1.7e9 + 45}

# ------------------------------------------------------------------------------------------- ext types

TS4, TS8, TS12 = msgpack.Timestamp(1), msgpack.Timestamp(1, 5), msgpack.Timestamp(2**40, 5)
CLIENT_EXT = {
    # where a timestamp used to be read as a wrong-typed field (bad_message), or was caught only in msg data
    "timestamp keepalive": ({"op": "login", "uid": 1, "keepalive": TS4}, -1),
    "timestamp uid": ({"op": "login", "uid": TS8}, -1),
    "timestamp in uids": ({"op": "touch", "uids": [1, TS12]}, -1),
    "timestamp as the op": ({"op": TS4}, -1),
    "timestamp in an unknown field": ({"op": "ping", "when": TS4}, -1),
    "timestamp as the whole body": (TS4, -1),
    "timestamp deep in msg data": ({"op": "msg", "data": {"a": [[{"b": TS8}]]}}, -1),
    "ext 5 in msg data": ({"op": "msg", "data": msgpack.ExtType(5, b"xy")}, 5),
    "empty ext 3": ({"op": "ping", "x": msgpack.ExtType(3, b"")}, 3),
    "ext 7 after a timestamp": ({"op": "msg", "data": [TS4, msgpack.ExtType(7, b"q")]}, 7),
}


# msgpack.ExtType cannot make negative (reserved) types: ext16, 300 bytes, type -128
CLIENT_EXT["ext -128 as keepalive"] = (
    raw_map(("op", "login"), ("uid", 1), ("keepalive", b"\xc8\x01\x2c\x80" + b"x" * 300)), -128)


@pytest.mark.parametrize("name", CLIENT_EXT)
def test_ext_types_are_bad_frame_wherever_they_appear(name: str) -> None:
    obj, ext_type = CLIENT_EXT[name]
    err = error_of(obj if isinstance(obj, bytes) else pack(obj))
    assert err.code == ErrorCode.BAD_FRAME
    assert f"ext types are not allowed (ext type {ext_type})" in err.reason


def test_a_timestamp_with_a_malformed_payload_is_an_ext_error_too() -> None:
    body = b"\x82" + pack("op") + pack("msg") + pack("data") + b"\xc7\x00\xff"  # ext8, 0 bytes, type -1
    err = error_of(body)
    assert err.code == ErrorCode.BAD_FRAME and "ext type -1" in err.reason


@pytest.mark.parametrize("obj", [
    {**EVENT, "ts": TS4},
    {**EVENT, "note": TS8},  # an extra field: clients keep these in Event.extra
    {"op": "welcome", "observer": "o", "motd": TS4},  # a field clients ignore
    {"op": "pong", "x": msgpack.ExtType(1, b"")},
    {"op": "status", "online": {"a": TS4}},
], ids=repr)
def test_ext_types_are_bad_frame_in_server_messages(obj: dict[str, Any]) -> None:
    err = error_of(pack(obj), parse_server_message)
    assert err.code == ErrorCode.BAD_FRAME and "ext type" in err.reason


# ------------------------------------------------------------------------------------- duplicate keys

CLIENT_DUPLICATES = {
    "duplicate op": (raw_map(("op", "ping"), ("op", "ping")), "'op'"),
    "second uid would win": (raw_map(("op", "login"), ("uid", "alice"), ("uid", "mallory")), "'uid'"),
    "duplicate keepalive": (raw_map(("op", "login"), ("uid", 1), ("keepalive", 30), ("keepalive", 60)),
                            "'keepalive'"),
    "map16 header": (raw_map(("op", "touch"), ("uids", [1]), ("uids", [2]), header="16"), "'uids'"),
    "map32 header": (raw_map(("op", "bye"), ("op", "bye"), header="32"), "'op'"),
    "msg data map": (raw_map(("op", "msg"), ("data", raw_map(("a", 1), ("b", 2), ("a", 3)))), "'a'"),
    "msg data deep": (raw_map(("op", "msg"), ("data", raw_array(raw_array(raw_map(
        ("x", raw_map(("k", 1), ("k", 1)))))))), "'k'"),
    "msg data first": (raw_map(("data", raw_map(("a", 1), ("a", 2))), ("op", "msg")), "'a'"),
    "msg data array first": (raw_map(("data", raw_array(raw_map(("a", 1), ("a", 2)))), ("op", "msg")), "'a'"),
    "bin keys in msg data": (raw_map(("op", "msg"), ("data", raw_map((b"k", 1), (b"k", 2)))), "b'k'"),
    # duplicates are a frame error, reported before what is wrong with the message itself
    "in an otherwise bad message": (raw_map(("op", "touch"), ("uids", raw_array(raw_map(("a", 1), ("a", 1))))),
                                    "'a'"),
    "in an unknown field": (raw_map(("op", "ping"), ("x", raw_map(("a", 1), ("a", 1)))), "'a'"),
    "with an unknown op": (raw_map(("op", "nope"), ("op", "nope")), "'op'"),
}


@pytest.mark.parametrize("name", CLIENT_DUPLICATES)
def test_duplicate_map_keys_are_bad_frame_at_any_depth(name: str) -> None:
    body, key = CLIENT_DUPLICATES[name]
    err = error_of(body)
    assert err.code == ErrorCode.BAD_FRAME
    assert err.reason == f"duplicate map key {key}"


SERVER_DUPLICATES = {
    "event seq": raw_map(*EVENT.items(), ("seq", 2)),
    "event extra": raw_map(*EVENT.items(), ("detector", "wheel"), ("detector", "heap")),
    "nested in an event extra": raw_map(*EVENT.items(), ("info", raw_array(raw_map(("a", 1), ("a", 2))))),
    "status uid": raw_map(("op", "status"), ("online", raw_map((1, True), (1, False)))),
    "status equal keys": raw_map(("op", "status"), ("online", raw_map((1, True), (1.0, False)))),
    "welcome ignored field": raw_map(("op", "welcome"), ("observer", "o"), ("motd", raw_map(("a", 1), ("a", 1)))),
    "error": raw_map(("op", "error"), ("code", "busy"), ("code", "kicked")),
}


@pytest.mark.parametrize("name", SERVER_DUPLICATES)
def test_duplicate_map_keys_are_bad_frame_in_server_messages(name: str) -> None:
    err = error_of(SERVER_DUPLICATES[name], parse_server_message)
    assert err.code == ErrorCode.BAD_FRAME and err.reason.startswith("duplicate map key ")


def test_maps_with_distinct_keys_are_not_mistaken_for_duplicates() -> None:
    nested = {"text": "hi", "to": (1, 2), "meta": {"a": 1, "b": {"a": 1}}, "list": ({"a": 1}, {"a": 2})}
    assert accepted(pack({"op": "msg", "data": nested})) == Msg(nested)
    assert accepted(raw_map(("data", pack(nested)), ("op", "msg"))) == Msg(nested)  # data before op
    # str and bin keys are different keys, so are 42 and "42"
    assert accepted(raw_map(("op", "msg"), ("data", raw_map(("k", 1), (b"k", 2))))) == Msg({"k": 1, b"k": 2})
    assert accepted(pack({"op": "status", "online": {42: True, "42": False}}), parse_server_message) == \
        Status({42: True, "42": False})
    # the same key in sibling maps, and a map16 header without duplicates
    assert accepted(raw_map(("op", "login"), ("uid", "u"), ("keepalive", 30), header="16")) == \
        Login("uid", "u", None, 30.0)
    event = {**EVENT, "timeout": 45.0, "info": {"a": {"a": 1}}}
    assert accepted(pack(event), parse_server_message).extra == {"timeout": 45.0, "info": {"a": {"a": 1}}}


def test_body_decoders_apply_the_same_rules() -> None:
    assert decode_client_body(pack({"op": "ping"})) is PING
    with pytest.raises(ProtocolError, match="duplicate map key 'op'"):
        decode_client_body(raw_map(("op", "ping"), ("op", "ping")))
    with pytest.raises(ProtocolError, match="ext type -1"):
        decode_server_body(pack({**EVENT, "ts": TS4}))


# ------------------------------------------------------------------------------------------ keepalive


@pytest.mark.parametrize("keepalive", [1, 1.0, 1.5, 30, 86400, 86400.0])
def test_keepalive_range_is_1_to_86400_seconds_inclusive(keepalive: float) -> None:
    assert accepted(pack({"op": "login", "uid": 1, "keepalive": keepalive})) == Login("uid", 1, None, keepalive)
    assert accepted(pack({"op": "attach", "uids": [1], "keepalive": keepalive})) == Attach((1,), keepalive)
    assert (MIN_KEEPALIVE, MAX_KEEPALIVE) == (1.0, 86400.0)


@pytest.mark.parametrize("keepalive", [
    1e-300, 0.5, 0.999999, 0, 0.0, -0.0, -1, 86400.0001, 86401, 2**64 - 1, math.nan, math.inf, -math.inf,
], ids=repr)
def test_keepalive_outside_the_range_is_bad_message_naming_the_range(keepalive: float) -> None:
    for obj in ({"op": "login", "uid": 1, "keepalive": keepalive},
                {"op": "attach", "uids": [1], "keepalive": keepalive}):
        err = error_of(pack(obj))
        assert err.code == ErrorCode.BAD_MESSAGE
        assert "keepalive must be a number of seconds in 1..86400" in err.reason


# ------------------------------------------------------------------------------------------ touch ago


@pytest.mark.parametrize("ago", [0, 0.0, 0.01, 1, MAX_TOUCH_AGO])
def test_a_touch_may_say_how_long_ago_its_activity_was_read(ago: float) -> None:
    assert accepted(pack({"op": "touch", "uids": [1], "ago": ago})) == Touch((1,), ago)
    assert accepted(pack({"op": "touch", "uids": [1]})) == Touch((1,))  # absent: now, as before
    assert accepted(pack({"op": "touch", "uids": [1], "ago": None})) == Touch((1,), 0.0)


@pytest.mark.parametrize("ago", [-0.001, -1, MAX_TOUCH_AGO + 0.001, math.nan, math.inf, -math.inf, "1", True],
                         ids=repr)
def test_a_touch_ago_outside_the_range_is_bad_message_naming_the_range(ago: Any) -> None:
    err = error_of(pack({"op": "touch", "uids": [1], "ago": ago}))
    assert err.code == ErrorCode.BAD_MESSAGE
    assert f"ago must be a number of seconds in 0..{MAX_TOUCH_AGO:g}" in err.reason


# ------------------------------------------------------------------------------------- NaN and inf


@pytest.mark.parametrize("field", ["ts", "last_seen", "deadline", "timeout"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=repr)
def test_event_numbers_must_be_finite(field: str, bad: float) -> None:
    err = error_of(pack({**EVENT, field: bad}), parse_server_message)
    assert err.code == ErrorCode.BAD_MESSAGE
    assert err.reason.startswith(f"{field} must be a finite number")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0, -1.0, "45", True], ids=repr)
def test_welcome_timeout_must_be_finite_and_positive(bad: Any) -> None:
    err = error_of(pack({"op": "welcome", "uid": 1, "timeout": bad}), parse_server_message)
    assert err.code == ErrorCode.BAD_MESSAGE
    assert err.reason.startswith("timeout must be a finite number > 0")


def test_finite_numbers_are_still_accepted() -> None:
    assert accepted(pack({"op": "welcome", "uid": 1, "timeout": 1e-3}), parse_server_message) == \
        Welcome("uid", 1, 1e-3)
    event = accepted(pack({**EVENT, "ts": 0, "timeout": 45}), parse_server_message)
    assert isinstance(event, Event) and event.ts == 0.0 and event.extra == {"timeout": 45}
    # msg data is the application's: its floats are passed through untouched, NaN included
    [msg] = outcome(frame(pack({"op": "msg", "data": [math.nan, math.inf]})), parse_client_message, 1)
    assert math.isnan(msg.data[0]) and msg.data[1] == math.inf


def test_parse_functions_reject_the_same_numbers() -> None:
    """The object-level API (no bytes, so no frame rules) enforces the field rules on its own."""
    with pytest.raises(ProtocolError, match="1..86400"):
        parse_client_message({"op": "login", "uid": 1, "keepalive": 1e-300})
    with pytest.raises(ProtocolError, match="deadline must be a finite number"):
        parse_server_message({**EVENT, "deadline": math.inf})


def test_a_custom_parse_function_gets_the_same_frame_rules() -> None:
    def raw(obj: Any) -> Any:  # accepts any value, maps or not
        return obj

    assert outcome(frame(pack([{"a": 1}, {"a": 2}])), raw, 1) == [({"a": 1}, {"a": 2})]
    for body, words in ((raw_array(raw_map(("a", 1), ("a", 2))), "duplicate map key 'a'"),
                        (raw_map(("k", raw_map(("a", 1), ("a", 2)))), "duplicate map key 'a'"),
                        (pack([TS4]), "ext type -1")):
        for chunk in (None, 1):
            err = outcome(frame(body), raw, chunk)
            assert isinstance(err, ProtocolError) and err.code == ErrorCode.BAD_FRAME and words in err.reason
