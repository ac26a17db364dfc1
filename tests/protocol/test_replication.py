"""idled.protocol.replication: the standby's frames (replicate with `last`, ack) and resync's `diverged`, fed as
bytes, one at a time where it matters."""

from __future__ import annotations

import msgpack
import pytest

from idled.protocol import NEED_DATA, PING, FrameDecoder, ProtocolError, Replicate, encode
from idled.protocol.replication import (
    MAX_STANDBY_FRAME, Ack, ReplicateChecked, Resync, encode_ack, encode_replicate, encode_resync,
    parse_replication_message, parse_standby_message, record_crc,
)


def frame(obj: object) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def one(data: bytes, decoder: FrameDecoder | None = None) -> object:
    decoder = decoder or FrameDecoder()
    for byte in data[:-1]:
        decoder.receive_data(bytes([byte]))
        assert decoder.next_event() is NEED_DATA
    decoder.receive_data(data[-1:])
    return decoder.next_event()


def test_replicate_with_last_round_trips_and_without_stays_plain() -> None:
    assert one(encode_replicate(11, (10, 0xDEADBEEF))) == ReplicateChecked(11, (10, 0xDEADBEEF))
    assert isinstance(one(encode_replicate(11, (10, 1))), Replicate)
    plain = one(encode_replicate(1, None))
    assert type(plain) is Replicate and plain == Replicate(1)
    assert encode_replicate(5, None) == encode(Replicate(5))  # an older active reads it as before


@pytest.mark.parametrize("obj", [
    {"op": "replicate", "from": 11, "last": [9, 1]},  # not the record just below from
    {"op": "replicate", "from": 1, "last": [0, 1]},  # nothing below seq 1
    {"op": "replicate", "from": 11, "last": [10]},
    {"op": "replicate", "from": 11, "last": [10, -1]},
    {"op": "replicate", "from": 11, "last": [10, 2**32]},
    {"op": "replicate", "from": 11, "last": [10, "crc"]},
    {"op": "replicate", "from": 11, "last": 10},
    {"op": "replicate", "from": 11, "extra": 1},
])
def test_bad_replicate_is_refused(obj: object) -> None:
    with pytest.raises(ProtocolError) as info:
        one(frame(obj))
    assert info.value.code == "bad_message"


def test_ack_is_parsed_by_the_standby_decoder_with_ping_and_bye() -> None:
    decoder = FrameDecoder(MAX_STANDBY_FRAME, parse=parse_standby_message)
    assert one(encode_ack(0), decoder) == Ack(0)
    assert one(encode_ack(2**63 - 1), decoder) == Ack(2**63 - 1)
    assert one(encode(PING), decoder) is PING
    assert parse_standby_message({"op": "bye"}).__class__.__name__ == "Bye"


@pytest.mark.parametrize("obj", [
    {"op": "ack"}, {"op": "ack", "seq": -1}, {"op": "ack", "seq": 1.0}, {"op": "ack", "seq": 2**63},
    {"op": "ack", "seq": 1, "more": 2}, {"op": "records"}, "ack",
])
def test_bad_ack_is_refused(obj: object) -> None:
    with pytest.raises(ProtocolError):
        one(frame(obj), FrameDecoder(MAX_STANDBY_FRAME, parse=parse_standby_message))


def test_standby_frames_are_bounded() -> None:
    decoder = FrameDecoder(MAX_STANDBY_FRAME, parse=parse_standby_message)
    decoder.receive_data(frame({"op": "ack", "seq": 1, "pad": "x" * MAX_STANDBY_FRAME})[:8])
    with pytest.raises(ProtocolError) as info:
        decoder.next_event()
    assert info.value.code == "too_large"


def test_resync_carries_diverged_only_when_set() -> None:
    decoder = FrameDecoder(1 << 20, parse=parse_replication_message)
    assert one(encode_resync(5, None, 0), decoder) == Resync(5, None, 0, None)
    assert one(encode_resync(5, 9, 100, diverged=12), decoder) == Resync(5, 9, 100, 12)
    assert b"diverged" not in encode_resync(5, 9, 100)  # the frame an older standby knows, unchanged
    with pytest.raises(ProtocolError):
        one(frame({"op": "resync", "oldest": 1, "snapshot": None, "size": 0, "diverged": -3}),
            FrameDecoder(1 << 20, parse=parse_replication_message))


def test_record_crc_is_crc32_of_the_bytes() -> None:
    assert record_crc(b"") == 0 and record_crc(b"abc") == 0x352441C2
