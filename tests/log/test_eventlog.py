"""Tests for idled.log.eventlog: framing, decode_buffer, recovery, rotation, retention, reading, tailing, crashes."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.log.eventlog import (
    HEADER_BYTES,
    MAX_RECORD_BYTES,
    EventLog,
    FsyncFailed,
    LogLocked,
    LogStateError,
    LogTailer,
    RecordTooLarge,
    SeqOrderError,
    WriteFailed,
    decode_buffer,
    encode_record,
    iter_records,
    list_segments,
    segment_name,
)


def ev(seq: int, kind: str = "online", uid: str | int = "u1", **extra: Any) -> dict[str, Any]:
    ts = 1_700_000_000.0 + seq
    event = {
        "seq": seq, "kind": kind, "uid": uid, "ts": ts, "reason": "login" if kind == "online" else "idle",
        "last_seen": ts - 1.5, "deadline": ts + 45.0, "timeout": 45.0, "detector": "wheel",
    }
    event.update(extra)
    return event


def events(first: int, last: int) -> list[dict[str, Any]]:
    return [ev(seq, "online" if seq % 2 else "offline", uid=f"u{seq % 7}") for seq in range(first, last + 1)]


def seqs(records: list[dict[str, Any]]) -> list[int]:
    return [r["seq"] for r in records]


def open_log(directory: Path, **kwargs: Any) -> EventLog:
    log = EventLog(directory, **kwargs)
    log.recover()
    return log


# ---------------------------------------------------------------------------------------------- framing


def test_record_layout_is_sync_check_length_crc_msgpack() -> None:
    record = encode_record(ev(7))
    sync, check, length, crc = struct.unpack(">2sHII", record[:12])
    body = record[12:]
    assert sync == b"\xa5\xd1" and HEADER_BYTES == 12
    assert check == zlib.crc32(record[4:12]) & 0xFFFF
    assert length == len(body)
    assert crc == zlib.crc32(body)
    assert msgpack.unpackb(body) == ev(7)


def test_v1_records_written_before_the_format_change_still_decode() -> None:
    from idled.log.records import encode_record_v1

    v1 = encode_record_v1(ev(1))
    assert struct.unpack(">II", v1[:8]) == (len(v1) - 8, zlib.crc32(v1[8:]))
    data = v1 + encode_record(ev(2)) + encode_record_v1(ev(3))  # an old active segment appended to after upgrade
    result = decode_buffer(data)
    assert seqs(result.records) == [1, 2, 3]
    assert (result.corrupt, result.torn_bytes) == (0, 0)


def test_round_trip_keeps_values_types_and_extra_keys() -> None:
    originals = [
        ev(1, uid="alice"), ev(2, "offline", uid=42, reason="gateway_lost"), ev(3, uid="é", extra_key=[1, "x"])
    ]
    data = b"".join(encode_record(e) for e in originals)
    result = decode_buffer(data)
    assert result.records == originals
    assert type(result.records[1]["uid"]) is int
    assert (result.good_bytes, result.corrupt, result.torn_bytes, result.skipped_bytes) == (len(data), 0, 0, 0)


def test_encode_accepts_any_mapping() -> None:
    from types import MappingProxyType

    assert decode_buffer(encode_record(MappingProxyType(ev(1)))).records == [ev(1)]


def test_encode_rejects_a_body_over_the_limit() -> None:
    with pytest.raises(RecordTooLarge) as info:
        encode_record(ev(1, blob="x" * MAX_RECORD_BYTES))
    assert info.value.code == "record_too_large"


def test_flipped_bit_in_a_body_is_detected_and_skipped() -> None:
    records = [encode_record(e) for e in events(1, 3)]
    data = bytearray(b"".join(records))
    data[len(records[0]) + HEADER_BYTES + 5] ^= 0x10  # inside record 2's body
    result = decode_buffer(bytes(data))
    assert seqs(result.records) == [1, 3]
    assert result.corrupt == 1
    assert result.good_bytes == len(data)
    assert result.torn_bytes == 0


def test_flipped_bit_in_a_crc_is_detected_and_skipped() -> None:
    records = [encode_record(e) for e in events(1, 3)]
    data = bytearray(b"".join(records))
    data[len(records[0]) + 6] ^= 0x01  # record 2's CRC field
    result = decode_buffer(bytes(data))
    assert seqs(result.records) == [1, 3]
    assert result.corrupt == 1


def test_every_truncation_point_yields_exactly_the_complete_records() -> None:
    records = [encode_record(e) for e in events(1, 4)]
    data = b"".join(records)
    ends = [sum(len(r) for r in records[: i + 1]) for i in range(len(records))]
    for cut in range(len(data) + 1):
        result = decode_buffer(data[:cut])
        complete = [end for end in ends if end <= cut]
        assert seqs(result.records) == list(range(1, len(complete) + 1))
        assert result.good_bytes == (complete[-1] if complete else 0)
        assert result.torn_bytes == cut - result.good_bytes
        assert result.corrupt == 0 and result.damage == []


@pytest.mark.parametrize(
    "bad",
    [struct.pack(">II", MAX_RECORD_BYTES + 1, 0) + b"\x00" * 16, b"\xff" * 4, b"\xa5\xd1" + b"\x00" * 30],
    ids=["v1-implausible", "ff", "sync-bad-check"],
)
def test_implausible_header_is_damage_and_the_scan_resyncs_to_the_next_record(bad: bytes) -> None:
    good = encode_record(ev(1))
    later = encode_record(ev(2))
    result = decode_buffer(good + bad + later + encode_record(ev(3)))
    assert seqs(result.records) == [1, 2, 3]
    assert result.corrupt == 1
    assert result.damage == [(len(good), len(bad), 1)]
    assert result.skipped_bytes == len(bad)
    assert result.torn_bytes == 0


def test_zero_filled_tail_is_one_damaged_region_not_an_endless_run_of_empty_records() -> None:
    good = encode_record(ev(1))
    result = decode_buffer(good + b"\x00" * 4096)  # crc32(b"") == 0, so zero headers must not pass as records
    assert seqs(result.records) == [1]
    assert result.corrupt == 1 and len(result.damage) == 1
    assert result.skipped_bytes + result.torn_bytes == 4096 and result.torn_bytes <= 3


def test_a_record_cut_by_the_end_of_a_chunk_is_torn_not_damage_even_after_damage() -> None:
    records = [encode_record(e) for e in events(1, 3)]
    data = records[0] + b"\xee" * 50 + records[1] + records[2][:20]
    result = decode_buffer(data)
    assert seqs(result.records) == [1, 2]
    assert result.damage == [(len(records[0]), 50, 1)]
    assert result.torn_bytes == 20


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb([1, 2, 3]), msgpack.packb({"kind": "online"}), msgpack.packb({"seq": "7"}), b"\xc1",
        msgpack.packb(1) + b"x",
    ],
    ids=["array", "no-seq", "str-seq", "invalid-byte", "trailing-bytes"],
)
def test_crc_valid_body_that_is_not_an_event_counts_as_corrupt(body: bytes) -> None:
    frame = struct.pack(">II", len(body), zlib.crc32(body)) + body
    result = decode_buffer(frame + encode_record(ev(9)))
    assert seqs(result.records) == [9]
    assert result.corrupt == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_decode_buffer_never_raises_on_garbage(data: bytes) -> None:
    result = decode_buffer(data)
    assert result.good_bytes + result.torn_bytes <= len(data)
    assert 0 <= result.torn_bytes <= len(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_single_bit_flip_never_produces_a_wrong_record(data: st.DataObject) -> None:
    originals = events(1, 5)
    buffer = bytearray(b"".join(encode_record(e) for e in originals))
    bit = data.draw(st.integers(0, len(buffer) * 8 - 1))
    buffer[bit // 8] ^= 1 << (bit % 8)
    result = decode_buffer(bytes(buffer))
    assert all(record in originals for record in result.records)
    # Only the damaged record can be gone, wherever the bit was. (With a flip in the first 4 bytes it may
    # even survive: the v2 length + CRC + body that follow are a valid v1 record.)
    assert len(result.records) >= 4
    assert len(result.records) == 5 or result.corrupt >= 1 or result.torn_bytes > 0


# ---------------------------------------------------------------------------------------------- EventLog basics


def test_recover_creates_a_missing_directory(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    with EventLog(directory) as log:
        recovery = log.recover()
        assert directory.is_dir()
        assert (recovery.next_seq, recovery.truncated_bytes, recovery.corrupt_records, recovery.online) == (1, 0, 0, {})
        assert log.oldest_seq() is None
        assert list(log.read_from(0)) == []


def test_append_read_close_reopen_continues_the_sequence(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        written = log.append(events(1, 10))
        assert written == sum(len(encode_record(e)) for e in events(1, 10))
        log.sync()
        assert (log.last_seq, log.durable_seq) == (10, 10)
        assert list(log.read_from(1)) == events(1, 10)
    assert [p for _, p in list_segments(tmp_path)] == [str(tmp_path / segment_name(1))]
    with EventLog(tmp_path) as log:
        recovery = log.recover()
        assert (recovery.next_seq, recovery.records, recovery.truncated_bytes) == (11, 10, 0)
        log.append([ev(11)])
        assert seqs(list(iter_records(tmp_path))) == list(range(1, 12))


def test_appended_records_are_readable_before_sync(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(events(1, 3))
        assert seqs(list(log.read_from(2))) == [2, 3]
        assert log.durable_seq == 0


def test_out_of_order_batch_is_rejected_whole(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(events(1, 3))
        size = os.path.getsize(log.active_path)
        bad_batches: list[list[dict[str, Any]]] = [
            [ev(4), ev(4)], [ev(5), ev(3)], [ev(4), {"kind": "online"}], [ev(True)], [ev(4.0)]  # type: ignore[arg-type]
        ]
        for bad in bad_batches:
            with pytest.raises(SeqOrderError) as info:
                log.append(bad)
            assert info.value.code == "seq_order"
        assert os.path.getsize(log.active_path) == size
        assert log.last_seq == 3
        log.append([ev(9)])  # gaps are allowed, only order is enforced
        assert seqs(list(log.read_from(0))) == [1, 2, 3, 9]


def test_append_before_recover_and_after_close_is_a_state_error(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    with pytest.raises(LogStateError):
        log.append([ev(1)])
    log.recover()
    with pytest.raises(LogStateError):
        log.recover()
    log.close()
    with pytest.raises(LogStateError):
        log.sync()
    log.close()  # idempotent


def test_second_writer_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    first = open_log(tmp_path)
    with pytest.raises(LogLocked) as info:
        EventLog(tmp_path).recover()
    assert info.value.code == "locked"
    first.close()
    open_log(tmp_path).close()


# ---------------------------------------------------------------------------------------------- recovery


def test_torn_tail_is_truncated_and_seq_continues_after_the_last_good_record(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(events(1, 10))
        log.sync()
        path = log.active_path
    good_size = os.path.getsize(path)
    partial = encode_record(ev(11))[:-7]  # a write cut short
    with open(path, "ab") as file:
        file.write(partial)
    with EventLog(tmp_path) as log:
        recovery = log.recover()
        assert recovery.truncated_bytes == len(partial)
        assert recovery.next_seq == 11
        assert recovery.corrupt_records == 0
        assert os.path.getsize(path) == good_size
        log.append([ev(11), ev(12)])
    assert seqs(list(iter_records(tmp_path))) == list(range(1, 13))
    assert decode_buffer(Path(path).read_bytes()).torn_bytes == 0


def test_garbage_after_the_last_good_record_is_truncated_and_counted(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(events(1, 5))
        path = log.active_path
    damaged = bytearray(encode_record(ev(6)))
    damaged[-1] ^= 0xFF  # complete but CRC-failed: e.g. a torn page inside the last write
    with open(path, "ab") as file:
        file.write(bytes(damaged) + b"\x00" * 100)
    with EventLog(tmp_path) as log:
        recovery = log.recover()
    assert recovery.truncated_bytes == len(damaged) + 100
    assert recovery.corrupt_records == 1  # the CRC failure; the zeros after it are one region with it
    assert recovery.next_seq == 6
    (quarantine,) = recovery.quarantined
    assert quarantine == f"{path}.quarantine-{os.path.getsize(path)}"
    assert Path(quarantine).read_bytes() == bytes(damaged) + b"\x00" * 100


def test_corruption_inside_an_older_segment_is_skipped_not_truncated(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=600) as log:
        log.append(events(1, 12))
    (first_seq, first_path), *rest = list_segments(tmp_path)
    assert rest, "expected several segments"
    size = os.path.getsize(first_path)
    data = bytearray(Path(first_path).read_bytes())
    data[len(encode_record(ev(1))) + HEADER_BYTES + 3] ^= 0x04  # record 2's body
    Path(first_path).write_bytes(bytes(data))
    with EventLog(tmp_path, segment_bytes=600) as log:
        recovery = log.recover()
    assert recovery.corrupt_records == 1
    assert recovery.truncated_bytes == 0
    assert recovery.next_seq == 13
    assert os.path.getsize(first_path) == size
    assert seqs(list(iter_records(tmp_path))) == [1] + list(range(3, 13))


def test_last_segment_all_garbage_is_emptied_and_its_name_keeps_the_sequence(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(events(1, 4))
    garbage = tmp_path / segment_name(8)  # e.g. records 5..7 were lost with an unsynced older segment
    garbage.write_bytes(os.urandom(3000))
    with EventLog(tmp_path) as log:
        recovery = log.recover()
        assert recovery.truncated_bytes == 3000
        assert recovery.next_seq == 8
        assert garbage.stat().st_size == 0
        log.append([ev(8)])
    assert seqs(list(iter_records(tmp_path))) == [1, 2, 3, 4, 8]


def test_only_segment_all_garbage(tmp_path: Path) -> None:
    (tmp_path / segment_name(1)).write_bytes(b"\xff" * 50)
    with EventLog(tmp_path) as log:
        recovery = log.recover()
        assert (recovery.next_seq, recovery.truncated_bytes, recovery.records) == (1, 50, 0)
        log.append([ev(1)])
    assert seqs(list(iter_records(tmp_path))) == [1]


def test_empty_segment_left_by_a_crash_right_after_rotation(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(events(1, 3))
    (tmp_path / segment_name(4)).touch()
    with EventLog(tmp_path) as log:
        assert log.recover().next_seq == 4
        log.append([ev(4)])
        assert log.active_path == str(tmp_path / segment_name(4))


def test_other_files_in_the_directory_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "123.seg").write_bytes(b"junk")  # not a 20-digit name
    with EventLog(tmp_path) as log:
        assert log.recover().segments == 0


def test_recovery_online_map_is_each_uids_last_record(tmp_path: Path) -> None:
    history = [
        ev(1, "online", "alice"),
        ev(2, "online", "bob"),
        ev(3, "online", 1),
        ev(4, "offline", "alice", reason="idle"),
        ev(5, "online", "1"),  # str "1" and int 1 are different uids
        ev(6, "offline", "bob", reason="logout"),
        ev(7, "online", "bob", reason="login"),
        ev(8, "online", "carol"),
        ev(9, "offline", "carol", reason="closed"),
    ]
    with open_log(tmp_path, segment_bytes=400) as log:  # spread across segments
        for event in history:
            log.append([event])
    assert len(list_segments(tmp_path)) > 2
    with EventLog(tmp_path) as log:
        recovery = log.recover()
    # each uid's last online record, as much of it as a restart record needs (not the whole record: see
    # idled.log.recovery)
    assert recovery.online == {
        e["uid"]: {"kind": "online", "uid": e["uid"], "seq": e["seq"], "last_seen": e["last_seen"], "timeout": e["timeout"]}
        for e in (history[2], history[4], history[6])
    }


# ---------------------------------------------------------------------------------------------- rotation


def test_rotation_by_size_names_segments_by_their_first_seq(tmp_path: Path) -> None:
    record_size = len(encode_record(events(1, 1)[0]))
    with open_log(tmp_path, segment_bytes=record_size * 3 + 10) as log:
        log.append(events(1, 5))  # one batch crossing a boundary
        for seq in range(6, 11):
            log.append(events(seq, seq))
        log.sync()
        assert log.rotations == 4
    segments = list_segments(tmp_path)
    assert [first for first, _ in segments] == [1, 4, 7, 10]
    for first, path in segments:
        records = decode_buffer(Path(path).read_bytes()).records
        assert records[0]["seq"] == first
        assert os.path.getsize(path) <= record_size * 3 + 10
    assert seqs(list(iter_records(tmp_path))) == list(range(1, 11))


def test_a_record_larger_than_segment_bytes_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=10) as log:
        log.append(events(1, 3))
    assert [first for first, _ in list_segments(tmp_path)] == [1, 2, 3]


def test_sync_after_a_batch_spanning_rotations_closes_the_rotated_segments(tmp_path: Path) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    with open_log(tmp_path, segment_bytes=300) as log:
        before = open_fds()
        log.append(events(1, 20))
        assert log.rotations >= 5
        assert open_fds() == before + log.rotations  # rotated-away segments stay open until sync()...
        log.sync()
        assert open_fds() == before + 1  # ...which synced and closed them; the active one stays
        assert log.durable_seq == 20


# ---------------------------------------------------------------------------------------------- retention


def test_retention_by_size_deletes_oldest_whole_segments_never_the_active(tmp_path: Path) -> None:
    record_size = len(encode_record(events(1, 1)[0]))
    segment = record_size * 4
    with open_log(tmp_path, segment_bytes=segment, retention_bytes=segment * 3) as log:
        for seq in range(1, 101):
            log.append(events(seq, seq))  # retention runs at each rotation
        segments = list_segments(tmp_path)
        total = sum(os.path.getsize(p) for _, p in segments)
        assert total <= segment * 3
        assert segments[-1][1] == log.active_path
        retained = seqs(list(iter_records(tmp_path)))
        assert retained == list(range(retained[0], 101))  # contiguous, ends at the newest
        assert log.oldest_seq() == segments[0][0] == retained[0]
        log.retention_bytes = 0
        log.apply_retention()
        assert [p for _, p in list_segments(tmp_path)] == [log.active_path]


def test_retention_by_age_uses_segment_mtime_and_the_injected_clock(tmp_path: Path) -> None:
    now = [time.time()]  # files written now are young; retention also runs at each rotation
    with open_log(tmp_path, segment_bytes=10, retention_seconds=3600.0, clock=lambda: now[0]) as log:
        log.append(events(1, 5))  # five one-record segments
        paths = [p for _, p in list_segments(tmp_path)]
        ages = [7200, 5000, 100, 9000, 99999]  # the 4th is old but follows a young one; the 5th is active
        for path, age in zip(paths, ages):
            os.utime(path, (now[0] - age, now[0] - age))
        deleted = log.apply_retention()
        assert deleted == paths[:2]  # stops at the first kept segment: the log stays contiguous
        assert log.oldest_seq() == 3
        now[0] += 10_000  # everything is old now, but the active segment stays
        log.apply_retention()
        assert [p for _, p in list_segments(tmp_path)] == [paths[4]]
        assert seqs(list(log.read_from(0))) == [5]


# ---------------------------------------------------------------------------------------------- reading


def test_read_from_across_segment_boundaries(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=500) as log:
        log.append(events(1, 30))
        firsts = [first for first, _ in list_segments(tmp_path)]
        assert len(firsts) >= 4
        for start in [0, 1, firsts[1] - 1, firsts[1], firsts[1] + 1, firsts[-1], 30, 31, 1000]:
            assert seqs(list(log.read_from(start))) == list(range(max(1, start), 31)), start
        log.append(events(31, 33))  # unsynced, in the active segment: included
        assert seqs(list(log.read_from(29))) == [29, 30, 31, 32, 33]


def test_iter_records_streams_segments_larger_than_a_read_chunk(tmp_path: Path) -> None:
    from idled.log import eventlog

    with open_log(tmp_path) as log:
        n = eventlog.READ_CHUNK_BYTES // 100  # ~2 chunks of ~150-byte records
        for start in range(1, n, 1000):
            log.append(events(start, min(n, start + 999)))
    assert os.path.getsize(list_segments(tmp_path)[0][1]) > eventlog.READ_CHUNK_BYTES
    assert seqs(list(iter_records(tmp_path))) == list(range(1, n + 1))
    assert seqs(list(iter_records(tmp_path, n - 2))) == [n - 2, n - 1, n]


def test_tailer_follows_appends_rotation_and_retention(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=400, retention_bytes=1200) as log:
        tailer = LogTailer(tmp_path)
        assert tailer.poll() == []
        log.append(events(1, 2))
        assert seqs(tailer.poll()) == [1, 2]
        assert tailer.poll() == []
        partial_path = log.active_path
        log.append(events(3, 9))  # rotates (several times)
        assert seqs(tailer.poll()) == list(range(3, 10))
        log.append(events(10, 40))  # retention deletes segments, including the one the tailer read last
        assert not os.path.exists(partial_path)
        got = seqs(tailer.poll())
        assert got == sorted(got) and got[-1] == 40 and set(got) <= set(range(10, 41))
        late = LogTailer(tmp_path, from_seq=38)
        assert seqs(late.poll()) == [38, 39, 40]


def test_tailer_ignores_a_torn_tail_until_it_is_complete(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(events(1, 1))
        path = log.active_path
    tailer = LogTailer(tmp_path)
    record = encode_record(ev(2))
    with open(path, "ab") as file:
        file.write(record[:10])
    assert seqs(tailer.poll()) == [1]
    with open(path, "ab") as file:
        file.write(record[10:])
    assert seqs(tailer.poll()) == [2]


# ---------------------------------------------------------------------------------------------- failures


def _replace_fd_with_pipe(fd: int, close_reader: bool) -> int:
    """Point `fd` at a pipe's write end: writes go on (or fail with EPIPE), fdatasync fails with EINVAL."""
    reader, writer = os.pipe()
    os.dup2(writer, fd)
    os.close(writer)
    if close_reader:
        os.close(reader)
        return -1
    return reader


def test_failed_fsync_raises_fsync_failed_and_poisons_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(events(1, 2))
    reader = _replace_fd_with_pipe(log._fd, close_reader=False)  # type: ignore[arg-type]
    try:
        with pytest.raises(FsyncFailed) as info:
            log.sync()
        assert info.value.code == "fsync_failed"
        assert log.durable_seq == 0
        with pytest.raises(FsyncFailed):
            log.append(events(3, 3))
        with pytest.raises(FsyncFailed):
            log.sync()  # never retried
    finally:
        log.close()
        os.close(reader)


def test_failed_write_raises_write_failed(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(events(1, 2))
    _replace_fd_with_pipe(log._fd, close_reader=True)  # type: ignore[arg-type]
    try:
        with pytest.raises(WriteFailed) as info:
            log.append(events(3, 4))
        assert info.value.code == "write_failed"
        assert log.last_seq == 2
        # ftruncate on a pipe fails too, so the log cannot vouch for its tail any more: poisoned
        with pytest.raises(FsyncFailed):
            log.append(events(3, 3))
    finally:
        log.close()


# ---------------------------------------------------------------------------------------------- crash


CHILD = textwrap.dedent(
    """
    import sys, time
    from idled.log.eventlog import EventLog
    log = EventLog(sys.argv[1], segment_bytes=16384)
    seq = log.recover().next_seq
    while True:
        batch = []
        for _ in range(1 + seq % 7):
            batch.append({"seq": seq, "kind": "online" if seq % 2 else "offline", "uid": f"u{seq % 50}",
                          "ts": time.time(), "reason": "login", "last_seen": time.time(), "deadline": 0.0,
                          "timeout": 45.0, "detector": "wheel"})
            seq += 1
        log.append(batch)
        log.sync()
        sys.stdout.write(f"{seq - 1}\\n")
        sys.stdout.flush()
    """
)


def test_sigkilled_writer_loses_nothing_it_reported_synced(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True, bufsize=1
    ) as child:
        reported = 0
        try:
            assert child.stdout is not None
            deadline = time.monotonic() + 60
            while reported < 1500 and time.monotonic() < deadline:  # several segments' worth, mid-loop
                line = child.stdout.readline()
                if not line:
                    break
                reported = int(line)
            child.send_signal(signal.SIGKILL)
            rest = child.stdout.read()  # lines written to the pipe before the kill
        finally:
            child.kill()
            child.wait()
    reported = max([reported] + [int(x) for x in rest.split()])
    assert child.returncode == -signal.SIGKILL
    assert reported >= 1500, "the child did not get far enough"

    # A SIGKILL alone cannot tear a small write (the page cache keeps it); a power cut can. Add a torn
    # record to the tail, as a power cut would leave it.
    last_path = list_segments(tmp_path)[-1][1]
    torn = encode_record(ev(10**9))[:25]
    with open(last_path, "ab") as file:
        file.write(torn)

    with EventLog(tmp_path) as log:  # the dead child's lock is gone with it
        recovery = log.recover()
        recovered = seqs(list(log.read_from(0)))
        assert recovery.truncated_bytes >= len(torn)
        assert recovery.corrupt_records == 0
        assert recovered == sorted(set(recovered))  # strictly increasing
        assert recovered[: reported] == list(range(1, reported + 1))  # everything reported synced, no gaps
        assert recovery.next_seq == recovered[-1] + 1
        log.append([ev(recovery.next_seq)])
    assert len(list_segments(tmp_path)) > 3
    after = seqs(list(iter_records(tmp_path)))
    assert after == recovered + [recovery.next_seq]
