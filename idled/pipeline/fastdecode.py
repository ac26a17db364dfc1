"""A faster decode of clean segment windows: the same rows as `decode_buffer` + `records.to_row`, or nothing.

Theory of operation
-------------------
`idled.log.records.decode_buffer` is the one decoder that *decides* what a segment holds (good records,
damage, torn tails). Its cost in the pipeline is mostly building a dict per record (`msgpack.unpackb`) that
`records.iter_rows` then takes apart into a row: ~2.1 us a record of the paired path's ~4 us. This module
decodes one window of a segment (`records.CHUNK_BYTES`) without dicts: each body's CRC with `zlib.crc32`,
the body with msgspec into a `_Fields` struct holding only the fields a row uses (the others -- last_seen,
timeout -- are skipped by the C decoder without building a value), then the row, ~1 us a record.

It handles only the *clean* window -- every record a v2 frame whose CRC matches and whose body decodes to
a map of str keys with an int ``seq`` -- and gives up (`None`) at the first thing that is not, before
yielding anything: the caller then decodes that window with `decode_buffer` as before. So a window is
either decoded entirely here or entirely by the daemon's decoder, and for a clean window both give the same
records and the same torn tail, by these rules (mirroring `decode_buffer`'s inline path and `_probe`):

* a frame is accepted as `decode_buffer`'s inline path accepts it: v2 sync, 0 < length <= MAX_RECORD_BYTES,
  body inside the window, CRC of the body equal (the header's check field is not needed there: the CRC over
  exactly `length` bytes verifies the length);
* the window ends with a torn record exactly where `_probe` says *incomplete*: fewer than a header's bytes
  left starting with the sync byte, or a v2 header whose check verifies and whose plausible length runs past
  the window. Anything else -- a v1 frame, a bad sync, a bad check, a CRC failure, a body msgspec refuses
  (not a map, a non-str key, trailing bytes, bad UTF-8) or without an int seq -- is `None`;
* the row is `records.to_row`'s, field for field: every field is decoded as `Any` (the types a row needs
  are checked here exactly as `to_row` checks them), and an absent field is None, which `to_row` treats as
  absent too. A record `to_row` calls malformed is counted, not a reason to give up.

`tests/pipeline/test_fastdecode.py` holds both paths equal on generated logs, damaged windows and records
with odd fields.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import Any, Final

import msgspec

from idled.log.records import HEADER_BYTES, MAX_RECORD_BYTES, SYNC

__all__ = ["fast_window", "finite_or_none", "make_row"]

_HEADER: Final = struct.Struct(">HHII")  # sync as an int, check, body length, CRC32 of the body
_SYNC_WORD: Final = int.from_bytes(SYNC, "big")
_SYNC_BYTE: Final = SYNC[0]


class _Fields(msgspec.Struct, gc=False):
    """The fields of a record a row uses; any other key is skipped by the decoder."""

    seq: Any = None
    kind: Any = None
    uid: Any = None
    ts: Any = None
    reason: Any = None
    deadline: Any = None
    detector: Any = None
    device: Any = None
    grace: Any = None


_DECODE: Final = msgspec.msgpack.Decoder(_Fields).decode


def finite_or_none(value: Any) -> float | None:
    """A record's time field as a float, None if it is not a finite number (shared with ``records``)."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int:
        return float(value)
    return None


def _row(f: _Fields, daemon: int) -> tuple[Any, ...] | None:
    """`make_row` over the struct (the record's uncommon shapes: the hot loop inlines the common one)."""
    return make_row(daemon, f.seq, f.kind, f.uid, f.ts, f.reason, f.deadline, f.detector, f.device, f.grace)


def make_row(daemon: int, seq: int, kind: Any, uid: Any, ts: Any, reason: Any, deadline: Any, detector: Any,
             device: Any, grace: Any) -> tuple[Any, ...] | None:
    """The row of one record's fields, None if it is malformed (``records.to_row`` over a decoded dict too)."""
    if kind == "online":
        online = True
    elif kind == "offline":
        online = False
    else:
        return None
    if type(uid) is int:
        key = f"i:{uid}"
    elif type(uid) is str:
        key = "s:" + uid
    else:
        return None
    ts = finite_or_none(ts)
    if ts is None:
        return None
    if type(reason) is not str:
        reason = None
    if online or reason != "idle":
        deadline = detector = None
    else:
        deadline = finite_or_none(deadline)
        if type(detector) is not str:
            detector = "unknown"
    grace = None if online else finite_or_none(grace)
    if type(device) is not str:
        device = None
    return (daemon, seq, online, key, ts, reason, deadline, detector, device, grace)


def _torn_at(view: memoryview, offset: int, size: int) -> bool:
    """Would `decode_buffer` stop at `offset` as at a torn record (`_probe` says incomplete, sync byte first)?"""
    if view[offset] != _SYNC_BYTE:
        return False
    if size - offset < HEADER_BYTES:
        return True
    sync, check, length, _crc = _HEADER.unpack_from(view, offset)
    if sync != _SYNC_WORD or check != zlib.crc32(view[offset + 4 : offset + HEADER_BYTES]) & 0xFFFF:
        return False
    return 0 < length <= MAX_RECORD_BYTES and offset + HEADER_BYTES + length > size


# What a clean window gives: (rows, good records, malformed records, torn bytes, first seq or None, last seq,
# records whose seq is not above the one before).
Window = tuple[list[Any], int, int, int, "int | None", int, int]


def fast_window(view: memoryview, daemon: int, previous: int) -> Window | None:
    """The rows and counters of a clean window, or None (see the module doc); `previous` is the seq of the
    record before the window (every good record counts, malformed ones too, as in `records.iter_rows`).

    The hot loop: the common records inline -- an online, an offline without grace, an idle one with a
    float deadline, a str detector and an int uid; each with a float ts, a str reason and no or a str device
    -- and `_row` for the rest."""
    size = len(view)
    unpack = _HEADER.unpack_from
    crc32 = zlib.crc32
    decode = _DECODE
    isfinite = math.isfinite
    rows: list[Any] = []
    append = rows.append
    offset = records = malformed = unordered = 0
    first: int | None = None
    while offset < size:
        if size - offset < HEADER_BYTES:
            if _torn_at(view, offset, size):
                break
            return None
        sync, _check, length, crc = unpack(view, offset)
        start = offset + HEADER_BYTES
        end = start + length
        if sync != _SYNC_WORD or not 0 < length <= MAX_RECORD_BYTES:
            return None
        if end > size:
            if _torn_at(view, offset, size):
                break
            return None
        body = view[start:end]
        if crc32(body) != crc:
            return None
        try:
            f = decode(body)
        except (msgspec.DecodeError, ValueError, TypeError):
            return None
        seq = f.seq
        if type(seq) is not int:
            return None
        if seq <= previous:
            unordered += 1
        if first is None:
            first = seq
        previous = seq
        records += 1
        offset = end
        ts = f.ts
        reason = f.reason
        device = f.device
        if type(ts) is float and type(reason) is str and isfinite(ts) and (device is None or type(device) is str):
            kind = f.kind
            uid = f.uid
            if kind == "online":
                if type(uid) is int:
                    append((daemon, seq, True, f"i:{uid}", ts, reason, None, None, device, None))
                    continue
                if type(uid) is str:
                    append((daemon, seq, True, "s:" + uid, ts, reason, None, None, device, None))
                    continue
            elif kind == "offline" and f.grace is None:
                if reason != "idle":
                    if type(uid) is int:
                        append((daemon, seq, False, f"i:{uid}", ts, reason, None, None, device, None))
                        continue
                    if type(uid) is str:
                        append((daemon, seq, False, "s:" + uid, ts, reason, None, None, device, None))
                        continue
                else:  # an idle offline: a lateness sample (a float deadline, a str detector)
                    deadline = f.deadline
                    detector = f.detector
                    if type(deadline) is float and isfinite(deadline) and type(detector) is str and type(uid) is int:
                        append((daemon, seq, False, f"i:{uid}", ts, reason, deadline, detector, device, None))
                        continue
        row = _row(f, daemon)
        if row is None:
            malformed += 1
        else:
            append(row)
    return rows, records, malformed, size - offset, first, previous, unordered
