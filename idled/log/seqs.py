"""Seq reservation: a durable upper bound on every seq ever handed out."""

from __future__ import annotations

import os
import threading
from typing import Final

from idled.log.errors import EventLogError, FsyncFailed
from idled.log.segments import fsync_directory, write_all

__all__ = ["RESERVATION_NAME", "SEQ_BLOCK", "SEQ_HEADROOM", "SeqReservation"]

SEQ_BLOCK: Final = 1_000_000  # seqs reserved durably at a time
SEQ_HEADROOM: Final = 200_000  # producers wait rather than issue a seq this close to the reserved mark
RESERVATION_NAME: Final = "seq-reserved"


class SeqReservation:
    """A durable upper bound on every seq ever handed out, so a crash never makes a seq mean two things.

    Events reach observers before the writer has put them on disk, so records can die with the process
    (queued for the writer) or the machine (written, not synced) after a subscriber saw their seqs.
    Recovery must then not hand those seqs out again. Like an ID-block allocator, the server reserves seqs in
    large blocks: ``record(upto)`` durably records "seqs up to ``upto`` may have been used" (write a temp
    file, fsync, rename, fsync the directory) *before* any seq past the old mark is issued; after a crash the
    next seq is ``max(last good record + 1, reserved + 1)``. The cost is one small fsync per block and a gap
    of at most one block in the seqs after a crash -- a gap consumers can see, never a silent reuse. A clean
    stop, once the log is synced, lowers the mark back to the last seq, so restarts leave no gap.

    One writer at a time: ``record`` holds a lock from the temp file's creation to the directory's fsync.
    Two threads writing the one temp file together left it holding both marks run together (``600\\n000000``,
    which ``load`` rejects: the next start failed), or renamed it away under the other (FileNotFoundError).
    The lock makes the writes whole; *which* mark wins is the caller's to order (``idled.server.engine.seqs``).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, RESERVATION_NAME)
        self._lock = threading.Lock()  # record() runs in worker threads: one write of the file at a time

    def load(self) -> int:
        """The reserved mark (0 when none was ever written)."""
        try:
            with open(self.path, "rb") as file:
                text = file.read(64)
        except FileNotFoundError:
            return 0
        try:
            return int(text.strip() or b"0")
        except ValueError:
            raise EventLogError(f"{self.path} is corrupt ({text[:32]!r}); remove it only if no subscriber depends on seqs") from None

    def record(self, upto: int) -> None:
        """Durably record that seqs up to ``upto`` may be issued. Blocking I/O: run it in a thread.

        Lowering the mark is only safe once every issued seq is durably in the log (a clean stop). Raises
        FsyncFailed (fatal), or OSError if the mark could not be written (ENOSPC: the old mark stands, on disk
        and for the caller, which must not issue a seq past it)."""
        with self._lock:
            self._record(upto)

    def _record(self, upto: int) -> None:
        temporary = self.path + ".tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            try:
                write_all(fd, b"%d\n" % upto)
            except OSError:
                os.unlink(temporary)  # a full disk: the mark stays as it was, and the caller tries again later
                raise
            try:
                os.fsync(fd)
            except OSError as exc:
                raise FsyncFailed(f"fsync of {temporary}: {exc}") from exc
        finally:
            os.close(fd)
        os.replace(temporary, self.path)
        try:
            fsync_directory(self.directory)
        except OSError as exc:
            raise FsyncFailed(f"fsync of {self.directory}: {exc}") from exc
