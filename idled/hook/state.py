"""The hook's state directory: its lock, its checkpoint, its dead letters. Plain file I/O (the runner calls it
from a worker thread).

Theory of operation
-------------------
``<dir>/lock`` is the event log's lock (`idled.log.dirlock`: a ``flock`` the kernel drops when the holder
dies, plus the holder's pid for the refusal): one hook per state directory, so two hooks never post the same
stream or race on one checkpoint.

``<dir>/checkpoint`` holds ``{"seq": N, "time": T}``: every event with seq <= N has been acknowledged by the
receiver with a 2xx, filtered out, or dead-lettered durably. It is committed like a database commit --
write ``checkpoint.tmp``, fsync it, rename it over ``checkpoint``, fsync the directory -- so after a crash
(of the process or of the machine) the file is the old checkpoint or the new one, never a torn mix, and a
checkpoint is never on disk ahead of what the receiver acknowledged. A damaged checkpoint is an error, not
"start over": silently re-posting the whole retained log, or skipping to now, is a decision for the operator.

``<dir>/dead-letter.jsonl`` gets one JSON line per batch the receiver refused ``max_attempts`` times:
``{"time", "delivery", "first_seq", "last_seq", "attempts", "error", "batch": <the body as posted>}``,
appended and fsynced *before* the checkpoint moves past the batch. Nothing rotates it: it grows only while
the receiver refuses, and an operator replays and truncates it (docs/hook.md).

A full disk (``StateError.disk_full``) is not the end: the deliverer goes on with the checkpoint on disk
left behind (a restart would re-post from it: at-least-once, as after a crash), and waits for room before it
moves past a batch it must dead-letter (`idled.hook.deliver`). A write that fails leaves no temporary file.
"""

from __future__ import annotations

import json
import os
from typing import Final

from idled.hook.batch import Batch
from idled.log import dirlock
from idled.log.errors import DISK_FULL_ERRNOS, LogLocked

__all__ = ["StateDir", "StateError", "CHECKPOINT", "DEAD_LETTER", "REDRIVE_FILE"]

CHECKPOINT: Final = "checkpoint"
DEAD_LETTER: Final = "dead-letter.jsonl"
REDRIVE_FILE: Final = "dead-letter.redrive.jsonl"  # `idled.hook.redrive`'s
_MAX_CHECKPOINT_BYTES: Final = 4096


class StateError(Exception):
    """The state directory cannot be used. ``code``: ``locked`` (another hook holds it; ``pid``),
    ``io`` (an OSError: permission, disk full; ``errno``: its errno) or ``damaged`` (an unreadable checkpoint)."""

    def __init__(self, code: str, reason: str, pid: int | None = None, errno: int | None = None) -> None:
        super().__init__(reason)
        self.code, self.reason, self.pid, self.errno = code, reason, pid, errno

    @property
    def disk_full(self) -> bool:
        """The state directory's disk (or quota) is full: trying again later may succeed."""
        return self.errno in DISK_FULL_ERRNOS


def _cut(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass  # the torn line stays (the retry appends the whole line after it)


class StateDir:
    """An open, locked state directory; `close()` releases the lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            self._lock_fd: int | None = dirlock.acquire(path)
        except LogLocked as exc:
            who = f"pid {exc.pid}" if exc.pid is not None else "pid unknown"
            raise StateError("locked", f"locked by another idled hook ({who})", exc.pid) from None
        except OSError as exc:
            raise StateError("io", exc.strerror or str(exc)) from None

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def read_checkpoint(self) -> int | None:
        """The committed seq, or None if there is no checkpoint yet."""
        try:
            with open(self._file(CHECKPOINT), "rb") as f:
                raw = f.read(_MAX_CHECKPOINT_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError("io", f"{CHECKPOINT}: {exc.strerror or exc}") from None
        try:
            seq = json.loads(raw)["seq"]
        except (ValueError, KeyError, TypeError):
            seq = None
        if type(seq) is not int or seq < 0 or len(raw) > _MAX_CHECKPOINT_BYTES:
            raise StateError("damaged", f"{CHECKPOINT} is not {{\"seq\": N}}: {raw[:80]!r}; fix or remove it "
                                        "(then --from SEQ says where to start)")
        return seq

    def commit_checkpoint(self, seq: int, now: float) -> None:
        """Durably record that every event up to ``seq`` is done (tmp, fsync, rename, fsync the directory)."""
        self.replace(CHECKPOINT, json.dumps({"seq": seq, "time": round(now, 3)}).encode() + b"\n")

    def replace(self, name: str, data: bytes) -> None:
        """Make ``<dir>/name`` hold ``data``, atomically and durably: the old content or the new after a crash."""
        tmp = self._file(name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._file(name))
            self.fsync_dir()
        except OSError as exc:
            try:
                os.unlink(tmp)  # (a full disk: what the partial write took is given back)
            except OSError:
                pass
            raise StateError("io", f"committing {name}: {exc.strerror or exc}", errno=exc.errno) from None

    def dead_letter_bytes(self) -> int:
        """Bytes of dead letters not yet redriven (the dead-letter file and an unfinished redrive's)."""
        total = 0
        for name in (DEAD_LETTER, REDRIVE_FILE):
            try:
                total += os.stat(self._file(name)).st_size
            except OSError:
                pass
        return total

    def append_dead_letter(self, batch: Batch, attempts: int, error: str, now: float) -> None:
        """Append ``batch`` to the dead-letter file, durably (the checkpoint may move past it afterwards)."""
        head = json.dumps({"time": round(now, 3), "delivery": batch.delivery_id, "first_seq": batch.first_seq,
                           "last_seq": batch.last_seq, "attempts": attempts, "error": error})
        line = head[:-1].encode() + b',"batch":' + batch.body() + b"}\n"
        path = self._file(DEAD_LETTER)
        try:
            created = not os.path.exists(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view):]
                except OSError:
                    _cut(fd, start)  # a line a full disk tore goes: the retry appends it whole
                    raise
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                self.fsync_dir()
        except OSError as exc:
            raise StateError("io", f"appending to {DEAD_LETTER}: {exc.strerror or exc}", errno=exc.errno) from None

    def fsync_dir(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
