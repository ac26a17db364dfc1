"""Open-session snapshots: retention never makes recovery forget who is online.

Theory of operation
-------------------
Recovery closes every session the previous run left online (an offline ``restart`` record each), and it
learns them from the log: a uid is online when its last record says so. Retention deletes old segments, so
a user online without change for longer than the retention would be forgotten. The writer therefore keeps
`OpenSessions`, the compact map uid -> (last_seen, timeout) of every session whose last record is online,
updated as records are appended (one dict store or pop per online/offline record), and before retention
deletes a segment not yet covered, it writes a *snapshot*: the map as of seq N, i.e. the state after every
record below N (N = last written seq + 1). Recovery starts from the newest snapshot that verifies and
replays only records with seq >= N on top of it; the segments retention removed all held seqs < N.

Memory: one dict entry per open session whose key is the uid object the presence table already holds, and
one `complex` as the value -- two exact doubles in a single 32-byte object (a tuple of two floats costs
104). Measured with tracemalloc at 1M sessions: see tests/log/test_snapshot.py for the bound it must keep.

The same snapshot carries the *last-seen* map (`idled.log.lastseen.LastSeen`: uid -> last_seen of each user
whose last record is an offline), so a query's "last seen" survives retention too.

File: ``snapshot-<N:020d>``, written to a temporary name, fsynced, renamed, directory fsynced (so it is
durable before any segment it replaces is unlinked); the newest two are kept (the older one is a fallback
should the newest be damaged, which recovery reports)::

    +----------+--------+---------+---------+--------------------------------------------------------------+
    | IDLSNAP1 | u64 N  | u32 n   | u32 CRC | body: msgpack [uids, last_seen, timeout(, seen_uids, seen)]   |
    | 8 bytes  |        | entries | of body | uids: array; last_seen, timeout: n doubles LE (bin);          |
    |          |        |         |         | seen_uids: array; seen: one double LE per seen uid (bin)      |
    +----------+--------+---------+---------+--------------------------------------------------------------+

The last two elements are the last-seen map (parallel arrays, like the open sessions: ~8 bytes a user plus its
uid). A snapshot written before they existed has three elements and loads with an empty map; a daemon older
than them reads a five-element snapshot as damaged (see docs/event-log.md, "Retention").
"""

from __future__ import annotations

import os
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import msgpack

from idled.log.segments import fsync_directory, write_all

__all__ = [
    "SNAPSHOT_PREFIX", "Uid", "OpenSessions", "Snapshot", "snapshot_name", "list_snapshots", "write_snapshot",
    "load_snapshot", "read_snapshot", "read_snapshot_state", "encode_snapshot", "SnapshotDamaged", "summary_record", "session_summary",
]

Uid: TypeAlias = str | int

SNAPSHOT_PREFIX: Final = "snapshot-"
SNAPSHOT_KEEP: Final = 2
_MAGIC: Final = b"IDLSNAP1"
_HEADER: Final = struct.Struct(">8sQII")
_SNAPSHOT_RE: Final = re.compile(r"^snapshot-(\d{20})$")
_TEMPORARY: Final = "snapshot.tmp"


class SnapshotDamaged(ValueError):
    """A snapshot file failed its checks (bad magic, CRC, or shape)."""


class OpenSessions:
    """uid -> complex(last_seen, timeout) of each session whose last record is online. Not thread-safe.

    `note` is the append path; `as_records` turns the map back into minimal online records (what
    `PresenceTable.restart_event` reads: uid, last_seen, timeout)."""

    __slots__ = ("sessions",)

    def __init__(self, sessions: dict[Uid, complex] | None = None) -> None:
        self.sessions: dict[Uid, complex] = {} if sessions is None else sessions

    def __len__(self) -> int:
        return len(self.sessions)

    def note(self, event: Mapping[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "online":
            self.sessions[event.get("uid")] = session_summary(event)  # type: ignore[index]
        elif kind == "offline":
            self.sessions.pop(event.get("uid"), None)  # type: ignore[arg-type]

    def as_records(self, seq: int) -> dict[Uid, dict[str, Any]]:
        """Minimal online records for the map, marked as coming from the snapshot at `seq`."""
        return {uid: summary_record(uid, value, seq) for uid, value in self.sessions.items()}


def session_summary(event: Mapping[str, Any]) -> complex:
    last_seen = event.get("last_seen")
    timeout = event.get("timeout")
    # A record without them (tests, foreign writers) still names an online uid: NaN means "unknown", and
    # the restart record falls back to its own defaults then (see summary_record).
    return complex(
        last_seen if isinstance(last_seen, (int, float)) else float("nan"),
        timeout if isinstance(timeout, (int, float)) else float("nan"),
    )


def summary_record(uid: Uid, value: complex, seq: int) -> dict[str, Any]:
    """The minimal online record for one snapshot entry (NaN fields left out)."""
    record: dict[str, Any] = {"kind": "online", "uid": uid, "snapshot": seq}
    if value.real == value.real:
        record["last_seen"] = value.real
    if value.imag == value.imag:
        record["timeout"] = value.imag
    return record


def snapshot_name(seq: int) -> str:
    return f"{SNAPSHOT_PREFIX}{seq:020d}"


def list_snapshots(directory: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """(seq, path) of every snapshot file, oldest first."""
    directory = os.fspath(directory)
    found = []
    for name in os.listdir(directory):
        match = _SNAPSHOT_RE.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    found.sort()
    return found


def _doubles(values: Iterable[float]) -> bytes:
    packed = array("d", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _undoubles(data: bytes) -> array[float]:
    values = array("d")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def encode_snapshot(seq: int, sessions: dict[Uid, complex], last_seen: Mapping[Uid, float] | None = None) -> bytes:
    """The snapshot file's bytes; ``last_seen`` None writes the three-element body of earlier versions."""
    values = list(sessions.values())
    body_items: list[Any] = [
        list(sessions), _doubles(value.real for value in values), _doubles(value.imag for value in values)
    ]
    if last_seen is not None:
        body_items += [list(last_seen), _doubles(last_seen.values())]
    body = msgpack.packb(body_items, use_bin_type=True)
    return _HEADER.pack(_MAGIC, seq, len(values), zlib.crc32(body)) + body


def write_snapshot(
    directory: str, seq: int, sessions: dict[Uid, complex], dir_fd: int | None = None,
    last_seen: Mapping[Uid, float] | None = None,
) -> str:
    """Durably write the snapshot of `sessions` (and the `last_seen` map) as of `seq`; keep the newest
    SNAPSHOT_KEEP. Returns its path.

    Blocking I/O (writer thread). OSError propagates (with no temporary file left behind): the caller keeps the
    segments it would have deleted.
    `dir_fd`: the directory, already open (fsyncing it then needs no new descriptor)."""
    data = encode_snapshot(seq, sessions, last_seen)
    temporary = os.path.join(directory, _TEMPORARY)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except OSError:
        os.unlink(temporary)  # a full disk: give back what the partial copy took (the caller retries later)
        raise
    finally:
        os.close(fd)
    path = os.path.join(directory, snapshot_name(seq))
    os.replace(temporary, path)
    if dir_fd is not None:
        os.fsync(dir_fd)
    else:
        fsync_directory(directory)
    for _seq, old in list_snapshots(directory)[:-SNAPSHOT_KEEP]:
        try:
            os.unlink(old)
        except FileNotFoundError:
            pass
    return path


def read_snapshot(path: str) -> tuple[int, dict[Uid, complex]]:
    """(seq, sessions) of one snapshot file. Raises SnapshotDamaged, OSError."""
    seq, sessions, _seen = read_snapshot_state(path)
    return seq, sessions


def read_snapshot_state(path: str) -> tuple[int, dict[Uid, complex], dict[Uid, float]]:
    """(seq, open sessions, last-seen map) of one snapshot file; the map is empty in a snapshot written before
    it existed. Raises SnapshotDamaged, OSError."""
    with open(path, "rb") as file:
        data = file.read()
    if len(data) < _HEADER.size:
        raise SnapshotDamaged(f"{path}: {len(data)} bytes, shorter than its header")
    magic, seq, count, crc = _HEADER.unpack_from(data)
    body = memoryview(data)[_HEADER.size :]
    if magic != _MAGIC or zlib.crc32(body) != crc:
        raise SnapshotDamaged(f"{path}: bad magic or CRC")
    try:
        items = msgpack.unpackb(body, raw=False, strict_map_key=False)
        if type(items) is not list or len(items) not in (3, 5):
            raise ValueError("not a 3- or 5-element array")
        uids, last_seen, timeout = items[0], _undoubles(items[1]), _undoubles(items[2])
        seen_uids, seen = (items[3], _undoubles(items[4])) if len(items) == 5 else ([], array("d"))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise SnapshotDamaged(f"{path}: undecodable body ({exc})") from None
    if not (len(uids) == len(last_seen) == len(timeout) == count) or len(seen_uids) != len(seen):
        raise SnapshotDamaged(f"{path}: {count} entries announced, arrays disagree")
    sessions = {uid: complex(ls, to) for uid, ls, to in zip(uids, last_seen, timeout)}
    return seq, sessions, dict(zip(seen_uids, seen))


@dataclass(slots=True)
class Snapshot:
    """The newest snapshot that verified (seq 0 and no sessions when none did), and the damaged ones.
    ``last_seen``: its last-seen map (empty in a snapshot written before the map existed)."""

    seq: int = 0
    sessions: dict[Uid, complex] = field(default_factory=dict)
    last_seen: dict[Uid, float] = field(default_factory=dict)
    path: str | None = None
    damaged: list[str] = field(default_factory=list)


def load_snapshot(directory: str) -> Snapshot:
    """The newest snapshot in `directory` that verifies; damaged newer ones are listed, not deleted."""
    result = Snapshot()
    for seq, path in reversed(list_snapshots(directory)):
        try:
            found_seq, sessions, last_seen = read_snapshot_state(path)
        except (SnapshotDamaged, OSError):
            result.damaged.append(path)
            continue
        if found_seq != seq:
            result.damaged.append(path)
            continue
        result.seq, result.sessions, result.last_seen, result.path = seq, sessions, last_seen, path
        break
    return result
