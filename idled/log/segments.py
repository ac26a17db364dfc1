"""Segment files: names, listing, streaming one segment's records, and the fd helpers writers share."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any, Final

from idled.log.records import Damage, decode_buffer

__all__ = ["SEGMENT_SUFFIX", "READ_CHUNK_BYTES", "segment_name", "list_segments", "oldest_seq", "SegmentScan",
           "segments_from", "write_all", "fsync_directory"]

SEGMENT_SUFFIX: Final = ".seg"
READ_CHUNK_BYTES: Final = 1024 * 1024  # > MAX_RECORD_BYTES + header, so any record fits in one chunk

_SEGMENT_RE: Final = re.compile(r"^(\d{20})\.seg$")


def segment_name(first_seq: int) -> str:
    """File name of the segment whose first record has seq `first_seq`."""
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """(first_seq, path) of every segment file in `directory`, oldest first. Other files are ignored."""
    directory = os.fspath(directory)
    found = []
    for name in os.listdir(directory):
        match = _SEGMENT_RE.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    found.sort()
    return found


def oldest_seq(directory: str) -> int | None:
    """First seq of the oldest non-empty segment in ``directory`` (its name), or None if no record is there."""
    for first, path in list_segments(directory):
        try:
            if os.stat(path).st_size > 0:
                return first
        except FileNotFoundError:
            continue
    return None


class SegmentScan:
    """Streams one segment's good records in bounded chunks, noting every damaged region.

    After iterating: `good_end` is the file offset just past the last good record (0 if none), `size` the
    bytes read, `damage` the damaged regions (file offset, bytes, records), adjacent ones merged. The bytes
    from `good_end` on hold no good record: the segment's *tail* (a torn write in the active segment).
    """

    __slots__ = ("path", "good_end", "size", "damage")

    def __init__(self, path: str) -> None:
        self.path = path
        self.good_end = 0
        self.size = 0
        self.damage: list[Damage] = []

    @property
    def tail_bytes(self) -> int:
        return self.size - self.good_end

    def damage_before_tail(self) -> list[Damage]:
        """Damaged regions followed by a good record: skipped in place, never cut."""
        return [region for region in self.damage if region[0] < self.good_end]

    def tail_records(self) -> int:
        """Records lost to damage in the tail (estimated); 0 when the tail is one torn (incomplete) record."""
        return sum(region[2] for region in self.damage if region[0] >= self.good_end)

    def _note(self, base: int, regions: list[Damage]) -> None:
        for offset, length, records in regions:
            offset += base
            if self.damage and sum(self.damage[-1][:2]) == offset:  # one region cut by a chunk boundary
                first, previous, estimate = self.damage[-1]
                self.damage[-1] = (first, previous + length, estimate + records)
            else:
                self.damage.append((offset, length, records))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with open(self.path, "rb", buffering=0) as file:
            base = 0  # file offset of buf[0]
            buf = b""
            while True:
                chunk = file.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                buf = buf + chunk if buf else chunk
                result = decode_buffer(buf)
                if result.damage:
                    self._note(base, result.damage)
                if result.records:
                    self.good_end = base + result.good_bytes
                yield from result.records
                consumed = len(buf) - result.torn_bytes
                base += consumed
                buf = buf[consumed:]
            self.size = base + len(buf)


def segments_from(directory: str, from_seq: int) -> list[tuple[int, str]]:
    """The segments that can hold seqs >= from_seq: the last one named <= from_seq, and all after it."""
    segments = list_segments(directory)
    start = 0
    for index, (first, _path) in enumerate(segments):
        if first <= from_seq:
            start = index
        else:
            break
    return segments[start:]


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
