"""Log shipping's file side: read records as raw bytes (the active core), write them as they are (a standby).

Theory of operation
-------------------
A standby's log must be the active's, record for record: the same seqs and the same bytes, so that a
checksum, a backup or the Spark job cannot tell the copies apart. So records travel as the bytes the
active's segments hold (header and msgpack body, v1 or v2: `idled.log.records`), never decoded and
encoded again.

* `RawReader` (the active): a position in the segment files -- path and byte offset -- kept between
  batches, so each batch reads only new bytes. `take(below, ...)` returns ``(seq, bytes)`` of the good
  records from the position on with seq < ``below``, in bounded batches (records and bytes), moving on to
  the next segment when one is read to its end and a later one exists. Damage is skipped as every reader
  skips it (``damaged`` counts it); a segment deleted under the reader raises `Gone`.
* `append_raw(log, raws)` (the standby): checks that the bytes are exactly ``len(raws)`` good records
  (CRC, framing, seq order) and appends them through `EventLog.append(..., encoded=raws)`, which keeps the
  log's derived state -- open sessions, last-seen map, rotation, retention, snapshots -- as for records it
  encodes itself.
* Re-sync (a standby that fell behind the active's retention): `move_aside(directory)` moves the old log
  into ``aside-<time>/`` inside the data directory (never deleted: the operator decides), and
  `SnapshotSink` receives the active's snapshot under a temporary name, installed with `install()` once
  the records below its seq are written (the snapshot then describes exactly the log before it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Final

from idled.log.errors import DiskFull, EventLogError
from idled.log.eventlog import EventLog
from idled.log.records import _BAD, _GOOD, _probe, _resync, decode_buffer
from idled.log.segments import READ_CHUNK_BYTES, fsync_directory, list_segments, segments_from
from idled.log.snapshot import read_snapshot_state, snapshot_name

__all__ = ["ASIDE_PREFIX", "INCOMING_SNAPSHOT", "Gone", "ShippedRecordsBad", "RawReader", "append_raw", "decode_raw",
           "read_record", "record_seqs",
           "move_aside", "SnapshotSink"]

ASIDE_PREFIX: Final = "aside-"
INCOMING_SNAPSHOT: Final = "snapshot-incoming.part"
_KEEP: Final = frozenset({"lock"})  # stays in place when the log is moved aside


class Gone(EventLogError):
    """The segment a reader was in was deleted (retention) before it was read to its end."""


class ShippedRecordsBad(EventLogError):
    """Bytes received as records are not exactly good records in seq order: nothing of them was written."""


class RawReader:
    """Raw records from ``from_seq`` on, batch by batch (blocking file I/O: call it in a worker thread)."""

    def __init__(self, directory: str, from_seq: int) -> None:
        self.directory = directory
        self.next = from_seq  # seqs below this are not returned again
        self.damaged = 0  # damaged regions skipped
        self._path: str | None = None
        self._offset = 0
        segments = segments_from(directory, from_seq)
        if segments:
            self._path = segments[0][1]

    def take(self, below: int, max_records: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Good records with ``next <= seq < below``: at most ``max_records`` and about ``max_bytes``."""
        out: list[tuple[int, bytes]] = []
        size = 0
        while len(out) < max_records and size < max_bytes:
            if self._path is None and not self._next_segment():
                break
            assert self._path is not None
            offset = self._offset
            stop, taken = self._read(below, max_records - len(out), max_bytes - size, out)
            size += taken
            if stop:
                break
            if self._offset > offset:
                continue  # a whole chunk read (perhaps all below ``next``): the segment may hold more
            if not self._next_segment():
                break
        if out:
            self.next = out[-1][0] + 1
        return out

    def _next_segment(self) -> bool:
        """Move to the segment after the current one if it is read to its end and a later one exists."""
        later = [path for first, path in list_segments(self.directory)
                 if self._path is None or path > self._path]
        if not later:
            return False
        if self._path is not None:
            try:
                if os.stat(self._path).st_size > self._offset:
                    return False  # not read to its end yet (written to since): read that first
            except FileNotFoundError:
                raise Gone(f"{self._path} was deleted before it was read to its end") from None
        self._path, self._offset = later[0], 0
        return True

    def _read(self, below: int, max_records: int, max_bytes: int, out: list[tuple[int, bytes]]) -> tuple[bool, int]:
        """Records from the current position; (True: a record at or beyond ``below`` or a limit stopped it,
        bytes taken)."""
        assert self._path is not None
        try:
            with open(self._path, "rb", buffering=0) as file:
                file.seek(self._offset)
                data = file.read(READ_CHUNK_BYTES)
        except FileNotFoundError:
            raise Gone(f"{self._path} was deleted before it was read to its end") from None
        view = memoryview(data)
        size, pos, taken = len(data), 0, 0
        while pos < size and len(out) < max_records and taken < max_bytes:
            status, record, end = _probe(view, pos, size)
            if status == _GOOD:
                seq = record["seq"]
                if seq >= below:
                    self._offset += pos
                    return True, taken
                if seq >= self.next:
                    out.append((seq, bytes(view[pos:end])))
                    taken += end - pos
                pos = end
            elif status == _BAD:
                good, _undecided = _resync(view, pos + 1, size)
                if good < 0:
                    break  # damage up to the end of what was read: decided once more bytes are there
                self.damaged += 1
                pos = good
            else:
                break  # incomplete: a write in progress (or a torn tail)
        self._offset += pos
        return len(out) >= max_records or taken >= max_bytes, taken


def read_record(directory: str, seq: int) -> bytes | None:
    """The bytes of the record ``seq`` as the segments hold it; None if no good record has that seq (blocking)."""
    batch = RawReader(directory, seq).take(seq + 1, 1, READ_CHUNK_BYTES)
    return batch[0][1] if batch and batch[0][0] == seq else None


def decode_raw(raws: Sequence[bytes]) -> list[dict[str, Any]]:
    """The records ``raws`` hold, one each; ShippedRecordsBad if they are not exactly that."""
    result = decode_buffer(b"".join(raws))
    if len(result.records) != len(raws) or result.damage or result.torn_bytes:
        raise ShippedRecordsBad(f"{len(raws)} records received, {len(result.records)} good: not written")
    return result.records


def record_seqs(raws: Sequence[bytes]) -> list[int]:
    return [record["seq"] for record in decode_raw(raws)]


def append_raw(log: EventLog, raws: Sequence[bytes]) -> tuple[list[dict[str, Any]], DiskFull | None]:
    """Append records received as bytes, byte for byte (see the module docstring): (the records written,
    decoded; a full disk that stopped the append part-way, or None). A full disk is returned, not raised, with
    the records that fitted before it (the log's ``last_seq`` says which), so that the caller passes those on
    before it retries the rest. Raises ShippedRecordsBad if they are not exactly good records, and whatever
    else `EventLog.append` raises."""
    if not raws:
        return [], None
    records = decode_raw(raws)
    try:
        log.append(records, encoded=raws)
    except DiskFull as exc:
        return [record for record in records if record["seq"] <= log.last_seq], exc
    return records, None


def move_aside(directory: str) -> tuple[str, int]:
    """Move every file of the log in ``directory`` (but the lock and earlier asides) into a new
    ``aside-<time>`` directory there; fsync both. Returns (that directory, files moved). Call it with the
    log closed."""
    target = os.path.join(directory, ASIDE_PREFIX + time.strftime("%Y%m%dT%H%M%S", time.gmtime()))
    suffix = 0
    while os.path.lexists(target + (f".{suffix}" if suffix else "")):
        suffix += 1
    target += f".{suffix}" if suffix else ""
    os.mkdir(target)
    moved = 0
    for name in sorted(os.listdir(directory)):
        if name in _KEEP or name.startswith(ASIDE_PREFIX):
            continue
        os.rename(os.path.join(directory, name), os.path.join(target, name))
        moved += 1
    fsync_directory(target)
    fsync_directory(directory)
    return target, moved


class SnapshotSink:
    """The active's snapshot as it arrives, under a temporary name in the log's directory (ignored by every
    reader); `install()` verifies it and renames it to ``snapshot-<seq>``."""

    def __init__(self, directory: str, seq: int, size: int) -> None:
        self.directory, self.seq, self.size = directory, seq, size
        self.path = os.path.join(directory, INCOMING_SNAPSHOT)
        self.received = 0
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    @property
    def complete(self) -> bool:
        return self.received >= self.size

    def write(self, data: bytes) -> None:
        if self._fd is None or self.received + len(data) > self.size:
            raise ShippedRecordsBad(f"snapshot longer than the {self.size} bytes announced")
        os.write(self._fd, data)
        self.received += len(data)

    def install(self) -> str:
        """fsync, verify (`read_snapshot_state`), rename into place, fsync the directory."""
        assert self._fd is not None and self.complete
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        try:
            seq, _sessions, _seen = read_snapshot_state(self.path)
        except (OSError, ValueError) as exc:
            raise ShippedRecordsBad(f"the active's snapshot does not verify: {exc}") from exc
        if seq != self.seq:
            raise ShippedRecordsBad(f"the active's snapshot holds seq {seq}, announced {self.seq}")
        target = os.path.join(self.directory, snapshot_name(seq))
        os.replace(self.path, target)
        fsync_directory(self.directory)
        return target

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
