"""The error frame's optional `leader` (HOST:PORT of the core to log in to, with `not_leader`)."""

from __future__ import annotations

import msgpack
import pytest

from idled.protocol import NEED_DATA, Error, ErrorCode, FrameDecoder, ProtocolError, encode, parse_server_message


def decode(data: bytes) -> object:
    decoder = FrameDecoder(1 << 16, parse=parse_server_message)
    events = []
    for byte in data:  # one byte at a time: the sans-IO contract
        decoder.receive_data(bytes([byte]))
        while (event := decoder.next_event()) is not NEED_DATA:
            events.append(event)
    assert len(events) == 1
    return events[0]


def test_leader_round_trips_byte_by_byte() -> None:
    error = Error(ErrorCode.NOT_LEADER, "standby", "127.0.0.3:7878")
    assert decode(encode(error)) == error
    assert msgpack.unpackb(encode(error)[4:]) == {
        "op": "error", "code": "not_leader", "reason": "standby", "leader": "127.0.0.3:7878"}


def test_without_a_leader_the_frame_is_byte_for_byte_the_old_one() -> None:
    old = msgpack.packb({"op": "error", "code": "not_leader", "reason": "standby"})
    frame = encode(Error(ErrorCode.NOT_LEADER, "standby"))
    assert frame == len(old).to_bytes(4, "big") + old
    parsed = decode(frame)
    assert isinstance(parsed, Error) and parsed.leader is None


@pytest.mark.parametrize("leader", [5, b"x:1", "", "h" * 400, ("h", 1)])
def test_a_malformed_leader_is_bad_message(leader: object) -> None:
    body = msgpack.packb({"op": "error", "code": "not_leader", "reason": "r", "leader": leader})
    with pytest.raises(ProtocolError) as caught:
        decode(len(body).to_bytes(4, "big") + body)
    assert caught.value.code == ErrorCode.BAD_MESSAGE


def test_protocol_error_carries_the_leader_for_the_error_frame() -> None:
    exc = ProtocolError(ErrorCode.NOT_LEADER, "standby", leader="10.0.0.1:7878")
    assert exc.leader == "10.0.0.1:7878" and str(exc) == "not_leader: standby"
    assert ProtocolError(ErrorCode.BUSY, "full").leader is None
