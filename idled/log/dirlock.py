"""The event log directory's lock: one writer per directory, and who that writer is.

`acquire` takes an exclusive, non-blocking ``flock`` on ``<dir>/lock`` and writes the holder's pid into the
file. The flock is the lock (the kernel drops it when the holder dies, however it dies); the pid is only for
the refusal a second writer gets, which otherwise could not say whom to stop: `LogLocked` carries it
(``pid``), read back from the file. A holder that has the flock but has not yet written its pid, or a pid
from another PID namespace, is reported as it is read -- unknown, or a number that names nobody here.
"""

from __future__ import annotations

import fcntl
import os
from typing import Final

from idled.log.errors import LogLocked

__all__ = ["LOCK_NAME", "acquire", "holder_pid"]

LOCK_NAME: Final = "lock"
_MAX_PID_BYTES: Final = 32  # a pid and a newline; anything longer is not ours


def acquire(directory: str) -> int:
    """Lock ``directory`` (which must exist) for this process; return the lock's descriptor (closing it
    releases the lock). Raises `LogLocked` with the holder's pid when another descriptor holds it."""
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _read_pid(fd)
        os.close(fd)
        who = f"pid {pid}" if pid is not None else "pid unknown"
        raise LogLocked(f"{directory} is locked by another writer ({who})", pid=pid) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # (a full disk: the lock holds all the same; only a rival's message loses the pid)
    return fd


def holder_pid(directory: str) -> int | None:
    """The pid the lock file names (the last holder's; whether it still holds the lock is flock's to say)."""
    try:
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_pid(fd)
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, _MAX_PID_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
