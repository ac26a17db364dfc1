"""What this build does with records a different build wrote -- the promises of docs/operations.md's
"Upgrades and rollbacks": a framing it does not know is damage, skipped in place between good records and
copied aside (then cut) at the end of the newest segment; unknown keys and kinds inside a record are kept
and read back, and do not count as sessions. Real files, the daemon's own EventLog and reader."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack

from idled.log.eventlog import EventLog, iter_records
from idled.log.records import encode_record

# A record as a later format might frame it: a sync mark this build does not know, a version byte, then
# the length, the body and its CRC -- the first byte is neither v1's 00 nor v2's a5.
FUTURE_BODY = msgpack.packb({"seq": 3, "kind": "online", "uid": "future", "ts": 1.0})
FUTURE = b"\xb7\x01\x03" + struct.pack(">I", len(FUTURE_BODY)) + FUTURE_BODY + struct.pack(">I", zlib.crc32(FUTURE_BODY))


def ev(seq: int, kind: str = "online", uid: str = "u", **extra: Any) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "uid": f"{uid}{seq}", "ts": 1.0e9 + seq, "reason": "login", **extra}


def written(directory: Path, *events: dict[str, Any]) -> Path:
    """A log holding ``events``; returns its (only) segment's path."""
    log = EventLog(directory)
    log.recover()
    log.append(list(events))
    log.sync()
    log.close()
    [segment] = sorted(directory.glob("*.seg"))
    return segment


def test_an_unknown_framing_between_good_records_is_skipped_in_place(tmp_path: Path) -> None:
    segment = written(tmp_path, ev(1), ev(2))
    with open(segment, "ab") as file:
        file.write(FUTURE + encode_record(ev(4)))
    size = segment.stat().st_size
    log = EventLog(tmp_path)
    recovery = log.recover()
    log.close()
    assert recovery.skipped_bytes == len(FUTURE) and recovery.truncated_bytes == 0 and not recovery.quarantined
    assert recovery.next_seq == 5 and segment.stat().st_size == size  # nothing deleted, no seq reused
    assert [r["seq"] for r in iter_records(tmp_path)] == [1, 2, 4]


def test_an_unknown_framing_at_the_end_is_copied_aside_then_cut(tmp_path: Path) -> None:
    segment = written(tmp_path, ev(1), ev(2))
    good = segment.stat().st_size
    with open(segment, "ab") as file:
        file.write(FUTURE)
    log = EventLog(tmp_path)
    recovery = log.recover()
    log.close()
    [copy] = recovery.quarantined
    assert Path(copy).read_bytes() == FUTURE and Path(copy).name == f"{segment.name}.quarantine-{good}"
    assert segment.stat().st_size == good and recovery.truncated_bytes == len(FUTURE)


def test_unknown_keys_and_kinds_are_kept_and_are_not_sessions(tmp_path: Path) -> None:
    written(tmp_path, ev(1, shard=7), ev(2, kind="away"))
    assert [(r["seq"], r["kind"], r.get("shard")) for r in iter_records(tmp_path)] == [(1, "online", 7), (2, "away", None)]
    log = EventLog(tmp_path)
    recovery = log.recover()
    log.close()
    assert set(recovery.online) == {"u1"}
