"""`fastdecode.fast_window` against the daemon's decoder: the same rows and counters from `records.iter_rows`
with and without it, on generated logs and on every odd record and damage the decoder knows about, cut into
windows of many sizes (a window boundary inside every header and body)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from idled.log.eventlog import encode_record, list_segments
from idled.log.records import encode_record_v1
from idled.pipeline import records as records_module
from idled.pipeline.fastdecode import fast_window
from idled.pipeline.generate import GenConfig, generate
from idled.pipeline.records import FileStats, iter_rows


def both(data: bytes, daemon: int = 2) -> tuple[list[Any], FileStats]:
    fast, slow = FileStats(), FileStats()
    rows = list(iter_rows(data, daemon, fast))
    assert rows == list(iter_rows(data, daemon, slow, fast=False))
    assert fast == slow
    return rows, fast


def rec(seq: Any, kind: Any = "online", uid: Any = "u", ts: Any = 100.0, **extra: Any) -> dict[str, Any]:
    record = {"seq": seq, "kind": kind, "uid": uid, "ts": ts, "reason": "login" if kind == "online" else "closed",
              "last_seen": ts, "timeout": 45.0}
    record.update(extra)
    return record


ODD = [
    rec(1), rec(2, uid=7), rec(3, "offline", reason="idle", deadline=99.5, detector="heap"),
    rec(4, "offline", reason="idle"),  # no deadline, no detector: "unknown"
    rec(5, "offline", reason="idle", deadline=3, detector=5),  # int deadline, non-str detector
    rec(6, "offline", grace=2.0), rec(7, "offline", grace=None), rec(8, "offline", grace="x"),
    rec(9, "offline", grace=float("inf")), rec(10, device="phone"), rec(11, device=3), rec(12, device=None),
    rec(13, ts=100), rec(14, ts=float("nan")), rec(15, ts="100"), rec(16, uid=True), rec(17, uid=3.5),
    rec(18, uid=None), rec(19, kind="bounce"), rec(20, kind=None), rec(21, reason=None), rec(22, reason=5),
    {"seq": 23}, {"seq": 24, "kind": "online", "uid": "x", "ts": 1.0, "extra": {"a": [1, 2]}, "b": b"bin"},
    rec(25, uid=-(1 << 63)), rec(26, uid=(1 << 64) - 1), rec(27, "offline", "u", 5.0, device="d", grace=1),
    rec(20, kind="online"),  # seq going back: unordered
]


def frame_raw(body: bytes) -> bytes:
    """A v2 frame around any body (encode_record only takes maps)."""
    import struct
    import zlib

    tail = struct.pack(">II", len(body), zlib.crc32(body))
    return b"\xa5\xd1" + struct.pack(">H", zlib.crc32(tail) & 0xFFFF) + tail + body


@pytest.mark.parametrize("chunk", [37, 100, 257, 1000, 4096, 1 << 22])
def test_odd_records_and_damage_decode_alike_in_any_window(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(records_module, "CHUNK_BYTES", max(chunk, records_module.MAX_RECORD_BYTES + 9))
    clean = b"".join(encode_record(r) for r in ODD)
    rows, stats = both(clean)
    assert stats.malformed == 8 and stats.unordered == 1 and len(rows) == len(ODD) - 8
    monkeypatch.setattr(records_module, "CHUNK_BYTES", chunk)  # below a record's size: every window is cut
    for data in [
        clean,
        clean + encode_record(rec(30))[:-3],  # torn tail
        clean + encode_record(rec(30))[:5],  # torn inside the header
        clean[:50] + bytes([clean[50] ^ 1]) + clean[51:],  # a CRC failure
        encode_record_v1(rec(1)) + clean,  # a v1 record first
        clean + frame_raw(msgpack.packb([1, 2])) + encode_record(rec(31)),  # a body that is not a map
        clean + frame_raw(msgpack.packb({"seq": True})) + encode_record(rec(31)),  # seq not an int
        clean + frame_raw(msgpack.packb({1: 2, "seq": 3})) + encode_record(rec(31)),  # a non-str key
        clean + frame_raw(msgpack.packb({"seq": 3}) + b"\x01") + encode_record(rec(31)),  # trailing bytes
        clean + frame_raw(b"\x82\xa3seq\x05\xa3seq\x06") + encode_record(rec(31)),  # key twice
        clean + b"\x00" * 40 + encode_record(rec(31)),  # zeros between records
        clean + b"\xa5\xd1" + b"\xff" * 10,  # a sync mark with a bad check at the end
    ]:
        both(data)


def test_random_damage_decodes_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records_module, "CHUNK_BYTES", 700)
    rng = random.Random(5)
    clean = bytearray(b"".join(encode_record(rec(i, uid=f"u{i % 7}", ts=float(i))) for i in range(1, 300)))
    for _ in range(60):
        data = bytearray(clean)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
        both(bytes(data[: rng.randrange(len(data) // 2, len(data) + 1)]))


def test_generated_logs_decode_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = GenConfig(out=str(tmp_path / "gen"), users=200, hours=2, daemons=1, seed=3, segment_bytes=60_000,
                       damage=True, devices=2)
    generate(config, processes=1)
    monkeypatch.setattr(records_module, "CHUNK_BYTES", 8192)
    total = 0
    for _, path in list_segments(config.daemon_dir(0)):
        rows, stats = both(Path(path).read_bytes(), daemon=0)
        total += len(rows)
    assert total > 1000


def test_a_clean_window_is_decoded_without_the_daemons_decoder() -> None:
    data = b"".join(encode_record(r) for r in ODD)
    window = fast_window(memoryview(data + encode_record(rec(40))[:-1]), 0, -1)
    assert window is not None
    rows, records, malformed, torn, first, last, unordered = window
    assert (records, malformed, first, last, unordered) == (len(ODD), 8, 1, 20, 1)
    assert torn == len(encode_record(rec(40))) - 1
    assert fast_window(memoryview(encode_record_v1(rec(1))), 0, -1) is None
    assert all(math.isfinite(row[4]) for row in rows)
