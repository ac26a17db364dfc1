"""Wire codec: bytes in, typed messages or typed errors out -- never anything else."""

from __future__ import annotations

import math
import struct
import sys
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.protocol import (
    BYE, BYE_FRAME, DEFAULT_MAX_FRAME, MAX_DATA_DEPTH, NEED_DATA, PING, PING_FRAME, PONG, PONG_FRAME, QUIET, QUIET_FRAME,
    Attach, Bye, Detach, Error, ErrorCode, Event, FrameDecoder, Login, Mark, Marked, Msg, Ping, Pong, ProtocolError,
    Query,
    Status, Subscribe, Touch, Welcome, check_uid, decode_client_body, encode, parse_client_message, parse_server_message,
)
from idled.protocol import Unwatch, Watch

CLIENT_MESSAGES = [
    Login("uid", 42, "tok", 30.0),
    Login("uid", "alice"),
    Login("uid", "42", None, 1.5),
    Login("uid", 7, None, 1),
    Login("uid", 8, None, 86400.0),
    Login("gateway", "gw-1", "t"),
    Login("gateway", "edge-1", None, None, ended=True, marks=True),
    Login("observer", "obs"),
    PING,
    Msg({"text": "hi", "n": (1, 2.5, None, True, b"\x00")}),
    Msg(None),
    Msg(7),
    BYE,
    Attach((1, "two", 3, 3), 20.0),
    Attach(()),
    Touch(tuple(range(1000))),
    Touch((1, "a"), 0.09),
    Detach(("a", 2**63 - 1, 0)),
    Marked(123456.789),
    Subscribe(),
    Subscribe(0),
    Subscribe(2**63 - 1),
    Query((1, "1")),
]

SERVER_MESSAGES = [
    Welcome("uid", 42, 45.0),
    Welcome("uid", "alice", 45.0),
    Welcome("gateway", "gw-1", None, 1 << 20),
    Welcome("observer", "obs"),
    PONG,
    Event(7, "offline", "alice", 1.7e9, "timeout", 1.7e9 - 45, 1.7e9, {"timeout": 45.0, "detector": "wheel"}),
    Event(0, "online", 42, 1.7e9, "login", 1.7e9, 1.7e9 + 45),
    Status({1: True, "1": False, "bob": True}),
    Error(ErrorCode.KICKED, "a newer login replaced this connection"),
    Error("some_future_code", ""),
    Mark(123456.789),
    Welcome("gateway", "edge-1", 45.0, 1 << 20, 1.0, 3600.0, ages=True),
]


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def packed(obj: Any) -> bytes:
    return frame(msgpack.packb(obj))


def drain(decoder: FrameDecoder) -> list[Any]:
    out = []
    while (event := decoder.next_event()) is not NEED_DATA:
        out.append(event)
    return out


def decode_all(data: bytes, chunk: int | None = None, parse=parse_client_message, max_frame=DEFAULT_MAX_FRAME):
    decoder = FrameDecoder(max_frame, parse)
    out: list[Any] = []
    step = chunk or max(len(data), 1)
    for i in range(0, len(data), step):
        decoder.receive_data(data[i : i + step])
        out.extend(drain(decoder))
    assert decoder.buffered == 0
    return out


def error_of(data: bytes, parse=parse_client_message, max_frame=DEFAULT_MAX_FRAME) -> ProtocolError:
    decoder = FrameDecoder(max_frame, parse)
    decoder.receive_data(data)
    with pytest.raises(ProtocolError) as info:
        drain(decoder)
    return info.value


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("msg", CLIENT_MESSAGES, ids=repr)
def test_client_message_round_trip_one_chunk_and_byte_by_byte(msg: Any) -> None:
    data = encode(msg)
    assert decode_all(data) == [msg]
    assert decode_all(data, chunk=1) == [msg]


@pytest.mark.parametrize("msg", SERVER_MESSAGES, ids=repr)
def test_server_message_round_trip(msg: Any) -> None:
    data = encode(msg)
    assert decode_all(data, parse=parse_server_message) == [msg]
    assert decode_all(data, chunk=1, parse=parse_server_message) == [msg]


def test_stream_of_every_client_message_in_one_chunk_and_in_odd_chunks() -> None:
    data = b"".join(encode(m) for m in CLIENT_MESSAGES)
    for chunk in (None, 1, 3, 7, 4096):
        assert decode_all(data, chunk) == CLIENT_MESSAGES


def test_wire_bytes_are_the_documented_format() -> None:
    assert PING_FRAME == b"\x00\x00\x00\x09\x81\xa2op\xa4ping"
    assert encode(PONG) == PONG_FRAME == packed({"op": "pong"})
    assert encode(BYE) == BYE_FRAME == packed({"op": "bye"})
    assert msgpack.unpackb(encode(Login("uid", 42, "t", 30.0))[4:]) == {
        "op": "login", "uid": 42, "token": "t", "keepalive": 30.0}
    assert msgpack.unpackb(encode(Subscribe(5))[4:]) == {"op": "subscribe", "from": 5}
    assert msgpack.unpackb(encode(Error(ErrorCode.BUSY, "full"))[4:]) == {
        "op": "error", "code": "busy", "reason": "full"}
    event = msgpack.unpackb(encode(SERVER_MESSAGES[5])[4:])
    assert event == {"op": "event", "seq": 7, "kind": "offline", "uid": "alice", "ts": 1.7e9,
                     "reason": "timeout", "last_seen": 1.7e9 - 45, "deadline": 1.7e9,
                     "timeout": 45.0, "detector": "wheel"}


def test_ping_and_bye_decode_to_shared_singletons_however_encoded() -> None:
    # a client library may spell the map differently (str8 key): the slow path must agree with the fast one
    alt = frame(b"\x81\xd9\x02op\xa4ping")
    events = decode_all(PING_FRAME + alt + PING_FRAME * 3 + BYE_FRAME)
    assert events == [PING] * 5 + [BYE]
    assert all(e is PING for e in events[:5]) and events[5] is BYE
    assert isinstance(PING, Ping) and isinstance(BYE, Bye) and isinstance(PONG, Pong)


def test_uids_keep_their_type_and_duplicates() -> None:
    [msg] = decode_all(packed({"op": "touch", "uids": [42, "42", 42]}))
    assert msg == Touch((42, "42", 42))
    assert [type(u) for u in msg.uids] == [int, str, int]


def test_nil_optional_fields_count_as_absent() -> None:
    data = packed({"op": "login", "uid": 1, "gateway": None, "token": None, "keepalive": None})
    assert decode_all(data) == [Login("uid", 1)]
    assert decode_all(packed({"op": "subscribe", "from": None})) == [Subscribe()]
    assert decode_all(packed({"op": "msg"})) == [Msg(None)]


def test_uid_limits() -> None:
    ok = [0, 2**63 - 1, "x", "é" * 128, "😀" * 64, "a" * 256]
    assert decode_all(packed({"op": "query", "uids": ok})) == [Query(tuple(ok))]
    for bad in (-1, 2**63, 2**64 - 1, "", "a" * 257, "😀" * 65, True, False, 1.0, None, b"x", [1], {"a": 1}):
        err = error_of(packed({"op": "login", "uid": bad}))
        assert err.code == ErrorCode.BAD_MESSAGE, bad
        with pytest.raises(ProtocolError):
            check_uid(bad)


# --------------------------------------------------------------------------------------------- framing


def test_too_large_is_raised_on_the_header_alone_and_nothing_is_buffered() -> None:
    decoder = FrameDecoder(max_frame=100)
    decoder.receive_data(struct.pack(">I", 101))
    with pytest.raises(ProtocolError) as info:
        decoder.next_event()
    assert info.value.code == ErrorCode.TOO_LARGE
    assert "101" in info.value.reason and "100" in info.value.reason
    # failed for good: data is dropped, the same error again and again
    decoder.receive_data(b"x" * 10_000)
    assert decoder.buffered == 0 and decoder.failed
    for _ in range(3):
        with pytest.raises(ProtocolError) as again:
            decoder.next_event()
        assert again.value.code == ErrorCode.TOO_LARGE


def test_too_large_fed_byte_by_byte_fails_at_the_fourth_byte() -> None:
    decoder = FrameDecoder(max_frame=4096)
    header = struct.pack(">I", 0xFFFF_FFFF)
    for byte in header[:3]:
        decoder.receive_data(bytes([byte]))
        assert decoder.next_event() is NEED_DATA
    decoder.receive_data(header[3:])
    with pytest.raises(ProtocolError, match="too_large"):
        decoder.next_event()


def test_frames_before_an_oversized_one_are_still_delivered() -> None:
    decoder = FrameDecoder(max_frame=64)
    decoder.receive_data(PING_FRAME + struct.pack(">I", 65) + b"\x00" * 65)
    assert decoder.next_event() is PING
    with pytest.raises(ProtocolError, match="too_large"):
        decoder.next_event()


def test_max_frame_boundary_and_raising_it_after_login() -> None:
    body = msgpack.packb({"op": "msg", "data": "x" * 100})
    assert decode_all(frame(body), max_frame=len(body)) == [Msg("x" * 100)]
    assert error_of(frame(body), max_frame=len(body) - 1).code == ErrorCode.TOO_LARGE

    big = encode(Attach(tuple(range(100_000))))
    assert len(big) > DEFAULT_MAX_FRAME
    decoder = FrameDecoder()
    decoder.receive_data(encode(Login("gateway", "gw")))
    assert decoder.next_event() == Login("gateway", "gw")
    decoder.max_frame = 1 << 20  # what the server does once a gateway is logged in
    for i in range(0, len(big), 65536):
        decoder.receive_data(big[i : i + 65536])
    [attach] = drain(decoder)
    assert attach.uids == tuple(range(100_000))
    for bad in (0, -1, 2**32, 1.5, True):
        with pytest.raises(ValueError):
            decoder.max_frame = bad


def test_truncated_frames_just_wait_for_more() -> None:
    data = encode(Login("uid", "alice", "tok"))
    for cut in range(len(data)):
        decoder = FrameDecoder()
        decoder.receive_data(data[:cut])
        assert decoder.next_event() is NEED_DATA
        assert decoder.buffered == cut
        decoder.receive_data(data[cut:])
        assert decoder.next_event() == Login("uid", "alice", "tok")
        assert decoder.next_event() is NEED_DATA


def test_idle_decoder_is_small_and_holds_no_buffer() -> None:
    decoder = FrameDecoder()
    assert not hasattr(decoder, "__dict__")
    assert sys.getsizeof(decoder) <= 100
    # many frames and a partial one in a single chunk: only the partial frame is kept afterwards
    tail = encode(Msg("x" * 50))
    decoder.receive_data(PING_FRAME * 1000 + tail[:10])
    assert drain(decoder) == [PING] * 1000
    assert decoder.buffered == 10
    assert sys.getsizeof(decoder._buf) < 200  # not the 10 KB chunk it arrived in
    decoder.receive_data(tail[10:])
    assert drain(decoder) == [Msg("x" * 50)]
    assert decoder._buf == b"" and decoder.buffered == 0


def test_the_quiet_keepalive_is_the_msg_without_data_in_any_split() -> None:
    # {"op":"msg"} is recognised by its bytes (like ping): the shared QUIET, equal to what msgpack decodes
    assert QUIET_FRAME == b"\x00\x00\x00\x08\x81\xa2op\xa3msg" and QUIET == Msg()
    assert decode_client_body(QUIET_FRAME[4:]) == QUIET
    stream = QUIET_FRAME + PING_FRAME + QUIET_FRAME + encode(Msg(None)) + QUIET_FRAME
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        events = []
        for chunk in (stream[:cut], stream[cut:]):
            decoder.receive_data(chunk)
            while (event := decoder.next_event()) is not NEED_DATA:
                events.append(event)
        assert events == [QUIET, PING, QUIET, Msg(None), QUIET]
    decoder = FrameDecoder()
    decoder.receive_data(QUIET_FRAME)
    assert decoder.next_event() is QUIET  # a lone one: by its bytes, no msgpack


def test_caller_buffers_are_copied_when_mutable() -> None:
    decoder = FrameDecoder()
    chunk = bytearray(PING_FRAME)
    decoder.receive_data(chunk)
    chunk[:] = b"\xff" * len(chunk)  # the caller reuses its receive buffer
    assert decoder.next_event() is PING
    decoder.receive_data(memoryview(BYE_FRAME))
    assert decoder.next_event() is BYE


# ------------------------------------------------------------------------------------- malformed input

BAD_FRAMES = {
    "empty frame": (b"", "empty"),
    "truncated msgpack": (b"\x82\xa2op\xa4ping", "truncated"),
    "trailing bytes": (msgpack.packb({"op": "ping"}) + b"\x00", "trailing"),
    "reserved byte": (b"\xc1", "invalid msgpack"),
    "invalid utf-8 value": (b"\x81\xa2op\xa2\xff\xfe", "UTF-8"),
    "invalid utf-8 key": (b"\x81\xa2\xc3\x28\xa4ping", "UTF-8"),
    "int key": (b"\x81\x01\xa4ping", "map keys"),
    "array key": (b"\x81\x91\x01\xa4ping", "map keys"),
    "map key": (b"\x81\x80\xa4ping", "map keys"),
    "ext type": (msgpack.packb({"op": "msg", "data": msgpack.ExtType(5, b"x")}), "ext"),
    "ext type in ignored place": (msgpack.packb({"op": "ping", "x": msgpack.ExtType(1, b"")}), "ext"),
    "timestamp ext": (msgpack.packb({"op": "msg", "data": [msgpack.Timestamp(1)]}), "ext"),
    "array nesting bomb": (b"\x91" * 100_000 + b"\xc0", "too deep"),
    "map nesting bomb": (b"\x81\xa1a" * 2000 + b"\xc0", "too deep"),
    "huge array header": (b"\xdd\xff\xff\xff\xff", "exceeds"),
    "huge map header": (b"\xdf\xff\xff\xff\xff", "exceeds"),
    "huge str header": (b"\xdb\xff\xff\xff\xff", "truncated"),
}


@pytest.mark.parametrize("name", BAD_FRAMES)
def test_undecodable_bodies_are_bad_frame(name: str) -> None:
    body, words = BAD_FRAMES[name]
    err = error_of(frame(body), max_frame=1 << 20)
    assert err.code == ErrorCode.BAD_FRAME
    assert words in err.reason
    # byte by byte it is the same error
    decoder = FrameDecoder(1 << 20)
    with pytest.raises(ProtocolError) as info:
        for byte in frame(body)[:2000]:
            decoder.receive_data(bytes([byte]))
            decoder.next_event()
        if len(body) + 4 > 2000:
            decoder.receive_data(frame(body)[2000:])
            decoder.next_event()
    assert info.value.code == ErrorCode.BAD_FRAME


BAD_MESSAGES: dict[str, Any] = {
    "array": [1, 2],
    "int": 5,
    "nil": None,
    "str": "ping",
    "bytes key only": {b"op": "ping"},
    "missing op": {"uid": 1},
    "op not str": {"op": 1},
    "op is a map": {"op": {"a": 1}},
    "op is bytes": {"op": b"ping"},
    "unknown op": {"op": "pong"},
    "unknown field in ping": {"op": "ping", "extra": 1},
    "unknown field in login": {"op": "login", "uid": 1, "keep_alive": 30},
    "no identity": {"op": "login", "token": "t"},
    "two identities": {"op": "login", "uid": 1, "gateway": "g"},
    "gateway int": {"op": "login", "gateway": 5},
    "gateway empty": {"op": "login", "gateway": ""},
    "gateway too long": {"op": "login", "gateway": "g" * 129},
    "observer list": {"op": "login", "observer": ["o"]},
    "token int": {"op": "login", "uid": 1, "token": 5},
    "token bytes": {"op": "login", "uid": 1, "token": b"t"},
    "token too long": {"op": "login", "uid": 1, "token": "t" * 1025},
    "keepalive str": {"op": "login", "uid": 1, "keepalive": "30"},
    "keepalive bool": {"op": "login", "uid": 1, "keepalive": True},
    "keepalive nan": {"op": "login", "uid": 1, "keepalive": math.nan},
    "keepalive inf": {"op": "login", "uid": 1, "keepalive": math.inf},
    "keepalive zero": {"op": "login", "uid": 1, "keepalive": 0},
    "keepalive negative": {"op": "login", "uid": 1, "keepalive": -5.0},
    "keepalive too big": {"op": "login", "uid": 1, "keepalive": 86401},
    "keepalive huge int": {"op": "login", "uid": 1, "keepalive": 2**64 - 1},
    "keepalive on gateway login": {"op": "login", "gateway": "g", "keepalive": 30},
    "attach without uids": {"op": "attach"},
    "attach uids not array": {"op": "attach", "uids": 5},
    "attach uids map": {"op": "attach", "uids": {"a": 1}},
    "attach bad element": {"op": "attach", "uids": [1, 2, -3]},
    "attach bool element": {"op": "attach", "uids": [1, True]},
    "attach keepalive nan": {"op": "attach", "uids": [1], "keepalive": math.nan},
    "touch nested list": {"op": "touch", "uids": [[1]]},
    "detach float": {"op": "detach", "uids": [1.0]},
    "detach unknown field": {"op": "detach", "uids": [], "keepalive": 3},
    "subscribe negative": {"op": "subscribe", "from": -1},
    "subscribe bool": {"op": "subscribe", "from": True},
    "subscribe float": {"op": "subscribe", "from": 1.0},
    "subscribe str": {"op": "subscribe", "from": "1"},
    "subscribe too big": {"op": "subscribe", "from": 2**63},
    "query without uids": {"op": "query"},
    "msg unknown field": {"op": "msg", "data": 1, "x": 2},
    "marks on a user login": {"op": "login", "uid": 1, "marks": True},
    "marks not a bool": {"op": "login", "gateway": "g", "marks": 1},
    "marked without t": {"op": "marked"},
    "marked t nan": {"op": "marked", "t": math.nan},
    "marked t str": {"op": "marked", "t": "1"},
    "marked unknown field": {"op": "marked", "t": 1.0, "n": 2},
}
_value: Any = 1
for _ in range(MAX_DATA_DEPTH + 1):
    _value = [_value]
BAD_MESSAGES["msg data too deep"] = {"op": "msg", "data": _value}
BAD_MESSAGES["msg data map too deep"] = {"op": "msg", "data": {"a": _value[0]}}


@pytest.mark.parametrize("name", BAD_MESSAGES)
def test_invalid_messages_are_bad_message(name: str) -> None:
    err = error_of(packed(BAD_MESSAGES[name]))
    assert err.code == ErrorCode.BAD_MESSAGE
    assert err.reason and len(err.reason) < 200
    assert str(err).startswith("bad_message: ")


def test_data_at_the_depth_limit_is_accepted() -> None:
    value: Any = 1
    for _ in range(MAX_DATA_DEPTH):
        value = (value,)
    assert decode_all(packed({"op": "msg", "data": value})) == [Msg(value)]


def test_error_reasons_never_echo_big_values() -> None:
    err = error_of(packed({"op": "x" * 3000}))
    assert err.code == ErrorCode.BAD_MESSAGE and len(err.reason) < 100


def test_server_messages_are_validated_too() -> None:
    for obj in (
        {"op": "event", "seq": 1, "kind": "sideways", "uid": 1, "ts": 1.0, "reason": "r", "last_seen": 1.0,
         "deadline": 1.0},
        {"op": "event", "seq": 1, "kind": "online", "uid": 1, "ts": 1.0, "reason": "r", "last_seen": 1.0},
        {"op": "event", "seq": 1, "kind": "online", "uid": 1.5, "ts": 1.0, "reason": "r", "last_seen": 1.0,
         "deadline": 1.0},
        {"op": "event", "seq": 1, "kind": "online", "uid": 1, "ts": math.nan, "reason": "r", "last_seen": 1.0,
         "deadline": 1.0},
        {"op": "status", "online": {1: 1}},
        {"op": "status", "online": {1.5: True}},
        {"op": "status", "online": [1]},
        {"op": "welcome"},
        {"op": "welcome", "uid": 1, "timeout": "45"},
        {"op": "error", "code": 5, "reason": "r"},
        {"op": "ping"},
    ):
        assert error_of(packed(obj), parse=parse_server_message).code == ErrorCode.BAD_MESSAGE, obj
    # lenient about new fields: ignored, or carried in Event.extra
    welcome = {"op": "welcome", "observer": "o", "motd": "hello"}
    assert decode_all(packed(welcome), parse=parse_server_message) == [Welcome("observer", "o")]
    # unhashable status keys end as ProtocolError too (the client-side decoder allows non-str keys)
    assert error_of(frame(b"\x82\xa2op\xa6status\xa6online\x81\x80\xc3"),
                    parse=parse_server_message).code == ErrorCode.BAD_FRAME


def test_event_extra_may_not_shadow_standard_fields() -> None:
    with pytest.raises(ValueError):
        encode(Event(1, "online", 1, 1.0, "login", 1.0, 2.0, {"seq": 5}))


def test_error_codes_are_the_documented_strings() -> None:
    assert {c.value for c in ErrorCode} >= {
        "bad_frame", "too_large", "bad_message", "auth_failed", "login_timeout", "not_logged_in",
        "idle_timeout", "kicked", "busy", "server_shutdown", "gone"}
    assert ErrorCode.KICKED == "kicked"
    err = ProtocolError(ErrorCode.TOO_LARGE, "frame of 5 bytes")
    assert (err.code, err.reason, str(err)) == ("too_large", "frame of 5 bytes", "too_large: frame of 5 bytes")


# ------------------------------------------------------------------------------------------- hypothesis

OUTCOME_TYPES = (Login, Ping, Msg, Bye, Attach, Touch, Detach, Subscribe, Query)
OUTCOME_TYPES += (Watch, Unwatch)


def run_decoder(data: bytes, cuts: list[int], max_frame: int, parse=parse_client_message) -> list[Any]:
    """Feed `data` in pieces; every outcome must be a message, NEED_DATA, or ProtocolError."""
    decoder = FrameDecoder(max_frame, parse)
    out: list[Any] = []
    start = 0
    for cut in sorted(cuts) + [len(data)]:
        decoder.receive_data(data[start:cut])
        start = max(start, cut)
        try:
            out.extend(drain(decoder))
        except ProtocolError as exc:
            assert isinstance(exc.code, ErrorCode) and exc.reason
            with pytest.raises(ProtocolError):
                decoder.next_event()
            out.append(exc)
            break
    return out


cuts_st = st.lists(st.integers(0, 300), max_size=8)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=300), cuts=cuts_st, max_frame=st.integers(1, 512))
def test_arbitrary_bytes_only_yield_messages_or_protocol_errors(data: bytes, cuts: list[int], max_frame: int) -> None:
    for item in run_decoder(data, cuts, max_frame):
        assert isinstance(item, (*OUTCOME_TYPES, ProtocolError))


@settings(max_examples=500, deadline=None)
@given(bodies=st.lists(st.binary(max_size=60), max_size=4), cuts=cuts_st)
def test_well_framed_random_bodies_only_yield_messages_or_protocol_errors(bodies: list[bytes], cuts) -> None:
    data = b"".join(frame(b) for b in bodies)
    for parse in (parse_client_message, parse_server_message):
        for item in run_decoder(data, cuts, 4096, parse):
            assert isinstance(item, (*OUTCOME_TYPES, *map(type, SERVER_MESSAGES), ProtocolError))


scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
           | st.text(max_size=8) | st.binary(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=10)
FIELDS = {  # the fields each op may carry, plus one nobody defines
    "login": ["uid", "gateway", "observer", "token", "keepalive"], "ping": [], "msg": ["data"], "bye": [],
    "attach": ["uids", "keepalive"], "touch": ["uids"], "detach": ["uids"], "subscribe": ["from", "uids"],
    "watch": ["uids"], "unwatch": ["uids"],
    "query": ["uids"], "welcome": ["uid", "gateway", "observer", "timeout", "max_frame"], "pong": [],
    "event": ["seq", "kind", "uid", "ts", "reason", "last_seen", "deadline", "timeout"], "status": ["online"],
    "error": ["code", "reason"], "nope": [],
}
plausible = (st.sampled_from([0, 1, 42, 2**63, -1, 30.0, 0.0, math.nan, "online", "offline", "", "a"])
             | st.lists(st.integers(-1, 3) | st.text(max_size=2), max_size=3)
             | st.dictionaries(st.integers(-1, 3) | st.text(max_size=2), st.booleans() | st.none(), max_size=2))
maps = st.sampled_from(sorted(FIELDS)).flatmap(lambda op: st.builds(
    lambda fields: {"op": op, **fields},
    st.dictionaries(st.sampled_from(FIELDS[op] + ["x"]), values | plausible, max_size=len(FIELDS[op]) + 1)))
maps = maps | st.builds(lambda op: {"op": op}, values)


@settings(max_examples=1000, deadline=None)
@given(obj=maps)
def test_random_maps_parse_to_a_message_or_a_protocol_error(obj: dict[str, Any]) -> None:
    data = packed(obj)
    for parse in (parse_client_message, parse_server_message):
        for item in run_decoder(data, [], 4096, parse):
            if not isinstance(item, ProtocolError):
                # whatever was accepted re-encodes to a frame that decodes to the same message (compared
                # as bytes: NaN inside msg data is never equal to itself)
                [again] = run_decoder(encode(item), [], 4096, parse)
                assert encode(again) == encode(item)


uids = st.integers(0, 2**63 - 1) | st.text(min_size=1, max_size=64)
names = st.text(min_size=1, max_size=32)
keepalives = st.none() | st.floats(min_value=1.0, max_value=86400.0)
client_messages = st.one_of(
    st.builds(Login, st.just("uid"), uids, st.none() | st.text(max_size=50), keepalives),
    st.builds(Login, st.sampled_from(["gateway", "observer"]), names, st.none() | st.text(max_size=50)),
    st.just(PING), st.just(BYE),
    st.builds(Msg, st.recursive(scalars.filter(lambda v: not (isinstance(v, float) and math.isnan(v))),
                                lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)),
    st.builds(Attach, st.lists(uids, max_size=20).map(tuple), keepalives),
    st.builds(Touch, st.lists(uids, max_size=20).map(tuple)),
    st.builds(Detach, st.lists(uids, max_size=20).map(tuple)),
    st.builds(Subscribe, st.none() | st.integers(0, 2**63 - 1)),
    st.builds(Query, st.lists(uids, max_size=20).map(tuple)),
    st.builds(Subscribe, st.none() | st.integers(0, 2**63 - 1), st.booleans(),
              st.none() | st.lists(uids, max_size=20).map(tuple)),
    st.builds(Watch, st.lists(uids, max_size=20).map(tuple)),
    st.builds(Unwatch, st.lists(uids, max_size=20).map(tuple)),
)


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(client_messages, max_size=6), cuts=st.lists(st.integers(0, 2000), max_size=10))
def test_any_valid_stream_round_trips_however_it_is_split(messages: list[Any], cuts: list[int]) -> None:
    data = b"".join(encode(m) for m in messages)
    assert run_decoder(data, cuts, 4096) == messages


def test_receiving_again_before_draining_keeps_every_frame_in_order() -> None:
    decoder = FrameDecoder()
    login = encode(Login("uid", 7))
    decoder.receive_data(PING_FRAME + login[:3])
    assert decoder.next_event() is PING  # the caller stops early, then receives more
    decoder.receive_data(login[3:] + BYE_FRAME[:1])
    decoder.receive_data(BYE_FRAME[1:] + PING_FRAME)
    assert drain(decoder) == [Login("uid", 7), BYE, PING]
    assert decoder.buffered == 0
