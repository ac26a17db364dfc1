"""The next segment, created ahead of need, and the descriptor slot kept for it (`idled.log.eventlog`: "A roll
never needs a descriptor at the moment of need").

``make()`` creates the empty file ``next-segment.spare`` and holds it open; a roll ``take``s it (a rename,
which needs no descriptor). If no descriptor slot is free (EMFILE/ENFILE: connections took them all), ``make``
gives up the *reserve* descriptor (a dup of the directory's) and creates the spare in that slot. Each closed
rotated segment frees a slot, which ``slot_freed`` hands at once to the spare, else to the reserve, whichever
is missing. Creating the spare needs no disk space (an empty file), so a full disk leaves it in place.
"""

from __future__ import annotations

import errno
import os
from typing import Final

__all__ = ["NO_DESCRIPTOR", "SPARE_NAME", "SpareSegment"]

SPARE_NAME: Final = "next-segment.spare"
NO_DESCRIPTOR: Final = (errno.EMFILE, errno.ENFILE)
_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


class SpareSegment:
    """The spare segment's descriptor (``fd``, None if there is none), the reserve slot, and ``failures``."""

    __slots__ = ("path", "fd", "reserve_fd", "failures")

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, SPARE_NAME)
        self.fd: int | None = None
        self.reserve_fd: int | None = None  # a slot to give up for the spare when none is free
        self.failures = 0  # failed attempts to create the spare

    def discard(self) -> None:
        """Remove a spare left by a previous run (always empty)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def make(self) -> bool:
        """Create the spare if there is none; True if one was created (the directory changed). Best effort: a
        failure is counted, and retried when a rotated segment's descriptor is closed."""
        if self.fd is not None:
            return False
        try:
            self.fd = os.open(self.path, _FLAGS, 0o644)
        except OSError as exc:
            if exc.errno not in NO_DESCRIPTOR or self.reserve_fd is None:
                self.failures += 1
                return False
            os.close(self.reserve_fd)
            self.reserve_fd = None
            try:
                self.fd = os.open(self.path, _FLAGS, 0o644)
            except OSError:
                self.failures += 1
                return False
        return True

    def take(self, path: str) -> int | None:
        """Rename the spare to ``path`` and return its descriptor (None: there is no spare). Raises OSError."""
        if self.fd is None:
            return None
        if os.path.lexists(path):  # what O_EXCL would have refused (the log's lock is held: no race)
            raise FileExistsError(errno.EEXIST, "a file of that name exists", path)
        os.rename(self.path, path)
        fd, self.fd = self.fd, None
        return fd

    def slot_freed(self, dir_fd: int | None) -> bool:
        """A descriptor was just closed: the slot goes to the spare, else to the reserve, if missing (before
        anything else can take it). True if the spare was created."""
        if self.fd is None:
            return self.make()
        if self.reserve_fd is None and dir_fd is not None:
            try:
                self.reserve_fd = os.dup(dir_fd)
            except OSError:
                pass  # taken meanwhile: the next close retries
        return False

    def close(self) -> None:
        for fd in (self.fd, self.reserve_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.reserve_fd = None
