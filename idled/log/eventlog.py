"""Durable presence event log: CRC-framed records in append-only segment files. Pure sync: no trio here.

Theory of operation
-------------------
**Record.** Every presence event is one record: an 8-byte header, then a msgpack map (the body)::

    +----------------+----------------+---------------------------+
    | u32 BE length  | u32 BE CRC32   | body: msgpack map         |
    | of the body    | of the body    | {"seq": 7, "kind": ...}   |
    +----------------+----------------+---------------------------+

    00 00 00 7a | 44 0b d3 f3 | 89 a3 73 65 71 07 a4 6b 69 6e 64 a7 6f 66 66 ...
    122-byte body  its CRC32     map(9) "seq" 7 "kind" "off...   (seq 7, alice offline idle: 130 bytes)

The CRC is `zlib.crc32(body)`. A length of 0 or above `MAX_RECORD_BYTES` (64 KiB) is *implausible*: no
writer produces it, so a reader never allocates for it. A body is *good* when its CRC matches and it decodes
(`msgpack.unpackb`, never a streaming Unpacker) to a map whose "seq" is an int; other keys are not
validated, and readers must accept keys they do not know.

**Scanning a buffer** (`decode_buffer`, the one decoder everything uses, Spark included) walks headers:

1. fewer than 8 bytes left, or a plausible length whose body runs past the end -> stop: those trailing
   bytes are `torn_bytes` (a write cut short by a crash, or a reader that caught a write in progress);
2. implausible length -> count one corrupt record and stop (`broken`): without a trustworthy length there
   is no next header to find, so the rest of the buffer is `torn_bytes` too;
3. CRC mismatch or undecodable body -> count one corrupt record and skip it, since its length was
   plausible the next header is probably right after it;
4. good -> keep the record; `good_bytes` moves just past it.

**Segments.** Records live in files named by the seq of their first record, `f"{first_seq:020d}.seg"`
(zero-padded, so name order is seq order, and `ls` shows the log in order). Only the newest segment, the
*active* one, is ever written. `append` encodes and validates the whole batch first (seq strictly
increasing), then writes it with one `os.write` per segment touched -- no user-space buffer, so readers
see appended records at once. A record that would take a non-empty active segment past `segment_bytes`
starts a new segment (so segments stay within segment_bytes unless one record is larger). Rotation
sequence for a batch holding seq 41..50 when 44 crosses the limit::

    00000000000000000001.seg  [1..43]  <- 41..43 written here, fd kept open until the next sync()
    00000000000000000044.seg  [44..50] <- created O_EXCL, becomes active; directory marked dirty

**Durability.** `append` never fsyncs; `sync()` fdatasyncs every segment written since the last sync (the
rotated one too -- otherwise records 41..43 above would not be covered) and then, if a segment was created,
the directory, so the new name survives a power cut. A failed fsync raises `FsyncFailed` and poisons the
log: the kernel may already have dropped the dirty pages and marked them clean, so a retry could report
success for data that is gone (PostgreSQL's "fsyncgate"); every later append/sync raises again.

**Recovery** (`recover()`, once, before the first append): takes an exclusive `flock` on `<dir>/lock` (two
writers on one log would interleave records), scans every segment in order, and truncates the last
segment just past its last good record -- a crash can only tear what was being written, which is the end
of the active segment. Whatever followed is reported in `truncated_bytes`. The next seq is the largest
good seq + 1, or the last segment's name if that is larger (a segment emptied by truncation, or created
just before the crash, still names the first seq it was meant to hold), so seqs are never reused for
records that reached the disk. `online` maps each uid whose last retained record is `kind == "online"` to
that record: the server writes an offline "restart" record for each before accepting connections.

**Retention** (`apply_retention()`, also run after every rotation): deletes whole segments from the oldest
end while the log is over `retention_bytes` in total, or while a segment's mtime (the time of its newest
record) is older than `retention_seconds`; it stops at the first segment it keeps, so the retained log is
always one contiguous seq range, and it never deletes the active segment.

**Reading** (`iter_records`, `EventLog.read_from`, `LogTailer`) streams segments in 1 MiB chunks, so a
reader's memory is bounded by the chunk plus one record whatever the segment size; corrupt records are
skipped, a segment deleted under a reader is skipped.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from idled.log.errors import (
    EventLogError, FsyncFailed, LogLocked, LogStateError, RecordTooLarge, SeqOrderError, WriteFailed,
)
from idled.log.records import HEADER_BYTES, MAX_RECORD_BYTES, DecodeResult, decode_buffer, encode_record
from idled.log.segments import (
    READ_CHUNK_BYTES, SEGMENT_SUFFIX, SegmentScan, fsync_directory, list_segments, segment_name, write_all,
)
from idled.log.tailer import LogTailer, iter_records

__all__ = [
    "HEADER_BYTES", "MAX_RECORD_BYTES", "DEFAULT_SEGMENT_BYTES", "DEFAULT_RETENTION_BYTES",
    "DEFAULT_RETENTION_SECONDS", "SEGMENT_SUFFIX", "LOCK_NAME", "READ_CHUNK_BYTES",
    "EventLogError", "FsyncFailed", "WriteFailed", "RecordTooLarge", "SeqOrderError", "LogLocked",
    "LogStateError", "DecodeResult", "Recovery", "Uid",
    "encode_record", "decode_buffer", "segment_name", "list_segments", "iter_records",
    "EventLog", "LogTailer", "FSYNC_POLICIES", "FsyncPolicy",
]

# When the writer fsyncs (see idled.log.writer); here, not there, so config can name them without trio.
FsyncPolicy = Literal["always", "interval", "never"]
FSYNC_POLICIES: Final[tuple[str, ...]] = ("always", "interval", "never")

DEFAULT_SEGMENT_BYTES: Final = 64 * 1024 * 1024
DEFAULT_RETENTION_BYTES: Final = 1024 * 1024 * 1024
DEFAULT_RETENTION_SECONDS: Final = 7 * 24 * 3600.0
LOCK_NAME: Final = "lock"

Uid: TypeAlias = str | int


@dataclass(frozen=True, slots=True)
class Recovery:
    """What `EventLog.recover()` found.

    next_seq: seq for the next appended record. truncated_bytes: bytes cut off the end of the last segment.
    corrupt_records: records skipped in all segments (CRC, undecodable, implausible length). online: uid ->
    last record of every uid whose last retained record is "online". records / segments: good records and
    segment files scanned.
    """

    next_seq: int
    truncated_bytes: int
    corrupt_records: int
    online: dict[Uid, dict[str, Any]] = field(default_factory=dict)
    records: int = 0
    segments: int = 0



class EventLog:
    """The writer's handle on a log directory. Not thread-safe: one task (the log writer) drives it, though
    that task may call it from a worker thread. Readers need no EventLog (`iter_records`, `LogTailer`).

    Lifecycle: `EventLog(dir)` -> `recover()` -> `append()`/`sync()`/... -> `close()` (or `with`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        retention_bytes: int = DEFAULT_RETENTION_BYTES,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if segment_bytes < 1 or retention_bytes < 0 or retention_seconds < 0:
            raise ValueError("segment_bytes must be >= 1, retention limits >= 0")
        self.directory = os.fspath(directory)
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self.retention_seconds = retention_seconds
        self.clock = clock
        self.rotations = 0  # segments created by this EventLog
        self._state = "new"  # new -> open -> closed
        self._failed: FsyncFailed | None = None
        self._lock_fd: int | None = None
        self._fd: int | None = None  # active segment, O_APPEND
        self._active_path: str | None = None
        self._size = 0  # bytes in the active segment
        self._rotated: list[int] = []  # fds of segments rotated away from since the last sync
        self._dir_dirty = False
        self._last_seq = 0  # highest seq written (0: none)
        self._durable_seq = 0  # highest seq covered by a successful sync
        self._written_since_sync = False

    # ------------------------------------------------------------------------------------------ state

    @property
    def last_seq(self) -> int:
        """Highest seq written (appended) so far, 0 if none; after recover(), the last recovered seq."""
        return self._last_seq

    @property
    def durable_seq(self) -> int:
        """Highest seq covered by a successful sync() (recovered records count as durable)."""
        return self._durable_seq

    @property
    def active_path(self) -> str | None:
        return self._active_path

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise FsyncFailed(f"log poisoned by an earlier fsync failure: {self._failed.reason}")
        if self._state != "open":
            detail = "call recover() first" if self._state == "new" else "it was closed"
            raise LogStateError(f"log is {self._state}: {detail}")

    # ------------------------------------------------------------------------------------------ recovery

    def recover(self) -> Recovery:
        """Lock the directory (creating it if missing), scan it, truncate a torn tail, open for append."""
        if self._state != "new":
            raise LogStateError(f"recover() called on a log that is {self._state}")
        os.makedirs(self.directory, exist_ok=True)
        lock_fd = os.open(os.path.join(self.directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise LogLocked(f"{self.directory} is locked by another writer") from None
        self._lock_fd = lock_fd
        try:
            return self._recover()
        except BaseException:
            self.close()
            raise

    def _recover(self) -> Recovery:
        segments = list_segments(self.directory)
        online: dict[Uid, dict[str, Any]] = {}
        max_seq = 0
        corrupt = records = truncated = 0
        for _first, path in segments:
            scan = SegmentScan(path)
            for record in scan:
                records += 1
                seq = record["seq"]
                if seq > max_seq:
                    max_seq = seq
                kind = record.get("kind")
                uid = record.get("uid")
                if kind == "online":
                    online[uid] = record
                elif kind == "offline":
                    online.pop(uid, None)
            corrupt += scan.corrupt
        next_seq = max_seq + 1
        if segments:
            last_first, last_path = segments[-1]
            next_seq = max(next_seq, last_first)
            fd = os.open(last_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            self._fd = fd
            self._active_path = last_path
            size = os.fstat(fd).st_size
            keep = scan.good_end  # `scan` is the last segment's
            if size > keep:
                truncated = size - keep
                os.ftruncate(fd, keep)
                try:
                    os.fsync(fd)  # a truncation that is lost would resurrect garbage under new records
                except OSError as exc:
                    self._failed = FsyncFailed(f"fsync after truncating {last_path}: {exc}")
                    raise self._failed from exc
            self._size = keep
        else:
            self._dir_dirty = True  # the directory may have just been created
        self._last_seq = self._durable_seq = next_seq - 1
        self._state = "open"
        return Recovery(
            next_seq=next_seq,
            truncated_bytes=truncated,
            corrupt_records=corrupt,
            online=online,
            records=records,
            segments=len(segments),
        )

    # ------------------------------------------------------------------------------------------ writing

    def append(self, events: Sequence[Mapping[str, Any]]) -> int:
        """Encode and write `events` (seq strictly increasing, above last_seq); return bytes written.

        The batch is validated and encoded before anything is written, so SeqOrderError / RecordTooLarge /
        TypeError leave the log untouched. Rotates by size; runs retention after a rotation. No fsync.
        """
        self._check_writable()
        encoded: list[tuple[int, bytes]] = []
        last = self._last_seq
        for event in events:
            seq = event.get("seq")
            if type(seq) is not int or seq <= last:
                raise SeqOrderError(f"seq {seq!r} after {last}: seqs must be ints, strictly increasing")
            encoded.append((seq, encode_record(event)))
            last = seq
        if not encoded:
            return 0
        rotated = False
        total = 0
        pending: list[bytes] = []
        pending_bytes = 0
        pending_last = 0
        for seq, record in encoded:
            used = self._size + pending_bytes
            if self._fd is None or (used > 0 and used + len(record) > self.segment_bytes):
                if pending:
                    total += self._flush(pending, pending_last)
                    pending, pending_bytes = [], 0
                self._open_segment(seq)
                rotated = True
            pending.append(record)
            pending_bytes += len(record)
            pending_last = seq
        total += self._flush(pending, pending_last)
        if rotated:
            self.apply_retention()
        return total

    def _flush(self, records: list[bytes], last_seq: int) -> int:
        assert self._fd is not None
        data = b"".join(records)
        try:
            write_all(self._fd, data)
        except OSError as exc:
            # Cut a partial write back off: a half record followed by whole ones would make readers skip
            # the whole ones (its length field swallows them).
            try:
                os.ftruncate(self._fd, self._size)
            except OSError as trunc_exc:
                self._failed = FsyncFailed(f"write failed ({exc}) and truncating it back failed ({trunc_exc})")
            raise WriteFailed(f"write to {self._active_path}: {exc}") from exc
        self._size += len(data)
        self._last_seq = last_seq
        self._written_since_sync = True
        return len(data)

    def _open_segment(self, first_seq: int) -> None:
        path = os.path.join(self.directory, segment_name(first_seq))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise WriteFailed(f"create {path}: {exc}") from exc
        if self._fd is not None:
            self._rotated.append(self._fd)  # still holds unsynced records: sync() covers it, then closes it
        self._fd = fd
        self._active_path = path
        self._size = 0
        self._dir_dirty = True
        self.rotations += 1

    def sync(self) -> None:
        """fdatasync every segment written since the last sync, and the directory if a segment was created.

        Raises FsyncFailed (fatal, never retry). Cheap no-op when nothing was written since the last sync.
        """
        self._check_writable()
        try:
            while self._rotated:
                fd = self._rotated[0]
                os.fdatasync(fd)
                self._rotated.pop(0)
                os.close(fd)
            if self._written_since_sync and self._fd is not None:
                os.fdatasync(self._fd)
            if self._dir_dirty:
                fsync_directory(self.directory)
        except OSError as exc:
            self._failed = FsyncFailed(f"fsync in {self.directory}: {exc}")
            raise self._failed from exc
        self._dir_dirty = False
        self._written_since_sync = False
        self._durable_seq = self._last_seq

    def release_rotated(self) -> None:
        """Close rotated-away segments without syncing them (for callers that never sync, fsync=never)."""
        while self._rotated:
            os.close(self._rotated.pop())

    # ------------------------------------------------------------------------------------------ retention

    def apply_retention(self) -> list[str]:
        """Delete the oldest segments while over retention_bytes or older than retention_seconds (mtime).

        Stops at the first segment kept; never deletes the active (newest) segment. Returns deleted paths.
        """
        segments = list_segments(self.directory)
        if len(segments) < 2:
            return []
        stats = []
        total = 0
        for _first, path in segments:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            stats.append((path, st.st_size, st.st_mtime))
            total += st.st_size
        cutoff = self.clock() - self.retention_seconds
        active = self._active_path or segments[-1][1]
        deleted = []
        for path, size, mtime in stats[:-1]:
            if path == active or not (total > self.retention_bytes or mtime < cutoff):
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            total -= size
            deleted.append(path)
        return deleted

    # ------------------------------------------------------------------------------------------ reading

    def oldest_seq(self) -> int | None:
        """First seq of the oldest non-empty retained segment (its name), or None if no record is retained."""
        for first, path in list_segments(self.directory):
            try:
                if os.stat(path).st_size > 0:
                    return first
            except FileNotFoundError:
                continue
        return None

    def read_from(self, seq: int) -> Iterator[dict[str, Any]]:
        """Retained records with seq >= `seq`, including those appended so far. Blocking I/O (see iter_records)."""
        return iter_records(self.directory, seq)

    # ------------------------------------------------------------------------------------------ closing

    def close(self) -> None:
        """Close files and release the lock. Does not sync. Idempotent."""
        self.release_rotated()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        self._state = "closed"

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
