"""The replication link's server -> standby messages (sans-IO): what an active core sends a standby core.

Theory of operation
-------------------
A standby logs in as an observer and sends ``{"op":"replicate","from":SEQ}`` (`messages.Replicate`) instead
of ``subscribe``. From then on the active core sends only these frames, in order:

``{"op":"records","records":[BIN, ...],"head":SEQ,"ts":T}``
    log records exactly as the active's segments hold them (each a framed record: header and msgpack
    body, see `idled.log.records`), in seq order, all durable on the active under its fsync policy.
    ``head`` is the active's durable seq when it sent the frame and ``ts`` its wall clock then, so the
    standby knows how far behind it is. With no record to send, the active sends an empty ``records``
    every ``HEARTBEAT`` seconds: a standby that hears nothing for ``LINK_TIMEOUT`` reconnects.
``{"op":"resync","oldest":SEQ,"snapshot":N|null,"size":BYTES}``
    the standby asked for a seq the active no longer retains. What follows is the active's newest
    snapshot (``size`` bytes in ``snapshot_part`` frames; none when ``snapshot`` is null), then records
    from ``oldest``, the first seq the active still has.
``{"op":"snapshot_part","data":BIN}``
    up to ``PART_BYTES`` of the snapshot file, in order.

``error`` frames (`messages.Error`) end the link as on any connection. A frame holds at most
``MAX_BATCH_BYTES`` of records plus one record, so ``MAX_FRAME`` bounds the standby's decoder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgpack

from idled.protocol.messages import MAX_SEQ, ErrorCode, ProtocolError, ServerMessage
from idled.protocol.parse import parse_server_message

__all__ = [
    "HEARTBEAT", "LINK_TIMEOUT", "MAX_BATCH_BYTES", "MAX_BATCH_RECORDS", "MAX_FRAME", "PART_BYTES",
    "MAX_SNAPSHOT_BYTES", "Records", "Resync", "SnapshotPart", "ReplicationMessage", "encode_records",
    "encode_resync", "encode_snapshot_part", "parse_replication_message",
]

HEARTBEAT: Final = 1.0  # seconds between two empty `records` frames when nothing is to be sent
LINK_TIMEOUT: Final = 5.0  # seconds of silence after which a standby gives the link up and reconnects
MAX_BATCH_RECORDS: Final = 2000  # records in one `records` frame, at most
MAX_BATCH_BYTES: Final = 256 * 1024  # record bytes in one `records` frame (plus one record), at most
PART_BYTES: Final = 256 * 1024  # snapshot bytes in one `snapshot_part` frame
MAX_FRAME: Final = MAX_BATCH_BYTES + 2 * 65_536 + 64 * 1024  # a standby's frame limit: a batch and slack
MAX_SNAPSHOT_BYTES: Final = 4 << 30  # a larger snapshot is refused (a 1M-session snapshot is ~28 MB)

_packb = msgpack.packb


@dataclass(frozen=True, slots=True)
class Records:
    records: tuple[bytes, ...]
    head: int
    ts: float


@dataclass(frozen=True, slots=True)
class Resync:
    oldest: int
    snapshot: int | None
    size: int


@dataclass(frozen=True, slots=True)
class SnapshotPart:
    data: bytes


ReplicationMessage: TypeAlias = Records | Resync | SnapshotPart | ServerMessage


def _frame(obj: dict[str, Any]) -> bytes:
    body = _packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def encode_records(records: list[bytes], head: int, ts: float) -> bytes:
    return _frame({"op": "records", "records": records, "head": head, "ts": ts})


def encode_resync(oldest: int, snapshot: int | None, size: int) -> bytes:
    return _frame({"op": "resync", "oldest": oldest, "snapshot": snapshot, "size": size})


def encode_snapshot_part(data: bytes) -> bytes:
    return _frame({"op": "snapshot_part", "data": data})


def _bad(reason: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, reason)


def _seq(value: Any, what: str) -> int:
    if type(value) is int and 0 <= value <= MAX_SEQ:
        return value
    raise _bad(f"{what} must be an int in 0..2**63-1")


def _parse_records(obj: dict[str, Any]) -> Records:
    records = obj.get("records")
    if type(records) is not tuple or not all(type(record) is bytes for record in records):
        raise _bad("records must be an array of bin")
    if len(records) > MAX_BATCH_RECORDS:
        raise _bad(f"more than {MAX_BATCH_RECORDS} records in one frame")
    ts = obj.get("ts")
    if type(ts) is not float or not math.isfinite(ts):
        raise _bad("ts must be a finite float")
    return Records(records, _seq(obj.get("head"), "head"), ts)


def _parse_resync(obj: dict[str, Any]) -> Resync:
    snapshot = obj.get("snapshot")
    size = _seq(obj.get("size"), "size")
    if size > MAX_SNAPSHOT_BYTES:
        raise _bad(f"snapshot of {size} bytes: more than {MAX_SNAPSHOT_BYTES}")
    return Resync(_seq(obj.get("oldest"), "oldest"), None if snapshot is None else _seq(snapshot, "snapshot"), size)


def _parse_part(obj: dict[str, Any]) -> SnapshotPart:
    data = obj.get("data")
    if type(data) is not bytes or not data:
        raise _bad("data must be non-empty bin")
    return SnapshotPart(data)


_PARSERS: Final[dict[str, Callable[[dict[str, Any]], ReplicationMessage]]] = {
    "records": _parse_records, "resync": _parse_resync, "snapshot_part": _parse_part,
}


def parse_replication_message(obj: Any) -> ReplicationMessage:
    """A decoded frame from the active core -> its message (the replication ops, or any server message)."""
    if type(obj) is dict:
        op = obj.get("op")
        parser = _PARSERS.get(op) if type(op) is str else None
        if parser is not None:
            return parser(obj)
    return parse_server_message(obj)
