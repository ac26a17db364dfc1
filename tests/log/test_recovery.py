"""idled.log.recovery.scan_log on records the writer never produces (the checksums are good, the fields not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from idled.log.eventlog import encode_record, segment_name
from idled.log.recovery import scan_log


def online(seq: int, uid: str | None) -> dict[str, Any]:
    ts = 1_700_000_000.0 + seq
    record = {"seq": seq, "kind": "online", "ts": ts, "reason": "login", "last_seen": ts, "timeout": 45.0}
    if uid is not None:
        record["uid"] = uid
    return record


def test_an_online_record_without_a_uid_opens_no_session(tmp_path: Path) -> None:
    # Only the seq of a record is checked on decoding: before, this one was kept as the session of uid None.
    records = [online(1, "a"), online(2, None), online(3, "b")]
    (tmp_path / segment_name(1)).write_bytes(b"".join(encode_record(r) for r in records))
    scan = scan_log(str(tmp_path))
    assert set(scan.sessions) == {"a", "b"}
    assert scan.max_seq == 3 and scan.records == 3  # still counted: it is a good record, only not a session's


def test_the_scan_finds_the_largest_ts_wherever_it_is(tmp_path: Path) -> None:
    # A log written across a step back of the clock (before idled's wall clock never went back): the largest
    # ts is not the last record's. Records whose ts is not a finite number are passed over.
    records = [online(1, "a"), {**online(2, "b"), "ts": 1_800_000_000.0}, online(3, "c"),
               {**online(4, "d"), "ts": float("nan")}, {**online(5, "e"), "ts": float("inf")}]
    (tmp_path / segment_name(1)).write_bytes(b"".join(encode_record(r) for r in records[:2]))
    (tmp_path / segment_name(3)).write_bytes(b"".join(encode_record(r) for r in records[2:]))
    assert scan_log(str(tmp_path)).max_ts == 1_800_000_000.0
    (tmp_path / "empty").mkdir()
    assert scan_log(str(tmp_path / "empty")).max_ts == 0.0
