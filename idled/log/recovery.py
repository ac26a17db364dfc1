"""Recovery and verification: what a log directory holds, what is damaged, and the one cut ever made.

Theory of operation
-------------------
`scan_log` reads every segment in order (`SegmentScan`, bounded memory) and the newest snapshot that
verifies. It returns the largest seq, the largest ``ts`` (where the next run's wall clock starts at the
earliest, whatever the system's says: `idled.core.wallclock`), every segment's damage, and the open sessions: the snapshot's (state
after every seq < N), then every record with seq >= N replayed on top -- a uid whose last record is online
is open, and a uid whose last record is offline gets that record's ``last_seen`` in the last-seen map (the
snapshot's map, then the replayed records: `idled.log.lastseen`). Each open session is kept compact -- its summary (last seen, timeout) and, when replayed, the seq
of its online record; `RecoveredSessions` builds a minimal record when asked -- so recovery of a million
sessions does not hold a million dicts (full records held ~875 bytes a session: 175 MB at 200,000, more
than the run that logged them had used in all).

Damage is never silent and never destroys a good record:

* a damaged region followed by a good record (`SegmentReport.damage`) is skipped in place, reported,
  never cut: readers resynchronise past it (see `idled.log.records`);
* the *tail* of a segment -- the bytes after its last good record -- holds no good record. In the newest
  segment it is what a crash tore (or damage with nothing good after it): `quarantine_tail` copies it to
  ``<segment>.quarantine-<offset>`` (fsynced, with the directory) and only then truncates the segment, so
  new records are not appended after garbage. A tail in an older segment is reported and kept.

`verify_log` (``idled events --verify``) runs the same scan and changes nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from idled.log.errors import FsyncFailed
from idled.log.records import Damage
from idled.log.segments import SegmentScan, fsync_directory, list_segments, write_all
from idled.log.snapshot import Snapshot, Uid, load_snapshot, session_summary, summary_record

__all__ = [
    "QUARANTINE_INFIX", "SegmentReport", "LogScan", "RecoveredSessions", "Recovery", "scan_log", "verify_log",
    "quarantine_tail", "damage_totals",
]

QUARANTINE_INFIX = ".quarantine-"
_COPY_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """One segment's damage. damage: regions skipped in place, (offset, bytes, records). tail_*: the bytes
    after the last good record; tail_records counts the damaged records in it (0: one torn record)."""

    path: str
    size: int
    records: int
    damage: tuple[Damage, ...] = ()
    tail_offset: int = 0
    tail_bytes: int = 0
    tail_records: int = 0

    @property
    def damaged(self) -> bool:
        return bool(self.damage or self.tail_bytes)

    @property
    def skipped_bytes(self) -> int:
        return sum(region[1] for region in self.damage)

    @property
    def skipped_records(self) -> int:
        return sum(region[2] for region in self.damage)


class RecoveredSessions(Mapping[Uid, dict[str, Any]]):
    """uid -> last online record of every open session, minimal: kind, uid, last_seen and timeout (what a
    restart record needs), and ``seq`` when it was replayed from a segment or ``snapshot`` (the snapshot's
    seq) when it came from the snapshot."""

    __slots__ = ("_sessions", "_replayed", "_snapshot_seq")

    def __init__(self, sessions: dict[Uid, complex], replayed: dict[Uid, int], snapshot_seq: int) -> None:
        self._sessions = sessions
        self._replayed = replayed
        self._snapshot_seq = snapshot_seq

    def __getitem__(self, uid: Uid) -> dict[str, Any]:
        record = summary_record(uid, self._sessions[uid], self._snapshot_seq)
        seq = self._replayed.get(uid)
        if seq is not None:
            del record["snapshot"]
            record["seq"] = seq
        return record

    def __iter__(self) -> Iterator[Uid]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __repr__(self) -> str:
        return f"RecoveredSessions({dict(self.items())!r})"


@dataclass(slots=True)
class LogScan:
    """What `scan_log` found (nothing changed yet)."""

    max_seq: int = 0
    max_ts: float = 0.0  # the largest finite ``ts`` of any good record (0: none)
    records: int = 0
    segments: list[tuple[int, str]] = field(default_factory=list)
    reports: list[SegmentReport] = field(default_factory=list)
    sessions: dict[Uid, complex] = field(default_factory=dict)
    replayed: dict[Uid, int] = field(default_factory=dict)  # uid -> seq of its online record, if replayed
    last_seen: dict[Uid, float] = field(default_factory=dict)  # uid -> last_seen of its last record, an offline
    snapshot: Snapshot = field(default_factory=Snapshot)


def scan_log(directory: str) -> LogScan:
    """Scan every segment and the newest good snapshot (blocking I/O; see the module docstring)."""
    scan = LogScan(snapshot=load_snapshot(directory))
    scan.sessions = scan.snapshot.sessions
    scan.last_seen = scan.snapshot.last_seen
    from_seq = scan.snapshot.seq
    sessions, replayed, seen = scan.sessions, scan.replayed, scan.last_seen
    max_seq = records = 0
    max_ts = 0.0
    scan.segments = list_segments(directory)
    for _first, path in scan.segments:
        segment = SegmentScan(path)
        count = 0
        for record in segment:
            count += 1
            seq = record["seq"]
            if seq > max_seq:
                max_seq = seq
            ts = record.get("ts")
            if (type(ts) is float or type(ts) is int) and max_ts < ts < math.inf:  # (NaN compares false)
                max_ts = float(ts)
            if seq < from_seq:
                continue  # already in the snapshot
            kind, uid = record.get("kind"), record.get("uid")
            if uid is None:
                continue  # not a session's event (the writer never omits a uid; only the seq was checked)
            if kind == "online":
                sessions[uid] = session_summary(record)  # not the record: see the module docstring
                replayed[uid] = seq
                seen.pop(uid, None)
            elif kind == "offline":
                replayed.pop(uid, None)
                sessions.pop(uid, None)
                last_seen = record.get("last_seen")
                if type(last_seen) is float or type(last_seen) is int:
                    seen[uid] = last_seen
                else:
                    seen.pop(uid, None)
        records += count
        scan.reports.append(
            SegmentReport(
                path, segment.size, count, tuple(segment.damage_before_tail()), segment.good_end,
                segment.tail_bytes, segment.tail_records(),
            )
        )
    scan.max_seq, scan.max_ts, scan.records = max_seq, max_ts, records
    return scan


def verify_log(directory: str) -> tuple[list[SegmentReport], list[str]]:
    """(every segment's report, damaged snapshot paths). Reads only; safe on a live log."""
    scan = scan_log(directory)
    return scan.reports, scan.snapshot.damaged


def damage_totals(reports: list[SegmentReport]) -> tuple[int, int]:
    """(records lost, bytes skipped) to the damage of these segments, not counting the newest one's tail (the
    caller's to cut); an older segment's tail is damage kept where it is."""
    corrupt = sum(report.skipped_records for report in reports)
    skipped = sum(report.skipped_bytes for report in reports)
    for report in reports[:-1]:
        corrupt += max(1, report.tail_records) if report.tail_bytes else 0
        skipped += report.tail_bytes
    return corrupt, skipped


def quarantine_tail(path: str, offset: int, fd: int) -> tuple[str, int]:
    """Copy `path`'s bytes from `offset` to ``<path>.quarantine-<offset>``, make the copy durable, then
    truncate `fd` (open on `path` for writing) to `offset` and fsync it. Returns (quarantine path, bytes).

    Raises FsyncFailed if a sync fails (after the copy is durable, a lost truncation would only leave the
    garbage for the next recovery to quarantine again; before, nothing was cut); OSError if the copy cannot
    be written (a full disk: the partial copy is removed, nothing is cut, and the caller may try again)."""
    target = f"{path}{QUARANTINE_INFIX}{offset}"
    copied = 0
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            with open(path, "rb", buffering=0) as source:
                source.seek(offset)
                while chunk := source.read(_COPY_CHUNK):
                    write_all(out, chunk)
                    copied += len(chunk)
        except OSError:
            os.unlink(target)  # (frees what the partial copy took)
            raise
        try:
            os.fsync(out)
            fsync_directory(os.path.dirname(path) or ".")
        except OSError as exc:
            raise FsyncFailed(f"fsync of {target}: {exc}") from exc
    finally:
        os.close(out)
    os.ftruncate(fd, offset)
    try:
        os.fsync(fd)  # a truncation that is lost would resurrect garbage under new records
    except OSError as exc:
        raise FsyncFailed(f"fsync after truncating {path}: {exc}") from exc
    return target, copied


@dataclass(frozen=True, slots=True)
class Recovery:
    """What `EventLog.recover()` found and did.

    next_seq: seq for the next appended record. truncated_bytes: bytes cut off the end of the last segment,
    all of them first copied to `quarantined`. corrupt_records: records lost to damage anywhere (estimated;
    a lone torn record is not counted: it never was a record). skipped_bytes: damaged bytes skipped in
    place (kept on disk). damaged_segments: the report of every segment with damage. online: uid -> last
    online record of every open session (see RecoveredSessions). records / segments: good records and segment
    files scanned. snapshot_seq / damaged_snapshots: the snapshot recovery started from (0: none).
    last_seen: how many users the last-seen map holds after recovery (within the horizon). last_ts: the
    largest ``ts`` of any good record (0: none): the next run stamps nothing below it. tail_deferred: bytes
    of a torn tail left in place for lack of space to quarantine them (the first append that finds room does).
    """

    next_seq: int
    truncated_bytes: int
    corrupt_records: int
    online: Mapping[Uid, dict[str, Any]] = field(default_factory=dict)
    records: int = 0
    segments: int = 0
    skipped_bytes: int = 0
    quarantined: tuple[str, ...] = ()
    damaged_segments: tuple[SegmentReport, ...] = ()
    snapshot_seq: int = 0
    damaged_snapshots: tuple[str, ...] = ()
    last_seen: int = 0
    last_ts: float = 0.0
    tail_deferred: int = 0

    @property
    def damaged(self) -> bool:
        return bool(self.truncated_bytes or self.corrupt_records or self.skipped_bytes or self.damaged_snapshots
                    or self.tail_deferred)

    def summary(self) -> str:
        """One line for the server's log: what was skipped in place, quarantined, found damaged."""
        parts = []
        if self.skipped_bytes or self.corrupt_records:
            parts.append(
                f"skipped {self.skipped_bytes} damaged bytes in place (about {self.corrupt_records} records lost)"
            )
        if self.truncated_bytes:
            parts.append(f"truncated a torn tail of {self.truncated_bytes} bytes (copied first to {', '.join(self.quarantined)})")
        if self.tail_deferred:
            parts.append(f"a torn tail of {self.tail_deferred} bytes is left in place until there is room to "
                         "quarantine it (no space)")
        if self.damaged_snapshots:
            parts.append(f"damaged snapshots kept aside: {', '.join(self.damaged_snapshots)}")
        return "; ".join(parts) or "no damage"

