"""The event log's typed errors: each has a machine-readable `code` and a human `reason`."""

from __future__ import annotations

__all__ = ["EventLogError", "FsyncFailed", "WriteFailed", "RecordTooLarge", "SeqOrderError", "LogLocked", "LogStateError"]

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
    """Another EventLog (this process or another) holds the directory's lock; `pid`: the holder's, when the
    lock file names it (`idled.log.dirlock`)."""

    code = "locked"

    def __init__(self, reason: str, pid: int | None = None) -> None:
        super().__init__(reason)
        self.pid = pid


class LogStateError(EventLogError):
    """Call in the wrong state: append/sync before recover(), after close(), recover() twice."""

    code = "state"
