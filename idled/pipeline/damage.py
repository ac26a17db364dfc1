"""Damage for synthetic logs (``idled pipeline generate --damage``): one corrupt record and a torn tail.

Applied to a closed log after the run, so the pipeline's skip-and-count paths have something to find: the
chosen record gets its last body byte flipped (its CRC fails; the records around it stay readable) and most of
one more record is appended to the last segment (a torn tail, as a writer killed mid-append leaves it).
"""

from __future__ import annotations

from typing import Any

from idled.log.eventlog import encode_record, list_segments

__all__ = ["corrupt_record", "tear_tail"]


def corrupt_record(directory: str, record: dict[str, Any] | None) -> int | None:
    """Flip the last body byte of `record` where it was written under `directory`; return its seq (None if
    there is no record or it is not found)."""
    if record is None:
        return None
    needle = encode_record(record)
    for _, path in list_segments(directory):
        with open(path, "r+b") as file:
            data = file.read()
            at = data.find(needle)
            if at >= 0:
                file.seek(at + len(needle) - 1)
                file.write(bytes([needle[-1] ^ 0xFF]))
                return record["seq"]
    return None


def tear_tail(directory: str, seq: int, ts: float) -> int:
    """Append all but the last 5 bytes of an offline record (`seq`, `ts`) to the last segment; return the
    number of bytes written (0 when there is no segment)."""
    segments = list_segments(directory)
    if not segments:
        return 0
    record = encode_record({"seq": seq, "kind": "offline", "uid": 0, "ts": ts, "reason": "idle"})
    tail = record[: len(record) - 5]
    with open(segments[-1][1], "ab") as file:
        file.write(tail)
    return len(tail)
