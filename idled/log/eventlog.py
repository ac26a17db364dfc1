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
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

import msgpack

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

HEADER: Final = struct.Struct(">II")  # body length, CRC32 of the body
HEADER_BYTES: Final = HEADER.size
MAX_RECORD_BYTES: Final = 64 * 1024  # body bytes; a presence event is ~150
DEFAULT_SEGMENT_BYTES: Final = 64 * 1024 * 1024
DEFAULT_RETENTION_BYTES: Final = 1024 * 1024 * 1024
DEFAULT_RETENTION_SECONDS: Final = 7 * 24 * 3600.0
SEGMENT_SUFFIX: Final = ".seg"
LOCK_NAME: Final = "lock"
READ_CHUNK_BYTES: Final = 1024 * 1024  # > MAX_RECORD_BYTES + header, so any record fits in one chunk

_SEGMENT_RE: Final = re.compile(r"^(\d{20})\.seg$")

Uid: TypeAlias = str | int

# ---------------------------------------------------------------------------------------------- errors


class EventLogError(Exception):
    """Base of every error this module raises on purpose; `code` is machine-readable, `reason` for humans."""

    code: str = "eventlog"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class FsyncFailed(EventLogError):
    """fsync/fdatasync failed. Fatal: the log is poisoned, never retry (the kernel may have dropped the data)."""

    code = "fsync_failed"


class WriteFailed(EventLogError):
    """os.write failed (ENOSPC, EIO, ...). The partial write was cut back off when possible; see `last_seq`."""

    code = "write_failed"


class RecordTooLarge(EventLogError):
    """An encoded body exceeds MAX_RECORD_BYTES; nothing of the batch was written."""

    code = "record_too_large"


class SeqOrderError(EventLogError):
    """An appended event has no int seq, or its seq is not above the previous one; nothing was written."""

    code = "seq_order"


class LogLocked(EventLogError):
    """Another EventLog (this process or another) holds the directory's lock."""

    code = "locked"


class LogStateError(EventLogError):
    """Call in the wrong state: append/sync before recover(), after close(), recover() twice."""

    code = "state"


# ---------------------------------------------------------------------------------------------- codec


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


# ---------------------------------------------------------------------------------------------- segments


def segment_name(first_seq: int) -> str:
    """File name of the segment whose first record has seq `first_seq`."""
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """(first_seq, path) of every segment file in `directory`, oldest first. Other files are ignored."""
    directory = os.fspath(directory)
    found = []
    for name in os.listdir(directory):
        match = _SEGMENT_RE.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    found.sort()
    return found


class _SegmentScan:
    """Streams one segment's good records in bounded chunks, counting what recovery needs to know."""

    __slots__ = ("path", "corrupt", "good_end")

    def __init__(self, path: str) -> None:
        self.path = path
        self.corrupt = 0
        self.good_end = 0  # file offset just past the last good record

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with open(self.path, "rb", buffering=0) as file:
            base = 0  # file offset of buf[0]
            buf = b""
            while True:
                chunk = file.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                buf = buf + chunk if buf else chunk
                result = decode_buffer(buf)
                self.corrupt += result.corrupt
                if result.records:
                    self.good_end = base + result.good_bytes
                yield from result.records
                consumed = len(buf) - result.torn_bytes
                base += consumed
                if result.broken:
                    break
                buf = buf[consumed:]


def _segments_from(directory: str, from_seq: int) -> list[tuple[int, str]]:
    """The segments that can hold seqs >= from_seq: the last one named <= from_seq, and all after it."""
    segments = list_segments(directory)
    start = 0
    for index, (first, _path) in enumerate(segments):
        if first <= from_seq:
            start = index
        else:
            break
    return segments[start:]


def iter_records(directory: str | os.PathLike[str], from_seq: int = 0) -> Iterator[dict[str, Any]]:
    """Every retained good record with seq >= from_seq, in log (= seq) order, corrupt ones skipped.

    The segment list is taken once; each segment is read to its end at the time it is reached, so records
    appended meanwhile to the active segment are included. Blocking file I/O: from trio, run it in a thread.
    """
    for _first, path in _segments_from(os.fspath(directory), from_seq):
        try:
            for record in _SegmentScan(path):
                if record["seq"] >= from_seq:
                    yield record
        except FileNotFoundError:
            continue  # deleted by retention after listing


# ---------------------------------------------------------------------------------------------- writer


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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
            scan = _SegmentScan(path)
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
            _write_all(self._fd, data)
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
                _fsync_directory(self.directory)
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


# ---------------------------------------------------------------------------------------- seq reservation

# ---------------------------------------------------------------------------------------------- tailing


class LogTailer:
    """Follows a log directory from outside the writer (e.g. `idled events --follow`).

    Keeps a position (segment, byte offset of the next unread record); each `poll()` reads what was added
    since, moving to the next segment once a newer one exists and the current one is read to its end.
    Yields only seqs >= from_seq and above the last one returned, so its output is strictly increasing.
    The segment list is taken *before* reading the current segment: if a newer segment was already listed,
    the writer had finished the current one before that read, so nothing is left behind when moving on.
    """

    def __init__(self, directory: str | os.PathLike[str], from_seq: int = 0) -> None:
        self.directory = os.fspath(directory)
        self.from_seq = from_seq
        self.last_seq = from_seq - 1  # highest seq returned
        self._segment: int | None = None  # first seq (name) of the segment being read
        self._offset = 0

    def poll(self, max_records: int = 10_000) -> list[dict[str, Any]]:
        """New records since the last poll: about max_records at most (whole 1 MiB chunks), [] when caught up."""
        out: list[dict[str, Any]] = []
        while len(out) < max_records:
            segments = list_segments(self.directory)
            if not segments:
                break
            names = [first for first, _ in segments]
            if self._segment is None:
                # Start in the last segment named <= from_seq (it may hold from_seq), else the oldest.
                self._segment = max((n for n in names if n <= self.from_seq), default=names[0])
                self._offset = 0
            current = self._segment
            if current in names and self._read_chunk(os.path.join(self.directory, segment_name(current)), out):
                continue
            later = [n for n in names if n > current]
            if not later:
                break
            self._segment, self._offset = later[0], 0
        return out

    def _read_chunk(self, path: str, out: list[dict[str, Any]]) -> bool:
        """Read one chunk at the current offset; append new records to `out`; True if the offset moved."""
        try:
            with open(path, "rb", buffering=0) as file:
                if os.fstat(file.fileno()).st_size < self._offset:
                    self._offset = 0  # truncated by recovery under us: re-read, the seq filter drops repeats
                file.seek(self._offset)
                data = file.read(READ_CHUNK_BYTES)
        except FileNotFoundError:
            return False
        result = decode_buffer(data)
        consumed = len(data) - result.torn_bytes
        for record in result.records:
            seq = record["seq"]
            if seq > self.last_seq:
                out.append(record)
                self.last_seq = seq
        self._offset += consumed
        # A broken segment (implausible length) stops here for good: once a newer segment exists, poll()
        # moves on to it.
        return consumed > 0
