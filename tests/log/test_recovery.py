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
