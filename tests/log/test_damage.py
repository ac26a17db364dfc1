"""Fault tests: damage in a segment is never silent and never destroys a good record.

Each test damages real segment files the way an operator (or a disk) can -- a length field overwritten, a
body byte flipped, garbage or zeros in the middle, a torn tail -- and checks what everyone sees: recovery
(keeps the file, or quarantines exactly the cut bytes), iter_records, LogTailer, decode_buffer and the
pipeline's iter_rows (every good record after the damage), and `idled events` (stderr report, --strict,
--verify changing nothing), run as a real subprocess.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idled.log.eventlog import (
    HEADER_BYTES, READ_CHUNK_BYTES, EventLog, LogTailer, decode_buffer, encode_record, iter_records, list_segments,
    segment_name,
)
from idled.log.records import encode_record_v1
from idled.pipeline.records import FileStats, iter_rows

N = 6  # records in the damaged segment


def ev(seq: int) -> dict[str, Any]:
    ts = 1_700_000_000.0 + seq
    return {"seq": seq, "kind": "online" if seq % 2 else "offline", "uid": f"u{seq}", "ts": ts,
            "reason": "login" if seq % 2 else "idle", "last_seen": ts, "timeout": 45.0}


def write_segment(directory: Path, first: int, last: int, encode: Callable[[dict[str, Any]], bytes]) -> Path:
    path = directory / segment_name(first)
    path.write_bytes(b"".join(encode(ev(seq)) for seq in range(first, last + 1)))
    return path


def offsets(first: int, last: int, encode: Callable[[dict[str, Any]], bytes]) -> list[int]:
    """File offset of each record of a segment written by write_segment."""
    out, at = [], 0
    for seq in range(first, last + 1):
        out.append(at)
        at += len(encode(ev(seq)))
    return out


def snapshot_files(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def events_cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "idled.cli.events", "--data-dir", str(directory), *args],
        capture_output=True, text=True, timeout=60,
    )


def seqs(records: list[dict[str, Any]]) -> list[int]:
    return [r["seq"] for r in records]


def tail_all(directory: Path) -> tuple[list[int], LogTailer]:
    tailer = LogTailer(directory)
    got: list[int] = []
    while batch := tailer.poll():
        got += seqs(batch)
    return got, tailer


FORMATS = {"v2": encode_record, "v1": encode_record_v1}


def length_field(encode: Callable[[dict[str, Any]], bytes]) -> int:
    return 4 if encode is encode_record else 0  # v2: after the sync mark and check; v1: first


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("where", ["first-length-ff", "first-body-flip", "third-body-flip", "third-length-small"])
def test_damage_followed_by_good_records_is_skipped_everywhere_and_never_cut(tmp_path: Path, fmt: str, where: str) -> None:
    encode = FORMATS[fmt]
    older = write_segment(tmp_path, 1, 3, encode)  # an older segment, then the active one holds the damage
    path = write_segment(tmp_path, 4, 3 + N, encode)
    data = bytearray(path.read_bytes())
    starts = offsets(4, 3 + N, encode)
    victim = 0 if where.startswith("first") else 2
    at = starts[victim]
    if where.endswith("length-ff"):  # the reproduction: length overwritten with ff ff ff ff
        data[at + length_field(encode) : at + length_field(encode) + 4] = b"\xff\xff\xff\xff"
    elif where.endswith("length-small"):  # a plausible but wrong length
        data[at + length_field(encode) + 3] ^= 0x40
    else:
        data[at + (HEADER_BYTES if fmt == "v2" else 8) + 10] ^= 0x01
    path.write_bytes(bytes(data))
    lost = 4 + victim
    expected = [seq for seq in range(1, 4 + N) if seq != lost]
    before = snapshot_files(tmp_path)

    # Readers: decode_buffer on the whole file, iter_records, LogTailer, the pipeline.
    whole = decode_buffer(bytes(data))
    assert seqs(whole.records) == [s for s in range(4, 4 + N) if s != lost]
    assert whole.corrupt == 1 and whole.torn_bytes == 0
    assert whole.damage[0][0] == at and whole.skipped_bytes == whole.damage[0][1]
    assert seqs(list(iter_records(tmp_path))) == expected
    got, tailer = tail_all(tmp_path)
    assert got == expected and tailer.corrupt == 1 and tailer.damage[0][:2] == (str(path), at)
    stats = FileStats()
    assert [row[1] for row in iter_rows(bytes(data), 0, stats)] == [s for s in range(4, 4 + N) if s != lost]
    assert stats.corrupt == 1 and not stats.broken

    # The CLI: records on stdout, damage on stderr, exit 0; --strict 1; --verify 1 and nothing changed.
    plain = events_cli(tmp_path)
    assert plain.returncode == 0
    assert [int(line.split('"seq": ')[1].split(",")[0]) for line in plain.stdout.splitlines()] == expected
    assert f"damage in {path} at offset {at}" in plain.stderr and "about 1 records lost" in plain.stderr
    assert events_cli(tmp_path, "--strict").returncode == 1
    verify = events_cli(tmp_path, "--verify")
    assert verify.returncode == 1
    assert f"{path}: DAMAGED" in verify.stdout and f"offset {at}:" in verify.stdout
    assert f"{older}: ok, 3 records" in verify.stdout
    assert snapshot_files(tmp_path) == before

    # Recovery: the damage is kept in place and reported, nothing is cut, nothing quarantined.
    with EventLog(tmp_path) as log:
        recovery = log.recover()
        assert (recovery.truncated_bytes, recovery.corrupt_records, recovery.quarantined) == (0, 1, ())
        assert recovery.skipped_bytes == whole.skipped_bytes
        assert recovery.next_seq == 4 + N
        assert [r.path for r in recovery.damaged_segments] == [str(path)]
        assert "skipped" in recovery.summary()
        log.append([ev(4 + N)])
    assert path.read_bytes()[: len(data)] == bytes(data)
    assert not list(tmp_path.glob("*.quarantine-*"))
    assert seqs(list(iter_records(tmp_path))) == expected + [4 + N]


def test_torn_tail_is_quarantined_byte_for_byte_before_the_cut(tmp_path: Path) -> None:
    path = write_segment(tmp_path, 1, N, encode_record)
    good_size = path.stat().st_size
    torn = encode_record(ev(N + 1))[:-7]
    with open(path, "ab") as file:
        file.write(torn)
    result = events_cli(tmp_path)
    assert result.returncode == 0 and "not a complete record" in result.stderr
    assert events_cli(tmp_path, "--verify").returncode == 1  # reported; recovery will quarantine it
    with EventLog(tmp_path) as log:
        recovery = log.recover()
    assert (recovery.truncated_bytes, recovery.corrupt_records) == (len(torn), 0)
    assert recovery.quarantined == (f"{path}.quarantine-{good_size}",)
    assert Path(recovery.quarantined[0]).read_bytes() == torn
    assert path.stat().st_size == good_size
    assert seqs(list(iter_records(tmp_path))) == list(range(1, N + 1))


def test_damage_mid_segment_and_a_torn_tail_only_the_tail_is_cut(tmp_path: Path) -> None:
    path = write_segment(tmp_path, 1, N, encode_record)
    data = bytearray(path.read_bytes())
    data[offsets(1, N, encode_record)[1] + HEADER_BYTES + 3] ^= 0x80  # record 2's body
    kept = bytes(data)
    torn = b"\xa5\xd1garbage that is not a record"
    path.write_bytes(kept + torn)
    with EventLog(tmp_path) as log:
        recovery = log.recover()
    assert recovery.truncated_bytes == len(torn) and recovery.corrupt_records == 2  # record 2, the bad tail
    assert path.read_bytes() == kept
    assert Path(recovery.quarantined[0]).read_bytes() == torn
    assert seqs(list(iter_records(tmp_path))) == [1] + list(range(3, N + 1))


@pytest.mark.parametrize("filler", [b"\x00", b"\xa5", b"\xff"], ids=["zeros", "sync-bytes", "ff"])
def test_garbage_larger_than_a_read_chunk_is_crossed_by_every_reader(tmp_path: Path, filler: bytes) -> None:
    # A run of garbage bigger than the 1 MiB read chunk: chunked readers must still find the records after it.
    garbage = filler * (READ_CHUNK_BYTES + 12345)
    before = b"".join(encode_record(ev(seq)) for seq in range(1, 4))
    after = b"".join(encode_record(ev(seq)) for seq in range(4, 8))
    path = tmp_path / segment_name(1)
    path.write_bytes(before + garbage + after)
    write_segment(tmp_path, 8, 9, encode_record)
    expected = list(range(1, 10))
    assert seqs(list(iter_records(tmp_path))) == expected
    got, tailer = tail_all(tmp_path)
    assert got == expected and tailer.skipped_bytes == len(garbage)
    stats = FileStats()
    assert [row[1] for row in iter_rows(path.read_bytes(), 0, stats)] == list(range(1, 8))
    with EventLog(tmp_path) as log:
        recovery = log.recover()
    assert recovery.skipped_bytes == len(garbage) and recovery.truncated_bytes == 0
    assert path.stat().st_size == len(before) + len(garbage) + len(after)


def test_older_segment_with_a_damaged_end_is_reported_not_cut(tmp_path: Path) -> None:
    older = write_segment(tmp_path, 1, 3, encode_record)
    with open(older, "ab") as file:
        file.write(b"\x00" * 100)  # e.g. a filesystem that extended the file with zeros after a crash
    write_segment(tmp_path, 4, 5, encode_record)
    size = older.stat().st_size
    with EventLog(tmp_path) as log:
        recovery = log.recover()
    assert recovery.truncated_bytes == 0 and recovery.skipped_bytes == 100 and recovery.corrupt_records == 1
    assert older.stat().st_size == size
    assert seqs(list(iter_records(tmp_path))) == [1, 2, 3, 4, 5]
    got, tailer = tail_all(tmp_path)
    assert got == [1, 2, 3, 4, 5] and tailer.skipped_bytes == 100


def test_clean_log_verifies_clean_and_strict_passes(tmp_path: Path) -> None:
    with EventLog(tmp_path, segment_bytes=500) as log:
        log.recover()
        log.append([ev(seq) for seq in range(1, 12)])
    assert len(list_segments(tmp_path)) > 2
    verify = events_cli(tmp_path, "--verify")
    assert verify.returncode == 0 and verify.stdout.endswith("segments, clean\n")
    strict = events_cli(tmp_path, "--strict")
    assert strict.returncode == 0 and strict.stderr == "" and len(strict.stdout.splitlines()) == 11


def test_resync_cost_is_bounded_by_the_distance_to_the_next_record() -> None:
    # One damaged record among many: the decoder must not rescan the buffer (quadratic) to get past it.
    records = [encode_record(ev(seq)) for seq in range(1, 20001)]
    data = bytearray(b"".join(records))
    clean = decode_buffer(bytes(data))
    for index in range(0, 20000, 100):  # 200 damaged records spread over the buffer
        data[sum(len(r) for r in records[:index]) + HEADER_BYTES + 5] ^= 0x01
    damaged = decode_buffer(bytes(data))
    assert len(damaged.records) == len(clean.records) - 200 and damaged.corrupt == 200
    assert all(length == len(records[0]) or length < 200 for _offset, length, _n in damaged.damage)
