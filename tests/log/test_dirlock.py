"""The log directory's lock names its holder: the pid goes into the lock file, and a refused second writer's
`LogLocked` carries it. Real flocks on a real file (flock is per open file, so one process can play both)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from idled.log import dirlock
from idled.log.errors import LogLocked


def test_the_holder_writes_its_pid_and_a_rival_is_told_it(tmp_path: Path) -> None:
    fd = dirlock.acquire(str(tmp_path))
    try:
        assert (tmp_path / dirlock.LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with pytest.raises(LogLocked) as info:
            dirlock.acquire(str(tmp_path))
        assert info.value.pid == os.getpid()
        assert f"(pid {os.getpid()})" in str(info.value)
    finally:
        os.close(fd)
    os.close(dirlock.acquire(str(tmp_path)))  # released with its descriptor


def test_a_stale_longer_pid_is_replaced_not_overwritten_in_place(tmp_path: Path) -> None:
    (tmp_path / dirlock.LOCK_NAME).write_text("1234567890\n")  # an earlier holder's, longer than ours
    os.close(dirlock.acquire(str(tmp_path)))
    assert dirlock.holder_pid(str(tmp_path)) == os.getpid()


def test_a_lock_file_naming_nobody_reads_as_unknown(tmp_path: Path) -> None:
    (tmp_path / dirlock.LOCK_NAME).write_text("")  # an older idled's empty lock file, or a holder not yet written
    assert dirlock.holder_pid(str(tmp_path)) is None
    assert dirlock.holder_pid(str(tmp_path / "missing")) is None
