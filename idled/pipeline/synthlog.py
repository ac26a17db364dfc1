"""The generator's side of a synthetic daemon's log: seqs, batched appends, crashes and restarts.

`SyntheticLog` writes through the daemon's real `EventLog`, the way the server does: seqs continue from what
`EventLog.recover()` found, events are appended in batches, and a graceful stop syncs before closing. A
*crash* is played by closing the log with half of a record appended to the active segment (the writer died
mid-write); the next `open()` recovers -- truncating the torn record and reporting who was left online --
exactly as a restarted daemon would. It also remembers the first event written at or after `watch_after`:
the record `damage.corrupt_record` flips a byte of when damage is asked for.
"""

from __future__ import annotations

from typing import Any

from idled.log.eventlog import EventLog, Recovery, encode_record

__all__ = ["SyntheticLog"]


class SyntheticLog:
    def __init__(self, directory: str, *, segment_bytes: int, batch: int, detector: str, watch_after: float) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.batch = batch  # events per EventLog.append
        self.detector = detector
        self.watch_after = watch_after
        self.log: EventLog | None = None
        self.seq = 0  # the last seq written (or recovered)
        self.pending: list[dict[str, Any]] = []
        self.events = 0  # appended by this run
        self.truncated = 0  # torn bytes recover() cut off
        self.first_after: dict[str, Any] | None = None  # the first event at or after watch_after

    def open(self) -> Recovery:
        """Open (or reopen after a stop or crash) and recover; creates the directory."""
        # Retention off: a synthetic log keeps everything it wrote.
        log = EventLog(self.directory, segment_bytes=self.segment_bytes, retention_bytes=1 << 62, retention_seconds=1e12)
        recovery = log.recover()
        self.truncated += recovery.truncated_bytes
        self.seq = recovery.next_seq - 1
        self.log = log
        return recovery

    def emit(self, kind: str, uid: int | str, ts: float, reason: str, last_seen: float, timeout: float,
             device: str | None = None, grace: float | None = None) -> None:
        """One event; `device` and `grace` become the record's fields only when given (else today's record)."""
        self.seq += 1
        event: dict[str, Any] = {
            "seq": self.seq, "kind": kind, "uid": uid, "ts": ts, "reason": reason,
            "last_seen": last_seen, "deadline": last_seen + timeout, "timeout": timeout, "detector": self.detector,
        }
        if device is not None:
            event["device"] = device
        if grace is not None:
            event["grace"] = grace
        self.pending.append(event)
        if self.first_after is None and ts >= self.watch_after:
            self.first_after = event
        if len(self.pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            assert self.log is not None
            self.log.append(self.pending)
            self.events += len(self.pending)
            self.pending = []

    def stop(self) -> None:
        """A graceful stop: everything written and synced, then closed."""
        self.flush()
        assert self.log is not None
        self.log.sync()
        self.log.close()

    def crash(self, at: float) -> None:
        """Die in the middle of writing a record: half of it reaches the file. `open()` is the restart."""
        self.flush()
        assert self.log is not None
        torn = encode_record({"seq": self.seq + 1, "kind": "online", "uid": 0, "ts": at, "reason": "login",
                              "last_seen": at, "deadline": at + 45.0, "timeout": 45.0, "detector": self.detector})
        path = self.log.active_path
        self.log.close()
        if path is not None:
            with open(path, "ab") as file:
                file.write(torn[: len(torn) // 2])
