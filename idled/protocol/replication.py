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
``{"op":"resync",...,"diverged":SEQ}``
    the same, when the standby's ``replicate`` carried ``last`` and this core's record at that seq is missing
    or differs: the standby holds records this core never had (an old leader back as a standby). It moves
    its whole log aside exactly as for a re-sync; ``diverged`` only changes what it logs.
``{"op":"snapshot_part","data":BIN}``
    up to ``PART_BYTES`` of the snapshot file, in order.

``error`` frames (`messages.Error`) end the link as on any connection. A frame holds at most
``MAX_BATCH_BYTES`` of records plus one record, so ``MAX_FRAME`` bounds the standby's decoder.

The standby's side
------------------
``{"op":"replicate","from":SEQ,"last":[SEQ-1,CRC]}`` (`ReplicateChecked`, a `messages.Replicate` with the
check): ``last`` names the standby's last record -- its seq, one below ``from``, and the CRC-32 of its bytes
as the segment holds them (`record_crc`) -- so that the active can tell a standby that merely lags from one
whose log went its own way. Absent when ``from`` is 1 (nothing to check) and from older standbys: then the
active answers as before.

After ``replicate`` the standby sends only ``{"op":"ack","seq":N}`` (`Ack`: N is the last seq it has synced
under its own fsync policy; one after every ``records`` frame, heartbeats included, so an ack also says the
standby is alive), ``ping`` and ``bye``. They are small: ``MAX_STANDBY_FRAME`` bounds the active's decoder
for them (`parse_standby_message`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgpack

from idled.protocol.messages import ClientMessage, ServerMessage
from idled.protocol.parse import parse_client_message, parse_server_message
from idled.protocol.replicate import ReplicateChecked, bad_message, checked_seq, parse_replicate  # re-exported: the link's frames in one place

__all__ = [
    "HEARTBEAT", "LINK_TIMEOUT", "MAX_BATCH_BYTES", "MAX_BATCH_RECORDS", "MAX_FRAME", "PART_BYTES",
    "MAX_SNAPSHOT_BYTES", "MAX_STANDBY_FRAME", "REPLICATE_NEEDS_STANDBY", "Ack", "Records", "ReplicateChecked", "Resync", "SnapshotPart",
    "ReplicationMessage", "StandbyMessage", "encode_ack", "encode_records", "encode_replicate", "encode_resync",
    "encode_snapshot_part", "parse_replicate", "parse_replication_message", "parse_standby_message", "record_crc",
]

HEARTBEAT: Final = 1.0  # seconds between two empty `records` frames when nothing is to be sent
LINK_TIMEOUT: Final = 5.0  # seconds of silence after which a standby gives the link up and reconnects
MAX_BATCH_RECORDS: Final = 2000  # records in one `records` frame, at most
MAX_BATCH_BYTES: Final = 256 * 1024  # record bytes in one `records` frame (plus one record), at most
PART_BYTES: Final = 256 * 1024  # snapshot bytes in one `snapshot_part` frame
MAX_FRAME: Final = MAX_BATCH_BYTES + 2 * 65_536 + 64 * 1024  # a standby's frame limit: a batch and slack
MAX_SNAPSHOT_BYTES: Final = 4 << 30  # a larger snapshot is refused (a 1M-session snapshot is ~28 MB)
# How an active core refuses a ``replicate`` from an observer login (the start of its reason): an older
# standby's; a standby that reads it logs in as a standby instead (idled.server.ha.follow, *Older actives*).
REPLICATE_NEEDS_STANDBY: Final = "replicate needs a standby login"
MAX_STANDBY_FRAME: Final = 256  # the active's frame limit for what a standby sends after replicate (an ack: ~20 B)

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


    diverged: int | None = None  # the seq of the standby's last record, when it is why (see above)


@dataclass(frozen=True, slots=True)
class SnapshotPart:
    data: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int


ReplicationMessage: TypeAlias = Records | Resync | SnapshotPart | ServerMessage
StandbyMessage: TypeAlias = Ack | ClientMessage  # the caller refuses all but ack, ping and bye


def record_crc(raw: bytes) -> int:
    """The check of one record as a segment holds it (header and body): CRC-32 of all its bytes."""
    return zlib.crc32(raw)


def _frame(obj: dict[str, Any]) -> bytes:
    body = _packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def encode_records(records: list[bytes], head: int, ts: float) -> bytes:
    return _frame({"op": "records", "records": records, "head": head, "ts": ts})


def encode_resync(oldest: int, snapshot: int | None, size: int, diverged: int | None = None) -> bytes:
    frame: dict[str, Any] = {"op": "resync", "oldest": oldest, "snapshot": snapshot, "size": size}
    if diverged is not None:
        frame["diverged"] = diverged
    return _frame(frame)


def encode_replicate(from_seq: int, last: tuple[int, int] | None) -> bytes:
    """A standby's ``replicate``; ``last`` (seq, crc) of its last record, None when it holds none."""
    frame: dict[str, Any] = {"op": "replicate", "from": from_seq}
    if last is not None:
        frame["last"] = list(last)
    return _frame(frame)


def encode_ack(seq: int) -> bytes:
    return _frame({"op": "ack", "seq": seq})


def encode_snapshot_part(data: bytes) -> bytes:
    return _frame({"op": "snapshot_part", "data": data})



def _parse_records(obj: dict[str, Any]) -> Records:
    records = obj.get("records")
    if type(records) is not tuple or not all(type(record) is bytes for record in records):
        raise bad_message("records must be an array of bin")
    if len(records) > MAX_BATCH_RECORDS:
        raise bad_message(f"more than {MAX_BATCH_RECORDS} records in one frame")
    ts = obj.get("ts")
    if type(ts) is not float or not math.isfinite(ts):
        raise bad_message("ts must be a finite float")
    return Records(records, checked_seq(obj.get("head"), "head"), ts)


def _parse_resync(obj: dict[str, Any]) -> Resync:
    snapshot = obj.get("snapshot")
    size = checked_seq(obj.get("size"), "size")
    if size > MAX_SNAPSHOT_BYTES:
        raise bad_message(f"snapshot of {size} bytes: more than {MAX_SNAPSHOT_BYTES}")
    diverged = obj.get("diverged")
    return Resync(checked_seq(obj.get("oldest"), "oldest"), None if snapshot is None else checked_seq(snapshot, "snapshot"), size,
                  None if diverged is None else checked_seq(diverged, "diverged"))


def _parse_part(obj: dict[str, Any]) -> SnapshotPart:
    data = obj.get("data")
    if type(data) is not bytes or not data:
        raise bad_message("data must be non-empty bin")
    return SnapshotPart(data)


_PARSERS: Final[dict[str, Callable[[dict[str, Any]], ReplicationMessage]]] = {
    "records": _parse_records, "resync": _parse_resync, "snapshot_part": _parse_part,
}


def parse_standby_message(obj: Any) -> StandbyMessage:
    """A decoded frame from a standby after its ``replicate``: an `Ack`, or a client message."""
    if type(obj) is dict and obj.get("op") == "ack":
        if len(obj) != 2:
            raise bad_message("ack takes only seq")
        return Ack(checked_seq(obj.get("seq"), "seq"))
    return parse_client_message(obj)


def parse_replication_message(obj: Any) -> ReplicationMessage:
    """A decoded frame from the active core -> its message (the replication ops, or any server message)."""
    if type(obj) is dict:
        op = obj.get("op")
        parser = _PARSERS.get(op) if type(op) is str else None
        if parser is not None:
            return parser(obj)
    return parse_server_message(obj)
