"""`query` with ``last_seen``, and the `status` maps it brings: byte-exact when not asked, strict and lenient."""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import pytest

from idled.protocol import (
    ErrorCode, ProtocolError, Query, Status, decode_client_body, decode_server_body, encode, parse_client_message,
    parse_server_message,
)


def body(obj: Any) -> bytes:
    return msgpack.packb(obj)


def frame_of(obj: Any) -> bytes:
    data = body(obj)
    return struct.pack(">I", len(data)) + data


def test_without_the_flag_frames_are_todays_byte_for_byte() -> None:
    assert encode(Query((1, "1"))) == frame_of({"op": "query", "uids": (1, "1")})
    assert encode(Status({1: True, "b": False})) == frame_of({"op": "status", "online": {1: True, "b": False}})
    assert decode_client_body(body({"op": "query", "uids": [1]})) == Query((1,), False)
    assert decode_client_body(body({"op": "query", "uids": [1], "last_seen": False})) == Query((1,), False)
    assert decode_client_body(body({"op": "query", "uids": [1], "last_seen": None})) == Query((1,), False)


def test_query_last_seen_round_trips() -> None:
    frame = encode(Query(("bob", 7), last_seen=True))
    assert frame == frame_of({"op": "query", "uids": ("bob", 7), "last_seen": True})
    assert decode_client_body(frame[4:]) == Query(("bob", 7), True)


@pytest.mark.parametrize("obj", [
    {"op": "query", "uids": [1], "last_seen": 1},
    {"op": "query", "uids": [1], "last_seen": "yes"},
    {"op": "query", "last_seen": True},
    {"op": "query", "uids": [1], "last_seen": True, "x": 1},
    {"op": "query", "uids": [1.5], "last_seen": True},
])
def test_bad_queries_are_bad_messages(obj: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_message(msgpack.unpackb(body(obj), use_list=False))
    assert info.value.code == ErrorCode.BAD_MESSAGE


def test_status_maps_round_trip_with_mixed_uid_keys() -> None:
    status = Status(
        {"bob": False, 42: True, "42": False},
        last_seen={"bob": 1.7e9 + 0.25, 42: 1.7e9, "42": None},
        devices={42: ("phone", "laptop")},
    )
    decoded = decode_server_body(encode(status)[4:])
    assert decoded == status
    assert type(decoded) is Status and set(decoded.last_seen or {}) == {"bob", 42, "42"}


def test_status_parse_is_lenient_about_int_times_and_absent_maps() -> None:
    parsed = parse_server_message({"op": "status", "online": {"a": False}, "last_seen": {"a": 17}})
    assert parsed == Status({"a": False}, {"a": 17.0}, None)
    assert type(parsed.last_seen["a"]) is float  # type: ignore[index]
    assert parse_server_message({"op": "status", "online": {}, "future": 1}) == Status({})


@pytest.mark.parametrize("obj", [
    {"op": "status", "online": {}, "last_seen": [1]},
    {"op": "status", "online": {}, "last_seen": {"a": "x"}},
    {"op": "status", "online": {}, "last_seen": {"a": math.inf}},
    {"op": "status", "online": {}, "last_seen": {1.5: 1.0}},
    {"op": "status", "online": {}, "devices": {"a": "phone"}},
    {"op": "status", "online": {}, "devices": {"a": (1,)}},
    {"op": "status", "online": {}, "devices": []},
])
def test_bad_status_maps_are_bad_messages(obj: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_server_message(obj)
    assert info.value.code == ErrorCode.BAD_MESSAGE
