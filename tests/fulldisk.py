"""Fault injection for tests of a full disk where a real one is impractical: while ``FullDisk.full``, every
space reservation (fallocate) and every write of the event log's files -- segments, the seq reservation,
snapshots, a quarantined tail -- fails with ENOSPC, after writing ``partial`` bytes of it when asked (as a real
write can). The end-to-end tests use a real full tmpfs instead (tests/faults/test_disk_full.py)."""

from __future__ import annotations

import errno
import os

import pytest

from idled.log import eventlog, recovery, seqs, snapshot, space

__all__ = ["FullDisk"]


class FullDisk:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.partial = 0  # bytes a failing write writes before it fails
        self.failures = 0  # calls that failed
        real_fallocate = space.fallocate_keep_size

        def fallocate(fd: int, offset: int, length: int) -> None:
            self._check()
            real_fallocate(fd, offset, length)

        def write_all(fd: int, data: bytes) -> None:
            if self.full and self.partial:
                os.write(fd, data[: min(self.partial, len(data) - 1)])
            self._check()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]

        monkeypatch.setattr(space, "fallocate_keep_size", fallocate)
        for module in (eventlog, recovery, seqs, snapshot):
            monkeypatch.setattr(module, "write_all", write_all)

    def _check(self) -> None:
        if self.full:
            self.failures += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
