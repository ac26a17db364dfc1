"""The event log's typed errors: each has a machine-readable `code` and a human `reason`."""

from __future__ import annotations

import errno
from typing import Final

__all__ = ["DISK_FULL_ERRNOS", "EventLogError", "FsyncFailed", "WriteFailed", "DiskFull", "RecordTooLarge",
           "SeqOrderError", "LogLocked", "LogStateError", "is_disk_full", "write_error"]

# The errors of a full disk (or of a quota, the same for us): the write may succeed later, once space is freed.
DISK_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: OSError) -> bool:
    """Whether ``exc`` is a full disk or quota."""
    return exc.errno in DISK_FULL_ERRNOS

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


class DiskFull(WriteFailed):
    """A write, a segment's creation or its space reservation failed for lack of space (ENOSPC, EDQUOT). The log
    is as it was before the call but for the records ``last_seq`` says were written: nothing torn, no gap. Not
    fatal: the same append may be tried again later (``idled.log.writer`` does, every second). ``written``:
    bytes of the batch that were written before it (its records up to ``last_seq``)."""

    code = "disk_full"
    written = 0


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


def write_error(what: str, exc: OSError) -> WriteFailed:
    """The typed error for a failed write, roll or space reservation of ``what``: DiskFull for lack of space."""
    return (DiskFull if is_disk_full(exc) else WriteFailed)(f"{what}: {exc.strerror or exc}")
