"""The record codec: one framed record per presence event, and the one decoder every reader uses.

See `idled.log.eventlog` for the theory of operation (record format, how a buffer is scanned).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from idled.log.errors import RecordTooLarge

__all__ = ["HEADER", "HEADER_BYTES", "MAX_RECORD_BYTES", "DecodeResult", "encode_record", "decode_buffer"]

HEADER: Final = struct.Struct(">II")  # body length, CRC32 of the body
HEADER_BYTES: Final = HEADER.size
MAX_RECORD_BYTES: Final = 64 * 1024  # body bytes; a presence event is ~150


def encode_record(event: Mapping[str, Any]) -> bytes:
    """One framed record (header + msgpack body) for `event`. Raises RecordTooLarge, TypeError (unpackable)."""
    body = msgpack.packb(event if isinstance(event, dict) else dict(event), use_bin_type=True)
    if len(body) > MAX_RECORD_BYTES:
        raise RecordTooLarge(f"record body is {len(body)} bytes, limit {MAX_RECORD_BYTES}")
    return HEADER.pack(len(body), zlib.crc32(body)) + body


@dataclass(frozen=True, slots=True)
class DecodeResult:
    """What `decode_buffer` found in one buffer.

    records: good records in buffer order. good_bytes: offset just past the last good record (0 if none).
    corrupt: records skipped for a CRC mismatch or an undecodable body, plus one if the scan stopped at an
    implausible length. torn_bytes: trailing bytes not consumed -- an incomplete record, or everything from
    an implausible length on. broken: the scan stopped at an implausible length (more data will not help).
    """

    records: list[dict[str, Any]]
    good_bytes: int
    corrupt: int
    torn_bytes: int
    broken: bool = False


_UNPACK_ERRORS: Final = (ValueError, TypeError, msgpack.UnpackException)


def decode_buffer(data: bytes | bytearray | memoryview) -> DecodeResult:
    """Decode every framed record in `data` (e.g. a whole segment file). Pure: no I/O, no state.

    Spark calls this in mapPartitions on files read with binaryFiles; it never raises on bad input.
    """
    view = memoryview(data)
    size = len(view)
    unpack_header = HEADER.unpack_from
    crc32 = zlib.crc32
    unpackb = msgpack.unpackb
    records: list[dict[str, Any]] = []
    offset = good = corrupt = 0
    broken = False
    while size - offset >= HEADER_BYTES:
        length, crc = unpack_header(view, offset)
        if length == 0 or length > MAX_RECORD_BYTES:
            corrupt += 1
            broken = True
            break
        end = offset + HEADER_BYTES + length
        if end > size:
            break
        body = view[offset + HEADER_BYTES : end]
        offset = end
        if crc32(body) != crc:
            corrupt += 1
            continue
        try:
            record = unpackb(body, raw=False)
        except _UNPACK_ERRORS:
            corrupt += 1
            continue
        if type(record) is not dict or type(record.get("seq")) is not int:
            corrupt += 1  # CRC-valid but not an event: a writer bug, not worth a reader crashing over
            continue
        records.append(record)
        good = end
    return DecodeResult(records, good, corrupt, size - offset, broken)
