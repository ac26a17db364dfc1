"""idled.log.shipping: raw records read from one log and written to another, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from idled.log.eventlog import READ_CHUNK_BYTES, EventLog
from idled.log.records import encode_record_v1
from idled.log.shipping import RawReader, ShippedRecordsBad, append_raw, move_aside, read_record
from idled.protocol import FrameDecoder, ProtocolError, Replicate, encode
from idled.protocol.replication import Records, encode_records, parse_replication_message


def event(seq: int, kind: str = "online") -> dict[str, object]:
    return {"seq": seq, "kind": kind, "uid": f"u{seq % 7}", "ts": 1.5 + seq, "reason": "login", "last_seen": 1.0,
            "deadline": 2.0, "timeout": 30.0, "detector": "ring-lazy"}


def test_raw_records_copy_byte_identical_with_state(tmp_path: Path) -> None:
    with EventLog(tmp_path / "a", segment_bytes=2048) as active:
        active.recover()
        active.append([event(seq, "online" if seq % 3 else "offline") for seq in range(1, 120)])
        reader = RawReader(str(tmp_path / "a"), 1)
        with EventLog(tmp_path / "s", segment_bytes=2048) as standby:
            standby.recover()
            while batch := reader.take(active.last_seq + 1, 17, 1000):
                append_raw(standby, [raw for _, raw in batch])
            assert standby.last_seq == active.last_seq == 119
            assert standby.open_sessions == active.open_sessions
            assert standby.last_seen_users == active.last_seen_users
    a = sorted(p.name for p in (tmp_path / "a").glob("*.seg"))
    assert len(a) > 3 and a == sorted(p.name for p in (tmp_path / "s").glob("*.seg"))
    for name in a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "s" / name).read_bytes()


def test_reader_resumes_stops_below_and_skips_damage(tmp_path: Path) -> None:
    with EventLog(tmp_path) as log:
        log.recover()
        log.append([event(seq) for seq in range(1, 11)])
    segment = next(tmp_path.glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2 + 50] ^= 0xFF  # one damaged record in the middle (the 6th)
    segment.write_bytes(bytes(data))
    reader = RawReader(str(tmp_path), 3)
    first = reader.take(6, 100, 1 << 20)
    assert [seq for seq, _ in first] == [3, 4, 5]
    rest = [seq for seq, _ in reader.take(100, 100, 1 << 20)]
    assert rest == [7, 8, 9, 10] and reader.damaged == 1


def test_a_reader_starting_deep_in_a_segment_finds_the_records_after_a_gap(tmp_path: Path) -> None:
    # More than one read chunk of records below ``from``, then a gap (a new leader's first seq), in one
    # segment: an empty first chunk once made the feed take "nothing here" for a gap and skip to the head.
    with EventLog(tmp_path) as log:
        log.recover()
        below = [event(seq) for seq in range(1, 2 * READ_CHUNK_BYTES // 150)]
        log.append(below)
        log.append([event(seq) for seq in range(1_000_002, 1_000_012)])
    assert len(list(tmp_path.glob("*.seg"))) == 1
    reader = RawReader(str(tmp_path), len(below) + 1)
    assert [seq for seq, _ in reader.take(1_000_012, 100, 1 << 20)] == list(range(1_000_002, 1_000_012))


def test_v1_records_are_shipped_as_they_are(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / f"{1:020d}.seg").write_bytes(b"".join(encode_record_v1(event(seq)) for seq in (1, 2)))
    raws = [raw for _, raw in RawReader(str(tmp_path / "a"), 1).take(10, 10, 1 << 20)]
    with EventLog(tmp_path / "s") as standby:
        standby.recover()
        append_raw(standby, raws)
    assert next((tmp_path / "s").glob("*.seg")).read_bytes() == b"".join(raws)


def test_bad_bytes_are_refused_whole(tmp_path: Path) -> None:
    with EventLog(tmp_path) as log:
        log.recover()
        with pytest.raises(ShippedRecordsBad):
            append_raw(log, [b"\xa5\xd1 not a record"])
        assert log.last_seq == 0


def test_move_aside_keeps_everything_but_the_lock(tmp_path: Path) -> None:
    with EventLog(tmp_path) as log:
        log.recover()
        log.append([event(1)])
    target, moved = move_aside(str(tmp_path))
    assert moved >= 2 and not list(tmp_path.glob("*.seg")) and list(Path(target).glob("*.seg"))


def test_replication_frames_round_trip() -> None:
    decoder = FrameDecoder(1 << 20, parse=parse_replication_message)
    decoder.receive_data(encode_records([b"\x01\x02", b"\x03"], 42, 1.5))
    assert decoder.next_event() == Records((b"\x01\x02", b"\x03"), 42, 1.5)
    server = FrameDecoder()
    server.receive_data(encode(Replicate(7)))
    assert server.next_event() == Replicate(7)
    bad = FrameDecoder()
    bad.receive_data(encode(Replicate(7))[:-1] + b"\xff")
    with pytest.raises(ProtocolError):
        bad.next_event()


def test_reader_resuming_deep_in_a_large_segment_finds_its_records(tmp_path: Path) -> None:
    # More than one read chunk (1 MiB) of records below `from`: the first take used to come back empty, which
    # the active's feed reads as a gap -- it then skipped every seq up to its durable end.
    with EventLog(tmp_path) as log:
        log.recover()
        log.append([event(seq) for seq in range(1, 15_001)])
    assert next(tmp_path.glob("*.seg")).stat().st_size > 1 << 20
    reader = RawReader(str(tmp_path), 14_000)
    assert [seq for seq, _ in reader.take(20_000, 3, 1 << 20)] == [14_000, 14_001, 14_002]
    assert read_record(str(tmp_path), 14_999) is not None and read_record(str(tmp_path), 15_000) is not None
    assert read_record(str(tmp_path), 15_001) is None
