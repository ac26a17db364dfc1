"""Devices on the wire: `Login.device`, session keys ([uid, device]) in gateway frames and `ended` notices."""

from __future__ import annotations

import struct
import timeit
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.protocol import (
    MAX_DEVICE_BYTES, Attach, Detach, Ended, ErrorCode, Login, ProtocolError, Query, Touch, check_device, check_key,
    decode_client_body, decode_server_body, encode,
)


def body(obj: Any) -> bytes:
    return msgpack.packb(obj)


def decode(obj: Any) -> Any:
    return decode_client_body(body(obj))


def test_login_device_round_trips_and_names_the_key() -> None:
    login = Login("uid", "alice", None, 30.0, device="phone")
    assert decode_client_body(encode(login)[4:]) == login
    assert login.key == ("alice", "phone")
    assert Login("uid", 42).key == 42
    assert decode({"op": "login", "uid": 7, "device": "é" * 32}) == Login("uid", 7, device="é" * 32)


def test_a_login_without_device_encodes_as_before() -> None:
    # old clients: the frame has no device key at all
    assert encode(Login("uid", "alice", None, 30.0)) == encode(Login("uid", "alice", None, 30.0, device=None))
    assert b"device" not in encode(Login("uid", "alice", None, 30.0))
    assert msgpack.unpackb(encode(Login("uid", "a", None, 30.0))[4:]) == {"op": "login", "uid": "a", "keepalive": 30.0}


BAD_LOGINS: dict[str, dict[str, Any]] = {
    "device empty": {"op": "login", "uid": 1, "device": ""},
    "device int": {"op": "login", "uid": 1, "device": 5},
    "device bytes": {"op": "login", "uid": 1, "device": b"d"},
    "device list": {"op": "login", "uid": 1, "device": ["d"]},
    "device too long": {"op": "login", "uid": 1, "device": "d" * (MAX_DEVICE_BYTES + 1)},
    "device too many bytes": {"op": "login", "uid": 1, "device": "é" * 33},
    "device on a gateway login": {"op": "login", "gateway": "g", "device": "d"},
    "device on an observer login": {"op": "login", "observer": "o", "device": "d"},
}


@pytest.mark.parametrize("obj", BAD_LOGINS.values(), ids=list(BAD_LOGINS))
def test_bad_device_logins_are_bad_message(obj: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(obj)
    assert info.value.code == ErrorCode.BAD_MESSAGE
    assert "device" in info.value.reason


def test_device_at_the_limit_is_accepted() -> None:
    assert decode({"op": "login", "uid": 1, "device": "d" * MAX_DEVICE_BYTES}).device == "d" * MAX_DEVICE_BYTES
    assert check_device("é" * 32) == "é" * 32


@pytest.mark.parametrize("op", ["attach", "touch", "detach"])
def test_gateway_frames_carry_session_keys_as_tuples(op: str) -> None:
    msg = decode({"op": op, "uids": [1, ["alice", "phone"], "bob", [2, "d"], ["alice", "laptop"]]})
    assert msg.uids == (1, ("alice", "phone"), "bob", (2, "d"), ("alice", "laptop"))
    # the decoded element IS the key: hashable, equal to the tuple a login makes
    assert Login("uid", "alice", device="phone").key in set(msg.uids)
    assert decode_client_body(encode(msg)[4:]) == msg


def test_detach_with_reason_and_keys() -> None:
    msg = decode({"op": "detach", "uids": [["a", "d"]], "reason": "closed"})
    assert msg == Detach((("a", "d"),), "closed")


BAD_KEYS: dict[str, Any] = {
    "one element": [1],
    "three elements": [1, "d", "x"],
    "empty array": [],
    "bad uid": [-1, "d"],
    "bool uid": [True, "d"],
    "uid too long": ["u" * 257, "d"],
    "empty uid": ["", "d"],
    "empty device": [1, ""],
    "int device": [1, 2],
    "nil device": [1, None],
    "device too long": [1, "d" * 65],
    "device map": [1, {"a": 1}],
    "nested key": [[1, "d"], "d"],
}


@pytest.mark.parametrize("op", ["attach", "touch", "detach"])
@pytest.mark.parametrize("key", BAD_KEYS.values(), ids=list(BAD_KEYS))
def test_bad_session_keys_are_bad_message(op: str, key: Any) -> None:
    with pytest.raises(ProtocolError) as info:
        decode({"op": op, "uids": [1, "ok", key]})
    assert info.value.code == ErrorCode.BAD_MESSAGE
    assert "uids[2]" in info.value.reason


def test_duplicate_keys_inside_a_device_map_are_still_bad_frame() -> None:
    raw = b"\x82\xa2op\xa5touch\xa4uids\x91\x92\x01\x82\xa1a\x01\xa1a\x02"  # [[1, {a:1, a:2}]]
    with pytest.raises(ProtocolError) as info:
        decode_client_body(raw)
    assert info.value.code == ErrorCode.BAD_FRAME


def test_query_takes_plain_uids_only() -> None:
    assert decode({"op": "query", "uids": [1, "a"]}) == Query((1, "a"))
    with pytest.raises(ProtocolError) as info:
        decode({"op": "query", "uids": [["a", "d"]]})
    assert info.value.code == ErrorCode.BAD_MESSAGE


def test_check_key() -> None:
    assert check_key(5) == 5
    assert check_key(("a", "d")) == ("a", "d")
    for bad in ((1,), ("a", ""), ("a", 1), [1, "d"], True):
        with pytest.raises(ProtocolError):
            check_key(bad)


def test_ended_notices_carry_keys_and_clients_parse_them() -> None:
    ended = Ended((("alice", "phone"), 7, ("bob", "d")), "kicked")
    frame = encode(ended)
    assert msgpack.unpackb(frame[4:]) == {"op": "ended", "uids": [["alice", "phone"], 7, ["bob", "d"]],
                                          "reason": "kicked"}
    assert decode_server_body(frame[4:]) == ended
    with pytest.raises(ProtocolError):
        decode_server_body(body({"op": "ended", "uids": [["a"]], "reason": "idle"}))


def test_plain_uid_frames_encode_exactly_as_before() -> None:
    # what a gateway without devices sends: the same bytes as before session keys existed
    for msg, obj in ((Touch((1, "a")), {"op": "touch", "uids": [1, "a"]}),
                     (Attach((1,), 30.0), {"op": "attach", "uids": [1], "keepalive": 30.0}),
                     (Ended((1,), "idle"), {"op": "ended", "uids": [1], "reason": "idle"})):
        raw = body(obj)
        assert encode(msg) == struct.pack(">I", len(raw)) + raw


keys = (st.integers(0, 2**63 - 1) | st.text(min_size=1, max_size=64)
        | st.tuples(st.integers(0, 2**63 - 1) | st.text(min_size=1, max_size=64), st.text(min_size=1, max_size=16)))


@settings(max_examples=200, deadline=None)
@given(st.lists(keys, max_size=20).map(tuple), st.sampled_from([Attach, Touch, Detach]))
def test_any_keys_round_trip(uids: tuple[Any, ...], kind: type) -> None:
    msg = kind(uids)
    assert decode_client_body(encode(msg)[4:]) == msg
    assert decode_server_body(encode(Ended(uids, "idle"))[4:]) == Ended(uids, "idle")


def _uid_loop(value: tuple[Any, ...]) -> tuple[Any, ...]:
    """The uid-only validation loop as it was before devices (the reference the test below times against)."""
    from idled.protocol.parse import MAX_INT_UID, MAX_UID_BYTES, check_uid

    for i, u in enumerate(value):
        t = type(u)
        if t is int:
            if 0 <= u <= MAX_INT_UID:
                continue
        elif t is str:
            n = len(u)
            if n and (n <= MAX_UID_BYTES // 4 or len(u.encode()) <= MAX_UID_BYTES):
                continue
        check_uid(u, f"uids[{i}]")
    return value


def test_plain_touches_are_not_slowed_by_keys() -> None:
    """The key branch comes after the uid branches: a frame of plain uids validates as fast as before.

    Compared against a copy of the old, uid-only loop in one run."""
    from idled.protocol.parse import _key_list

    plain = tuple(range(1000)) + tuple(f"user-{i}" for i in range(1000))
    best_keys = best_uids = float("inf")
    for _ in range(15):  # interleaved, so that a busy moment of the machine hits both
        best_keys = min(best_keys, timeit.timeit(lambda: _key_list(plain), number=20))
        best_uids = min(best_uids, timeit.timeit(lambda: _uid_loop(plain), number=20))
    assert best_keys < best_uids * 1.5, (best_keys, best_uids)  # equal in fact; slack for a busy machine


@pytest.mark.parametrize("frame", [(1, "ok", ("a", "d")), (1, ("a", ""),), (("a", "d", "x"),), ((),), (None,), (-1,),
                                   ("",), ("u" * 257,), (1, ("a", "d"), -1), (1, -1, ("a", "d"))])
def test_query_refuses_what_it_refused_before_with_the_same_message(frame: tuple[Any, ...]) -> None:
    """A query's uids go through the gateway frames' loop, uid-only: the same first error, the same words."""
    from idled.protocol.parse import _uid_list

    with pytest.raises(ProtocolError) as new:
        _uid_list(frame)
    with pytest.raises(ProtocolError) as old:
        _uid_loop(frame)
    assert (new.value.code, new.value.reason) == (old.value.code, old.value.reason)
