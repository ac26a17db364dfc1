"""Disk space for the active segment, allocated ahead of its writes: a full disk shows up before a write.

Theory of operation
-------------------
A write into the page cache can succeed while the blocks behind it are not yet allocated (delayed allocation,
NFS, thin provisioning); the disk then runs out at writeback, and the error surfaces at ``fdatasync``, which is
fatal (fsyncgate: a failed fsync is never retried). To have the disk say "full" at a point we can degrade on,
the log *reserves* the active segment's blocks before writing into them: ``fallocate(fd,
FALLOC_FL_KEEP_SIZE, offset, length)``. KEEP_SIZE allocates without changing the file's size, so the file
still ends at its last whole record -- recovery, readers and the standby see exactly what they saw before --
and writes that fall inside the reservation need no allocation. (``os.posix_fallocate`` would extend the file;
hence the libc call through ctypes.)

``Reservation.ensure(fd, end, limit)`` is called before each write that would end at ``end``. When ``end``
lies past the reserved mark, it reserves up to ``end + ahead`` (never past ``limit``, the segment size, but
always up to ``end``); if the disk cannot hold that much, just up to ``end``; if it cannot hold even that, the
OSError (ENOSPC, EDQUOT) propagates and nothing has been written: the log stays at its last whole record and
the caller degrades (``idled.log.writer``). So that the writer's small batches, written on the event loop,
never call fallocate there, the writer's thread also tops the reservation up (``top_up``: back to ``size +
ahead`` once less than half of it is left) and a batch goes inline only if its worst case is ``covers``ed:
one fallocate per ~8 MiB written (~50k events), always in the writer's thread. A file system without fallocate
(EOPNOTSUPP) turns reservation off: writes then fail by themselves on a full disk, and ``EventLog`` cuts a
partial write back.

Cost: a segment holds at most ``ahead`` bytes of blocks beyond its end while it is active (on tmpfs, memory);
a segment rotated away was reserved up to about its size (the reservation stops at the segment size), and
``trim`` gives back what lies beyond the end when the log is closed. ``ftruncate`` also frees the reserved
blocks past the new size, so after a failed write is cut back the mark returns to the size (``reset``).
"""

from __future__ import annotations

import errno
import functools
import os
from typing import Any, Final

__all__ = ["FALLOC_FL_KEEP_SIZE", "RESERVE_AHEAD", "Reservation", "fallocate_keep_size"]

FALLOC_FL_KEEP_SIZE: Final = 0x01  # linux/falloc.h
RESERVE_AHEAD: Final = 16 * 1024 * 1024  # bytes reserved past the write position, at most
_UNSUPPORTED: Final = frozenset({errno.EOPNOTSUPP, errno.ENOSYS})


@functools.cache
def _libc_fallocate() -> Any:
    """libc's fallocate64, or None where there is none (not Linux); looked up when a log is made (a
    ``Reservation``), so that a command that only imports the log (``idled token``, ``idled status``) does not
    load ctypes."""
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate64  # the 64-bit offsets on every glibc/musl
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


def fallocate_keep_size(fd: int, offset: int, length: int) -> None:
    """Allocate ``length`` bytes of ``fd`` from ``offset`` without changing its size. Raises OSError."""
    fallocate = _libc_fallocate()
    if fallocate is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    if fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        import ctypes  # (loaded already: _libc_fallocate imported it)

        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class Reservation:
    """How far the active segment's blocks are allocated (``reserved``: a file offset); see the module docstring.

    ``enabled`` False: not reserving (the file system cannot, or ``ahead`` is 0). ``fallocates``: calls made."""

    __slots__ = ("ahead", "reserved", "enabled", "fallocates")

    def __init__(self, ahead: int = RESERVE_AHEAD) -> None:
        if ahead < 0:
            raise ValueError("ahead must be >= 0")
        self.ahead = ahead
        self.reserved = 0
        self.enabled = ahead > 0
        self.fallocates = 0
        if self.enabled:
            _libc_fallocate()  # looked up now, with the log: not later, when descriptors may have run out

    def reset(self, size: int) -> None:
        """A new active segment, or one just cut back to ``size``: nothing is known to be reserved past it."""
        self.reserved = size

    def covers(self, end: int) -> bool:
        """Whether a write ending at ``end`` needs no reservation (no fallocate: it may run on the event loop)."""
        return not self.enabled or end <= self.reserved

    def ensure(self, fd: int, end: int, limit: int) -> None:
        """Make sure the blocks up to ``end`` are allocated, reserving ahead if they are not (see the module
        docstring). Raises OSError (ENOSPC, EDQUOT...) when even ``end`` cannot be; the file is unchanged then."""
        if not self.enabled or end <= self.reserved:
            return
        target = max(end, min(limit, end + self.ahead))
        try:
            self._allocate(fd, target)
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                self.enabled = False
                return
            if target == end:
                raise
            self._allocate(fd, end)  # room for this write, if not for the next ones

    def top_up(self, fd: int, size: int, limit: int) -> None:
        """Reserve up to ``size + ahead`` (within ``limit``) once less than half of it is left; best effort, so
        that small writes find their blocks reserved and need no fallocate (``covers``)."""
        target = min(limit, size + self.ahead)
        if not self.enabled or size + self.ahead // 2 <= self.reserved or target <= self.reserved:
            return
        try:
            self._allocate(fd, target)
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                self.enabled = False
            # else: a full disk; the next write that needs blocks asks for exactly what it needs (``ensure``)

    def _allocate(self, fd: int, target: int) -> None:
        self.fallocates += 1
        fallocate_keep_size(fd, self.reserved, target - self.reserved)
        self.reserved = target

    def trim(self, fd: int) -> None:
        """Give back the blocks reserved past the file's end (closing the log). Best effort."""
        if self.enabled and self.reserved:
            try:
                os.ftruncate(fd, os.fstat(fd).st_size)
            except OSError:
                pass
        self.reserved = 0
