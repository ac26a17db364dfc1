"""The record codec: one framed record per presence event, and the one decoder every reader uses.

Theory of operation
-------------------
**Format v2** (written since the damage work; 12-byte header, then a msgpack map, the body)::

    +-------+-----------+----------------+----------------+-----------------------+
    | a5 d1 | u16 BE    | u32 BE length  | u32 BE CRC32   | body: msgpack map     |
    | sync  | check     | of the body    | of the body    | {"seq": 7, ...}       |
    +-------+-----------+----------------+----------------+-----------------------+
      check = crc32(the 8 bytes length + CRC) & 0xffff

The *sync* bytes let a reader find the next record after damage with `bytes.find`-speed scanning instead
of trying every offset; the *check* lets it trust a length before reading the body, so (a) a candidate
found while resynchronising costs O(1) to reject, and (b) a record whose header verifies but whose body runs
past the end of the data is an incomplete write (a torn tail, or a reader that caught a write in progress),
not damage.

**Format v1** (segments written before): an 8-byte header, u32 BE length then u32 BE CRC32 of the body.
A v1 length is at most MAX_RECORD_BYTES (0x00010000), so a v1 header always starts with 0x00 and a v2 one
with 0xa5: the decoder tells them apart per record, so old segments stay readable -- and an old active
segment may be appended to with v2 records after an upgrade.

A length of 0 or above MAX_RECORD_BYTES is implausible. A body is *good* when its CRC matches and it
decodes (`msgpack.unpackb`) to a map whose "seq" is an int; other keys are not validated.

**Scanning a buffer** (`decode_buffer`, used by the writer's recovery, every reader and the Spark job):

1. a good record is kept; the scan moves past it;
2. a v2 header that verifies, or a plausible v1 header, whose body runs past the end of the buffer: stop;
   the bytes from there are `torn_bytes` (more data may complete them). For v1, whose length cannot be
   trusted on its own, only if no good record starts later in the buffer -- otherwise it is damage (3);
3. anything else is *damage*: the scan *resynchronises* -- it looks for the next offset where a good
   record starts (a v2 sync, or a plausible v1 length, found with one regex, then the header check and the
   CRC) and continues there. The skipped bytes are one damaged region ``(offset, bytes, records)``; records
   is an estimate: the number of v2 sync marks in the region, at least 1. If no good record follows in the
   buffer, the region ends where a record might still begin that the buffer cannot decide (a candidate
   whose body runs past the end, or the last 3 bytes), and the rest is `torn_bytes`.

So `len(data) - torn_bytes` bytes are always decided: a chunked reader resumes there, and at the end of a
file the torn bytes are its tail. A record can only be lost to damage inside it; every good record after the
damage is found again. Resync is cheap: one C regex scan up to the next sync mark, normally the next
record, ~150 bytes away. (A forged record inside a body -- a uid string holding a framed record -- can only
matter while resynchronising after real damage.)
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from idled.log.errors import RecordTooLarge

__all__ = [
    "SYNC", "HEADER", "HEADER_BYTES", "HEADER_V1", "MAX_RECORD_BYTES", "DecodeResult", "Damage",
    "encode_record", "encode_record_v1", "decode_buffer",
]

SYNC: Final = b"\xa5\xd1"
HEADER: Final = struct.Struct(">2sHII")  # sync, check, body length, CRC32 of the body
HEADER_BYTES: Final = HEADER.size
HEADER_V1: Final = struct.Struct(">II")  # body length, CRC32 of the body
MAX_RECORD_BYTES: Final = 64 * 1024  # body bytes; a presence event is ~150

_LENGTH_CRC: Final = struct.Struct(">II")
_CHECK: Final = struct.Struct(">H")
_V1_BYTES: Final = HEADER_V1.size
_SYNC_BYTE: Final = SYNC[0]
_SYNC_WORD: Final = int.from_bytes(SYNC, "big")
_FAST_HEADER: Final = struct.Struct(">HHII")  # HEADER with the sync as an int: no bytes object per record
# Where a record may start: a v2 sync, or a v1 length of 1..65535 (00 00, not followed by 00 00) or 65536.
_CANDIDATE: Final = re.compile(rb"\xa5\xd1|\x00\x00(?!\x00\x00)|\x00\x01\x00\x00")
_UNDECIDED_TAIL: Final = 3  # a candidate needs up to 4 bytes to be recognised
_UNPACK_ERRORS: Final = (ValueError, TypeError, msgpack.UnpackException)
# First byte of a msgpack map: fixmap 0x80-0x8f, map16 0xde, map32 0xdf.
_MAP_FIRST_BYTE: Final = tuple(0x80 <= b <= 0x8F or b in (0xDE, 0xDF) for b in range(256))

# _probe results
_GOOD, _BAD, _INCOMPLETE = 0, 1, 2

Damage = tuple[int, int, int]  # (offset, bytes, records: estimated, at least 1)


def encode_record(event: Mapping[str, Any]) -> bytes:
    """One framed v2 record for `event`. Raises RecordTooLarge, TypeError (unpackable)."""
    body = msgpack.packb(event if isinstance(event, dict) else dict(event), use_bin_type=True)
    if len(body) > MAX_RECORD_BYTES:
        raise RecordTooLarge(f"record body is {len(body)} bytes, limit {MAX_RECORD_BYTES}")
    tail = _LENGTH_CRC.pack(len(body), zlib.crc32(body))
    return SYNC + _CHECK.pack(zlib.crc32(tail) & 0xFFFF) + tail + body


def encode_record_v1(event: Mapping[str, Any]) -> bytes:
    """A record in the old v1 format (tests and compatibility checks only: writers write v2)."""
    body = msgpack.packb(dict(event), use_bin_type=True)
    return HEADER_V1.pack(len(body), zlib.crc32(body)) + body


@dataclass(frozen=True, slots=True)
class DecodeResult:
    """What `decode_buffer` found in one buffer.

    records: good records in buffer order. good_bytes: offset just past the last good record (0 if none).
    corrupt: records lost to damage (estimated, see Damage). skipped_bytes: bytes in damaged regions.
    torn_bytes: trailing bytes not decided -- an incomplete record, or bytes that may begin one.
    damage: the damaged regions, (offset in the buffer, bytes, records), in order.
    """

    records: list[dict[str, Any]]
    good_bytes: int
    corrupt: int
    torn_bytes: int
    skipped_bytes: int = 0
    damage: list[Damage] = field(default_factory=list)


def _probe(view: memoryview, offset: int, size: int) -> tuple[int, Any, int]:
    """Is there a good record at `offset`? (_GOOD, record, end) / (_BAD, None, 0) / (_INCOMPLETE, None, 0).

    _INCOMPLETE: a verified v2 header, or a plausible v1 one, whose body runs past `size` (or too few bytes
    to tell)."""
    if view[offset] == _SYNC_BYTE:
        if size - offset < HEADER_BYTES:
            return _INCOMPLETE, None, 0
        sync, check, length, crc = HEADER.unpack_from(view, offset)
        if sync != SYNC or check != zlib.crc32(view[offset + 4 : offset + HEADER_BYTES]) & 0xFFFF:
            return _BAD, None, 0
        start = offset + HEADER_BYTES
    else:
        if size - offset < _V1_BYTES:
            return _INCOMPLETE, None, 0
        length, crc = HEADER_V1.unpack_from(view, offset)
        start = offset + _V1_BYTES
    if length == 0 or length > MAX_RECORD_BYTES:
        return _BAD, None, 0
    end = start + length
    if end > size:
        return _INCOMPLETE, None, 0
    if not _MAP_FIRST_BYTE[view[start]]:
        return _BAD, None, 0  # a body is a msgpack map: rejects most resync candidates before a CRC
    body = view[start:end]
    if zlib.crc32(body) != crc:
        return _BAD, None, 0
    try:
        record = msgpack.unpackb(body, raw=False)
    except _UNPACK_ERRORS:
        return _BAD, None, 0
    if type(record) is not dict or type(record.get("seq")) is not int:
        return _BAD, None, 0  # CRC-valid but not an event: a writer bug, not worth a reader crashing over
    return _GOOD, record, end


def _resync(view: memoryview, start: int, size: int) -> tuple[int, int]:
    """(offset of the next good record at or after `start`, or -1; offset of the first undecided byte).

    Every candidate is probed until a good one is found: an incomplete candidate does not stop the search,
    since a complete good record after it proves the candidate was damage."""
    undecided = -1
    pos = start
    search = _CANDIDATE.search
    while True:
        match = search(view, pos)
        if match is None:
            break
        candidate = match.start()
        status, _record, _end = _probe(view, candidate, size)
        if status == _GOOD:
            return candidate, candidate
        if status == _INCOMPLETE and undecided < 0:
            undecided = candidate
        pos = candidate + 1
    if undecided < 0:
        undecided = max(start, size - _UNDECIDED_TAIL)
    return -1, undecided


def _estimate(view: memoryview, start: int, end: int) -> int:
    return max(1, bytes(view[start:end]).count(SYNC))


def decode_buffer(data: bytes | bytearray | memoryview) -> DecodeResult:
    """Decode every framed record in `data` (e.g. a whole segment file). Pure: no I/O, no state.

    Spark calls this in mapPartitions on files read with binaryFiles; it never raises on bad input.
    """
    view = memoryview(data)
    size = len(view)
    unpack_header = _FAST_HEADER.unpack_from
    crc32 = zlib.crc32
    unpackb = msgpack.unpackb
    records: list[dict[str, Any]] = []
    damage: list[Damage] = []
    offset = good = 0
    while offset < size:
        # The common case inline: a whole good record (v2, or v1 from an old segment). The v2 header check is
        # not needed here -- the body's CRC over exactly `length` bytes verifies the length -- only where a
        # length must be trusted before its body is read.
        if size - offset >= HEADER_BYTES:
            sync, check, length, crc = unpack_header(view, offset)
            if sync == _SYNC_WORD:
                start = offset + HEADER_BYTES
            elif sync == 0:  # v1 (length < 65536): its u32 length is `check`, its CRC the `length` field
                length, crc, start = check, length, offset + _V1_BYTES
            else:
                start = size  # neither: the slow path decides
            end = start + length
            if start < size and length <= MAX_RECORD_BYTES and end <= size:
                body = view[start:end]
                if crc32(body) == crc and length:
                    try:
                        record = unpackb(body, raw=False)
                    except _UNPACK_ERRORS:
                        record = None
                    if type(record) is dict and type(record.get("seq")) is int:
                        records.append(record)
                        offset = good = end
                        continue
        status, record, end = _probe(view, offset, size)
        if status == _GOOD:
            records.append(record)
            offset = good = end
            continue
        if status == _INCOMPLETE and view[offset] == _SYNC_BYTE:
            break  # torn: a verified v2 header is believed
        found, undecided = _resync(view, offset + 1, size)
        if status == _INCOMPLETE and found < 0:
            break  # torn: a v1 length is believed only if no good record follows it
        stop = found if found >= 0 else undecided
        if stop > offset:
            damage.append((offset, stop - offset, _estimate(view, offset, stop)))
        if found < 0:
            offset = max(offset, undecided)
            break
        offset = found
    return DecodeResult(
        records,
        good,
        sum(region[2] for region in damage),
        size - offset,
        sum(region[1] for region in damage),
        damage,
    )
