"""Durable presence event log: CRC-framed records in append-only segment files. Pure sync: no trio here.

Theory of operation
-------------------
The log is split by job: `records` (the record format, v2 with a sync mark and a header check, v1 still
read; `decode_buffer`, the one decoder, resynchronises after damage), `segments` (names, streaming one
segment), `recovery` (scan, quarantine, verify), `snapshot` (open sessions), `tailer` (readers). This module
is the writer's handle, `EventLog`, and re-exports every name callers import from ``idled.log.eventlog``.

**Segments.** Records live in files named by the seq of their first record, `f"{first_seq:020d}.seg"`
(zero-padded, so name order is seq order). Only the newest segment, the *active* one, is ever written.
`append` validates and encodes the whole batch first, then writes it with one `os.write` per segment
touched (no user-space buffer: readers see appended records at once). A record that would take a non-empty
active segment past `segment_bytes` starts a new segment. Rotation for a batch of seq 41..50 when 44 crosses::

    00000000000000000001.seg  [1..43]  <- 41..43 written here, fd kept open until the next sync()
    next-segment.spare  -> renamed 00000000000000000044.seg [44..50], becomes active; directory dirty

**A roll never needs a descriptor at the moment of need.** The next segment is created ahead of time as
the empty file ``next-segment.spare``, held open, with a *reserve* descriptor to give up for it under a
descriptor squeeze (`idled.log.spare`); a roll renames it (rename needs no descriptor), and each rotated-away
segment closed by `sync()` / `release_rotated()` frees the slot for the next spare. The directory is held
open too (fsyncing it, and snapshots, need no new slot), and retention, which must list the directory,
waits for a free slot (`retention_deferred`). Should a roll still find no spare (several rolls in one
batch), it is *deferred*: the batch goes on into the active segment (past segment_bytes) and the next
append tries again (`deferred_rolls`, `spare_failures`).

**A full disk never tears the log.** Before a write, the active segment's blocks are reserved ahead
(`idled.log.space`: fallocate with KEEP_SIZE, so the file's size stays its data), so a full disk shows up
as a failed reservation before anything is written, not at fsync. Should a write fail anyway, its partial
bytes are cut back off. Either way `append` raises `DiskFull` (ENOSPC, EDQUOT) with the log at its last whole
record and `last_seq` the last record written: the caller keeps the rest and tries again later.

**Durability.** `append` never fsyncs; `sync()` fdatasyncs every segment written since the last sync (and
a new segment's directory). A failed fsync raises `FsyncFailed` and poisons the log ("fsyncgate").

**Recovery** (`recover()`, once, before the first append; it needs no free space): takes an exclusive
`flock` on `<dir>/lock` (`idled.log.dirlock`, which writes our pid there for a rival's refusal), scans the
log (`recovery.scan_log`), and cuts only the tail of the newest segment -- the bytes after its last good
record -- after copying them to a quarantine file. Damage followed by good records is skipped in place and
reported (see `idled.log.recovery`). If the quarantine copy finds no room, the tail stays where it is until
the first append cuts it (copying it first) or raises `DiskFull`. The next seq is past the largest good seq,
the last segment's name and the snapshot's seq, so seqs are never reused for records that reached the disk.
`online` maps each open session's uid to its last online record, minimal (the server closes each: "restart").

**Retention** (`apply_retention()`, also run after every rotation; which segments: `idled.log.retention`):
deletes whole segments from the oldest end, by size and by age, never the active one. Before deleting a
segment not yet covered by a snapshot, it writes one (`idled.log.snapshot`: the open sessions as of the next
seq, and the last-seen map of `idled.log.lastseen`, pruned to its horizon); if it cannot, nothing uncovered
is deleted (`snapshot_failures`).

**Reading** (`iter_records`, `EventLog.read_from`, `LogTailer`) streams segments in 1 MiB chunks (memory:
the chunk plus one record); damage, and a segment deleted under a reader, are skipped.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal

from idled.log import dirlock, retention
from idled.log.dirlock import LOCK_NAME
from idled.log.errors import (
    DiskFull, EventLogError, FsyncFailed, LogLocked, LogStateError, RecordTooLarge, SeqOrderError, WriteFailed,
    write_error,
)
from idled.log.lastseen import DEFAULT_LAST_SEEN_HORIZON, LastSeen
from idled.log.records import HEADER_BYTES, MAX_RECORD_BYTES, DecodeResult, decode_buffer, encode_record
from idled.log.recovery import (
    RecoveredSessions, Recovery, SegmentReport, damage_totals, quarantine_tail, scan_log, verify_log,
)
from idled.log.segments import (
    READ_CHUNK_BYTES, SEGMENT_SUFFIX, SegmentScan, fsync_directory, list_segments, oldest_seq, segment_name,
    write_all,
)
from idled.log.snapshot import OpenSessions, Uid, write_snapshot
from idled.log.space import RESERVE_AHEAD, Reservation
from idled.log.spare import NO_DESCRIPTOR, SPARE_NAME, SpareSegment
from idled.log.tailer import LogTailer, iter_records

__all__ = [
    "HEADER_BYTES", "MAX_RECORD_BYTES", "DEFAULT_SEGMENT_BYTES", "DEFAULT_RETENTION_BYTES",
    "DEFAULT_RETENTION_SECONDS", "SEGMENT_SUFFIX", "LOCK_NAME", "SPARE_NAME", "READ_CHUNK_BYTES",
    "EventLogError", "FsyncFailed", "WriteFailed", "DiskFull", "RecordTooLarge", "SeqOrderError", "LogLocked",
    "LogStateError", "DecodeResult", "Recovery", "SegmentReport", "Uid", "SegmentScan",
    "encode_record", "decode_buffer", "segment_name", "list_segments", "iter_records", "verify_log",
    "EventLog", "LogTailer", "FSYNC_POLICIES", "FsyncPolicy",
]

# When the writer fsyncs (see idled.log.writer); here, not there, so config can name them without trio.
FsyncPolicy = Literal["always", "interval", "never"]
FSYNC_POLICIES: Final[tuple[str, ...]] = ("always", "interval", "never")

DEFAULT_SEGMENT_BYTES: Final = 64 * 1024 * 1024
DEFAULT_RETENTION_BYTES: Final = 1024 * 1024 * 1024
DEFAULT_RETENTION_SECONDS: Final = 7 * 24 * 3600.0


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
        last_seen_horizon: float = DEFAULT_LAST_SEEN_HORIZON,
        reserve_ahead: int = RESERVE_AHEAD,
    ) -> None:
        if segment_bytes < 1 or retention_bytes < 0 or retention_seconds < 0 or not last_seen_horizon >= 0:
            raise ValueError("segment_bytes must be >= 1, retention limits and last_seen_horizon >= 0")
        self.directory = os.fspath(directory)
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self.retention_seconds = retention_seconds
        self.clock = clock
        self.rotations = 0  # segments created by this EventLog
        self.deferred_rolls = 0  # rolls put off for lack of a descriptor
        self.snapshots = 0  # open-session snapshots written
        self.snapshot_failures = 0  # snapshots that could not be written (retention waited)
        self.retention_deferred = 0  # retention passes put off for lack of a descriptor (listing the directory)
        self._state = "new"  # new -> open -> closed
        self._failed: FsyncFailed | None = None
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None  # held open: fsyncing the directory must not need a new descriptor
        self._fd: int | None = None  # active segment, O_APPEND
        self._active_path: str | None = None
        self._spare = SpareSegment(self.directory)  # the next segment, created ahead (see the module docstring)
        self._space = Reservation(reserve_ahead)  # the active segment's blocks, allocated ahead of its writes
        self._torn_tail = False  # the active segment has a torn tail past _size, not yet quarantined (no room)
        self._size = 0  # bytes in the active segment
        self._rotated: list[int] = []  # fds of segments rotated away from since the last sync
        self._dir_dirty = False
        self._last_seq = 0  # highest seq written (0: none)
        # last_seq as other threads see it: set when append() returns, after the retention it ran, so a
        # reader that saw seq N written also sees the segments retention deleted after writing it.
        self._published_seq = 0
        self._durable_seq = 0  # highest seq covered by a successful sync
        self._written_since_sync = False
        self._sessions = OpenSessions()  # open sessions as of last_seq (see idled.log.snapshot)
        self._last_seen = LastSeen(last_seen_horizon)  # offline users' last_seen as of last_seq (idled.log.lastseen)
        self._snapshot_seq = 0  # the newest snapshot covers every record below this seq

    # ------------------------------------------------------------------------------------------ state

    @property
    def last_seq(self) -> int:
        """Highest seq written (appended) so far, 0 if none; after recover(), the last recovered seq."""
        return self._published_seq

    @property
    def durable_seq(self) -> int:
        """Highest seq covered by a successful sync() (recovered records count as durable)."""
        return self._durable_seq

    @property
    def spare_failures(self) -> int:
        """Failed attempts to create the spare segment."""
        return self._spare.failures

    @property
    def active_path(self) -> str | None:
        return self._active_path

    @property
    def open_sessions(self) -> int:
        """Sessions whose last written record is online (what the next snapshot would hold)."""
        return len(self._sessions)

    def last_seen(self, uid: Uid, now: float | None = None) -> float | None:
        """When ``uid``, offline as of last_seq, was last active (wall); None if unknown, online as of last_seq,
        beyond the horizon or the store is disabled. Safe from another thread than the writer's (one dict
        read). ``now``: wall time (default: the log's clock)."""
        return self._last_seen.get(uid, self.clock() if now is None else now)

    def online_since(self, uid: Uid) -> float | None:
        """When ``uid``, online as of last_seq, came online (wall): its open online record's ``last_seen``, which
        is the login's time. None if it is not online as of last_seq. Safe from another thread (one dict read)."""
        value = self._sessions.sessions.get(uid)
        return None if value is None or math.isnan(value.real) else value.real  # NaN: a record without last_seen

    @property
    def last_seen_users(self) -> int:
        """Users in the last-seen map (what the next snapshot would hold, before pruning)."""
        return len(self._last_seen)

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise FsyncFailed(f"log poisoned by an earlier fsync failure: {self._failed.reason}")
        if self._state != "open":
            detail = "call recover() first" if self._state == "new" else "it was closed"
            raise LogStateError(f"log is {self._state}: {detail}")

    # ------------------------------------------------------------------------------------------ recovery

    def recover(self) -> Recovery:
        """Lock the directory (creating it if missing), scan it, quarantine a torn tail, open for append."""
        if self._state != "new":
            raise LogStateError(f"recover() called on a log that is {self._state}")
        os.makedirs(self.directory, exist_ok=True)
        self._lock_fd = dirlock.acquire(self.directory)  # LogLocked names the holder's pid
        try:
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._spare.reserve_fd = os.dup(self._dir_fd)
            return self._recover()
        except BaseException:
            self.close()
            raise

    def _recover(self) -> Recovery:
        scan = scan_log(self.directory)
        reports = scan.reports
        corrupt, skipped = damage_totals(reports)
        next_seq = max(scan.max_seq + 1, scan.snapshot.seq)
        truncated = tail = 0
        quarantined: tuple[str, ...] = ()
        if scan.segments:
            last_first, last_path = scan.segments[-1]
            next_seq = max(next_seq, last_first)
            fd = self._fd = os.open(last_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            self._active_path = last_path
            keep = self._size = reports[-1].tail_offset
            self._space.reset(keep)
            tail = os.fstat(fd).st_size - keep
            if tail > 0:
                corrupt += reports[-1].tail_records
                self._torn_tail = True
                try:
                    quarantined, truncated = self._cut_tail()
                except DiskFull:
                    pass  # cut by the first append that finds room (see the module docstring)
        else:
            self._dir_dirty = True  # the directory may have just been created
        self._last_seq = self._durable_seq = self._published_seq = next_seq - 1
        self._sessions = OpenSessions(scan.sessions)
        self._last_seen = LastSeen(self._last_seen.horizon, scan.last_seen)
        self._last_seen.prune(self.clock())
        self._snapshot_seq = scan.snapshot.seq
        self._state = "open"
        self._spare.discard()  # an unused spare left by the previous run: always empty
        self._dir_dirty = self._spare.make() or self._dir_dirty
        return Recovery(
            next_seq=next_seq, truncated_bytes=truncated, corrupt_records=corrupt,
            online=RecoveredSessions(dict(scan.sessions), scan.replayed, scan.snapshot.seq),
            records=scan.records, segments=len(scan.segments), skipped_bytes=skipped, quarantined=quarantined,
            damaged_segments=tuple(report for report in reports if report.damaged), snapshot_seq=scan.snapshot.seq,
            damaged_snapshots=tuple(scan.snapshot.damaged), last_seen=len(self._last_seen), last_ts=scan.max_ts,
            tail_deferred=tail if self._torn_tail else 0,
        )

    # ------------------------------------------------------------------------------------------ writing

    def append(self, events: Sequence[Mapping[str, Any]], encoded: Sequence[bytes] | None = None) -> int:
        """Encode and write `events` (seq strictly increasing, above last_seq; ``encoded``: their framed records,
        written as they are: a standby's, `idled.log.shipping`); return bytes written.

        The batch is validated and encoded before anything is written, so SeqOrderError / RecordTooLarge /
        TypeError leave the log untouched. Rotates by size; runs retention after a rotation. No fsync. DiskFull:
        no room for the rest of the batch; ``last_seq`` is the last record written (the module docstring).
        """
        self._check_writable()
        try:
            return self._append(events, encoded)
        finally:
            self._published_seq = self._last_seq

    def _append(self, events: Sequence[Mapping[str, Any]], given: Sequence[bytes] | None) -> int:
        encoded: list[tuple[int, bytes]] = []
        last = self._last_seq
        for index, event in enumerate(events):
            seq = event.get("seq")
            if type(seq) is not int or seq <= last:
                raise SeqOrderError(f"seq {seq!r} after {last}: seqs must be ints, strictly increasing")
            encoded.append((seq, encode_record(event) if given is None else given[index]))
            last = seq
        if not encoded:
            return 0
        if self._torn_tail:
            self._cut_tail()
        rotated = False
        total = 0
        pending: list[bytes] = []
        pending_bytes = 0
        start = 0  # index in events of pending[0]
        try:
            for index, (seq, record) in enumerate(encoded):
                used = self._size + pending_bytes
                if self._fd is None or (used > 0 and used + len(record) > self.segment_bytes):
                    if pending:
                        total += self._flush(pending, events[start:index])
                        pending, pending_bytes, start = [], 0, index
                    rotated = self._roll(seq) or rotated
                pending.append(record)
                pending_bytes += len(record)
            total += self._flush(pending, events[start:])
        except DiskFull as exc:
            exc.written = total
            raise
        if rotated:
            self.apply_retention()
        return total

    def _flush(self, records: list[bytes], events: Sequence[Mapping[str, Any]]) -> int:
        assert self._fd is not None
        data = b"".join(records)
        try:
            self._space.ensure(self._fd, self._size + len(data), self.segment_bytes)
        except OSError as exc:
            raise write_error(f"reserve space in {self._active_path}", exc) from exc
        try:
            write_all(self._fd, data)
        except OSError as exc:
            # Cut a partial write back off: a half record followed by whole ones would be damage.
            try:
                os.ftruncate(self._fd, self._size)
                self._space.reset(self._size)  # (the truncation freed the blocks reserved past it too)
            except OSError as trunc_exc:
                self._failed = FsyncFailed(f"write failed ({exc}) and truncating it back failed ({trunc_exc})")
            raise write_error(f"write to {self._active_path}", exc) from exc
        self._size += len(data)
        self._last_seq = events[-1]["seq"]
        self._written_since_sync = True
        note, seen = self._sessions.note, self._last_seen.note
        for event in events:
            note(event)
            seen(event)
        return len(data)

    def _roll(self, first_seq: int) -> bool:
        """Make a new active segment for `first_seq`; False if deferred for lack of a descriptor."""
        path = os.path.join(self.directory, segment_name(first_seq))
        try:
            fd = self._spare.take(path)
        except OSError as exc:
            raise write_error(f"rename {self._spare.path} to {path}", exc) from exc
        if fd is None:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                if exc.errno in NO_DESCRIPTOR and self._fd is not None:
                    self.deferred_rolls += 1
                    return False
                raise write_error(f"create {path}", exc) from exc
        if self._fd is not None:
            self._rotated.append(self._fd)  # still holds unsynced records: sync() covers it, then closes it
        self._fd = fd
        self._active_path = path
        self._size = 0
        self._space.reset(0)
        self._dir_dirty = True
        self.rotations += 1
        self._spare.make()
        return True

    def _close_rotated(self, fd: int) -> None:
        """Close a rotated-away segment; its slot goes at once to the spare, else to the reserve, if missing
        (before anything else can take it: each roll uses one slot and frees one, so this keeps up)."""
        os.close(fd)
        self._dir_dirty = self._spare.slot_freed(self._dir_fd) or self._dir_dirty

    def _cut_tail(self) -> tuple[tuple[str, ...], int]:
        """Quarantine the active segment's torn tail (past ``_size``) and cut it off: (the quarantine file, bytes).
        DiskFull if the copy finds no room (the tail stays, for later)."""
        assert self._fd is not None and self._active_path is not None
        try:
            target, cut = quarantine_tail(self._active_path, self._size, self._fd)
        except FsyncFailed as exc:
            self._failed = exc
            raise
        except OSError as exc:
            raise write_error(f"quarantine the torn tail of {self._active_path}", exc) from exc
        self._torn_tail = False
        self._space.reset(self._size)
        return (target,), cut

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
                self._close_rotated(fd)
            if self._written_since_sync and self._fd is not None:
                os.fdatasync(self._fd)
            if self._dir_dirty:
                if self._dir_fd is not None:
                    os.fsync(self._dir_fd)
                else:
                    fsync_directory(self.directory)
        except OSError as exc:
            self._failed = FsyncFailed(f"fsync in {self.directory}: {exc}")
            raise self._failed from exc
        self._dir_dirty = False
        self._written_since_sync = False
        self._durable_seq = self._last_seq

    def fits(self, records: int) -> bool:
        """Whether an append of ``records`` records of any size would only write (no roll, no retention, no
        space to reserve, no torn tail to cut). ``reserve_ahead()`` makes it likelier."""
        end = self._size + records * (MAX_RECORD_BYTES + HEADER_BYTES)
        return self._fd is not None and end <= self.segment_bytes and self._space.covers(end) and not self._torn_tail

    def reserve_ahead(self) -> None:
        """Reserve the active segment's next blocks ahead of need (best effort; blocking: the writer's thread)."""
        if self._fd is not None:
            self._space.top_up(self._fd, self._size, self.segment_bytes)

    def release_rotated(self) -> None:
        """Close rotated-away segments without syncing them (for callers that never sync, fsync=never)."""
        while self._rotated:
            self._close_rotated(self._rotated.pop())

    # ------------------------------------------------------------------------------------------ retention

    def apply_retention(self) -> list[str]:
        """Delete the oldest segments while over retention_bytes or older than retention_seconds (mtime).

        Stops at the first segment kept; never deletes the active (newest) segment; snapshots the open
        sessions first when a segment to delete is not yet covered. Returns deleted paths.
        """
        try:
            segments = list_segments(self.directory)  # opendir needs a descriptor
        except OSError as exc:
            if exc.errno not in NO_DESCRIPTOR:
                raise
            self.retention_deferred += 1  # the next pass (next roll, or the writer's timer) catches up
            return []
        victims, covered_below = retention.victims(
            segments, self._active_path, self.retention_bytes, self.clock() - self.retention_seconds
        )
        if victims and covered_below > self._snapshot_seq and not self._snapshot():
            return []  # no snapshot, no deletion: the sessions those segments name would be forgotten
        return retention.delete(victims)

    def _snapshot(self) -> bool:
        """Durably snapshot the open sessions as of last_seq + 1. False (counted) if it could not be (not
        recovered: the open sessions are unknown; or no room: write_snapshot leaves nothing behind)."""
        if self._state != "open":
            self.snapshot_failures += 1  # not recovered: the open sessions are unknown
            return False
        seq, last_seen = self._last_seq + 1, self._last_seen
        if last_seen.enabled:
            last_seen.prune(self.clock())
        try:
            write_snapshot(self.directory, seq, self._sessions.sessions, self._dir_fd,
                           last_seen.seen if last_seen.enabled else None)
        except OSError:
            self.snapshot_failures += 1
            return False
        self._snapshot_seq, self.snapshots = seq, self.snapshots + 1
        return True

    # ------------------------------------------------------------------------------------------ reading

    def oldest_seq(self) -> int | None:
        """First seq of the oldest non-empty retained segment (its name), or None if no record is retained."""
        return oldest_seq(self.directory)

    def read_from(self, seq: int) -> Iterator[dict[str, Any]]:
        """Retained records with seq >= `seq`, including those appended so far. Blocking I/O (see iter_records)."""
        return iter_records(self.directory, seq)

    # ------------------------------------------------------------------------------------------ closing

    def close(self) -> None:
        """Close files and release the lock. Does not sync. Idempotent. The spare stays for the next run; the
        space reserved past the active segment's end is given back."""
        while self._rotated:
            os.close(self._rotated.pop())
        if self._fd is not None:
            self._space.trim(self._fd)
        self._spare.close()
        for fd in (self._fd, self._dir_fd, self._lock_fd):  # lock last: flock
            if fd is not None:
                os.close(fd)
        self._fd = self._dir_fd = self._lock_fd = None
        self._state = "closed"

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
