"""From segment bytes to flat event rows: the one decode path shared by the Spark job and the reference.

Theory of operation
-------------------
A segment file is decoded by `idled.log.eventlog.decode_buffer` (the daemon's own decoder) in windows of
`CHUNK_BYTES`, the way `eventlog` reads segments itself: each window yields its good records, the scan resumes
at the first unconsumed byte (`len(window) - torn_bytes`), so memory stays bounded by one window's records
whatever the segment size. Only in the last window are the unconsumed bytes a real torn tail. Damage inside
a file is skipped by the decoder's resync (see `idled.log.records`): every good record after it is kept.

Each good record becomes one `Row`, a plain tuple (it crosses from Python workers into the JVM, where every
field costs conversion time, so the row carries only what the outputs use)::

    (daemon, seq, online, uid_key, ts, reason, deadline, detector, device, grace)
       int    int   bool    str    float  str|None  float|None  str|None  str|None  float|None

* ``uid_key`` keeps the uid's type: ``"i:42"`` for the int 42, ``"s:42"`` for the string "42" -- they are
  different users (the daemon's dict keys them apart). Output tables split it back into ``uid`` (text) and
  ``uid_type`` (``"int"``/``"str"``).
* ``deadline`` and ``detector`` are kept only for offline records with reason ``idle`` (the lateness table is
  their only reader); ``None`` elsewhere.
* ``device`` is the record's ``"device"`` field (the device whose session caused the event; absent, or not
  a str, is None: a plain login); ``grace`` the ``"grace"`` field of an offline the daemon delayed by its
  ``offline_grace`` (seconds, a finite number; None otherwise and on onlines). Records without these fields
  are the daemon's records from before devices and grace existed; they decode exactly as before.
* A CRC-valid record that is not a usable event -- kind not online/offline, uid neither int nor str (bool
  counts as neither), ts not a finite number -- is *malformed*: skipped and counted, like a corrupt one.

Counters per file go into `FileStats`; the job sums them through an accumulator keyed by file, the reference
directly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from idled.log.eventlog import MAX_RECORD_BYTES, decode_buffer
from idled.pipeline.fastdecode import fast_window, make_row

__all__ = [
    "CHUNK_BYTES", "Row", "FileStats", "uid_key", "split_uid_key", "to_row", "iter_rows", "seq_ranges_overlap",
    "UID_INT", "UID_STR",
]

# Several records per window, and always more than one whole record, so every window but the last consumes
# bytes.
CHUNK_BYTES: Final = 4 * 1024 * 1024
assert CHUNK_BYTES > MAX_RECORD_BYTES + 8

Row: TypeAlias = tuple[int, int, bool, str, float, "str | None", "float | None", "str | None", "str | None", "float | None"]

UID_INT: Final = "int"
UID_STR: Final = "str"


@dataclass(slots=True)
class FileStats:
    """What decoding one segment file found. Mutable: filled while the file's rows are consumed."""

    bytes: int = 0
    records: int = 0  # good records (CRC ok, decodable), malformed ones included
    corrupt: int = 0  # records lost to damage, as decode_buffer estimates them
    malformed: int = 0  # good records that are not usable events (see module docstring)
    torn_bytes: int = 0  # unconsumed bytes at the end of the file
    broken: bool = False  # the file ends in damage: no good record after its last damaged region
    min_seq: int | None = None
    max_seq: int | None = None
    unordered: int = 0  # records whose seq is not above the previous record's (a writer never does this)

    def as_tuple(self) -> tuple[int, int, int, int, int, bool, int | None, int | None, int]:
        return (self.bytes, self.records, self.corrupt, self.malformed, self.torn_bytes, self.broken,
                self.min_seq, self.max_seq, self.unordered)


def seq_ranges_overlap(ranges: list[tuple[int | None, int | None, int]]) -> bool:
    """True if two files of one daemon may hold the same seq: (min_seq, max_seq, unordered) per file.

    A writer's segments hold disjoint, increasing seq ranges; a copied or re-cut segment breaks that, and
    then (and only then) duplicate records are possible.
    """
    spans = sorted((lo, hi) for lo, hi, _ in ranges if lo is not None and hi is not None)
    if any(unordered for _, _, unordered in ranges):
        return True
    return any(spans[i][0] <= spans[i - 1][1] for i in range(1, len(spans)))


def uid_key(uid: Any) -> str | None:
    """"i:<int>" / "s:<str>", or None for a uid of any other type (bool included: True is not user 1)."""
    kind = type(uid)
    if kind is int:
        return f"i:{uid}"
    if kind is str:
        return "s:" + uid
    return None


def split_uid_key(key: str) -> tuple[str, str]:
    """(uid text, uid_type) for a uid_key."""
    return key[2:], (UID_INT if key[0] == "i" else UID_STR)


def to_row(record: dict[str, Any], daemon: int) -> Row | None:
    """The row for one decoded record, or None if it is malformed."""
    get = record.get
    return make_row(daemon, record["seq"], get("kind"), get("uid"), get("ts"), get("reason"), get("deadline"),
                    get("detector"), get("device"), get("grace"))


@dataclass(slots=True)
class _Walk:
    """What `iter_rows` carries from one window to the next."""

    previous: int = -1 << 63  # the last seq seen
    low: int | None = None  # the first seq seen
    unordered: int = 0
    malformed: int = 0


def iter_rows(data: bytes | bytearray | memoryview, daemon: int, stats: FileStats, fast: bool = True) -> Iterator[Row]:
    """Rows of one segment file's bytes, filling `stats` as it goes (complete once exhausted).

    Each window is decoded by `fastdecode.fast_window` when it is clean (~1 us a record), else -- and always
    with ``fast=False``, as the reference does -- by the daemon's `decode_buffer` (~2 us) and `_decoded_rows`
    (~1 us more). Both give the same rows and counters.
    """
    view = memoryview(data)
    size = len(view)
    stats.bytes = size
    offset = 0
    walk = _Walk()
    while offset < size:
        end = offset + CHUNK_BYTES
        window = view[offset:end]
        clean = fast_window(window, daemon, walk.previous) if fast else None
        if clean is not None:
            rows, good, bad, torn, first, walk.previous, out_of_order = clean
            stats.records += good
            walk.malformed += bad
            walk.unordered += out_of_order
            if walk.low is None:
                walk.low = first
            yield from rows
            consumed = min(end, size) - offset - torn
            offset += consumed
            if good:
                stats.broken = False
            if end >= size or consumed == 0:
                break
            continue
        result = decode_buffer(window)
        stats.corrupt += result.corrupt
        records = result.records
        stats.records += len(records)
        yield from _decoded_rows(records, daemon, walk)
        consumed = min(end, size) - offset - result.torn_bytes
        offset += consumed
        if records:
            stats.broken = False
        if result.damage and result.damage[-1][0] >= result.good_bytes:
            stats.broken = True
        if end >= size or consumed == 0:
            break  # the last window: what it left is a torn tail
    stats.torn_bytes = size - offset
    stats.malformed = walk.malformed
    stats.unordered = walk.unordered
    if walk.low is not None:
        stats.min_seq, stats.max_seq = walk.low, walk.previous  # the range, when unordered == 0


def _decoded_rows(records: list[dict[str, Any]], daemon: int, walk: _Walk) -> Iterator[Row]:
    """Rows of decoded records, `to_row` inlined for the common, well-formed record and called for the rest."""
    previous, low, unordered, malformed = walk.previous, walk.low, walk.unordered, walk.malformed
    try:
        for record in records:
            seq = record["seq"]
            if seq <= previous:
                unordered += 1
            previous = seq
            if low is None:
                low = seq
            uid = record.get("uid")
            ts = record.get("ts")
            kind = record.get("kind")
            reason = record.get("reason")
            device = record.get("device")
            # the common, well-formed record: not an idle offline, no grace, no device or a str one
            if type(ts) is float and type(reason) is str and math.isfinite(ts) and (device is None or type(device) is str):
                if kind == "online":
                    if type(uid) is int:
                        yield (daemon, seq, True, f"i:{uid}", ts, reason, None, None, device, None)
                        continue
                    if type(uid) is str:
                        yield (daemon, seq, True, "s:" + uid, ts, reason, None, None, device, None)
                        continue
                elif kind == "offline" and reason != "idle" and "grace" not in record:
                    if type(uid) is int:
                        yield (daemon, seq, False, f"i:{uid}", ts, reason, None, None, device, None)
                        continue
                    if type(uid) is str:
                        yield (daemon, seq, False, "s:" + uid, ts, reason, None, None, device, None)
                        continue
            row = to_row(record, daemon)
            if row is None:
                malformed += 1
            else:
                yield row
    finally:  # the caller drains it before it reads ``walk`` again
        walk.previous, walk.low, walk.unordered, walk.malformed = previous, low, unordered, malformed
