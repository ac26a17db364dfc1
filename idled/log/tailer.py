"""Reading a log from outside the writer: `iter_records` (a one-pass scan) and `LogTailer` (`tail -f`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from idled.log.records import decode_buffer
from idled.log.segments import READ_CHUNK_BYTES, SegmentScan, list_segments, segment_name, segments_from

__all__ = ["iter_records", "LogTailer"]


def iter_records(directory: str | os.PathLike[str], from_seq: int = 0) -> Iterator[dict[str, Any]]:
    """Every retained good record with seq >= from_seq, in log (= seq) order, damage skipped (see records).

    The segment list is taken once; each segment is read to its end at the time it is reached, so records
    appended meanwhile to the active segment are included. Blocking file I/O: from trio, run it in a thread.
    """
    for _first, path in segments_from(os.fspath(directory), from_seq):
        try:
            for record in SegmentScan(path):
                if record["seq"] >= from_seq:
                    yield record
        except FileNotFoundError:
            continue  # deleted by retention after listing


class LogTailer:
    """Follows a log directory from outside the writer (e.g. `idled events --follow`).

    Keeps a position (segment, byte offset of the next unread record); each `poll()` reads what was added
    since, moving to the next segment once a newer one exists and the current one is read to its end.
    Yields only seqs >= from_seq and above the last one returned, so its output is strictly increasing.
    The segment list is taken *before* reading the current segment: if a newer segment was already listed,
    the writer had finished the current one before that read, so nothing is left behind when moving on.

    Damage is skipped (the decoder resynchronises) and recorded in `damage`, in the order found:
    (segment path, offset, bytes, records lost, estimated). Bytes left unread at the end of a segment when
    the tailer moves on are damage too; those at the end of the newest segment are `pending_bytes()`.
    """

    def __init__(self, directory: str | os.PathLike[str], from_seq: int = 0) -> None:
        self.directory = os.fspath(directory)
        self.from_seq = from_seq
        self.last_seq = from_seq - 1  # highest seq returned
        self.damage: list[tuple[str, int, int, int]] = []
        self._segment: int | None = None  # first seq (name) of the segment being read
        self._offset = 0

    @property
    def skipped_bytes(self) -> int:
        return sum(entry[2] for entry in self.damage)

    @property
    def corrupt(self) -> int:
        return sum(entry[3] for entry in self.damage)

    def poll(self, max_records: int = 10_000) -> list[dict[str, Any]]:
        """New records since the last poll: about max_records at most (whole 1 MiB chunks), [] when caught up."""
        out: list[dict[str, Any]] = []
        while len(out) < max_records:
            segments = list_segments(self.directory)
            if not segments:
                break
            names = [first for first, _ in segments]
            if self._segment is None:
                # Start in the last segment named <= from_seq (it may hold from_seq), else the oldest.
                self._segment = max((n for n in names if n <= self.from_seq), default=names[0])
                self._offset = 0
            current = self._segment
            path = os.path.join(self.directory, segment_name(current))
            if current in names and self._read_chunk(path, out):
                continue
            later = [n for n in names if n > current]
            if not later:
                break
            self._note_tail(path)
            self._segment, self._offset = later[0], 0
        return out

    def pending_bytes(self) -> int:
        """Bytes after the last decided record of the segment being read (a torn tail or a write in progress)."""
        if self._segment is None:
            return 0
        try:
            return max(0, os.path.getsize(os.path.join(self.directory, segment_name(self._segment))) - self._offset)
        except FileNotFoundError:
            return 0

    def _note_tail(self, path: str) -> None:
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return  # deleted by retention: nothing to report
        if size > self._offset:
            self._note(path, self._offset, size - self._offset, 1)

    def _note(self, path: str, offset: int, length: int, records: int) -> None:
        # Not merged with a previous region (a region cut by a chunk boundary shows as two): a caller may
        # already have reported the first part.
        self.damage.append((path, offset, length, records))

    def _read_chunk(self, path: str, out: list[dict[str, Any]]) -> bool:
        """Read one chunk at the current offset; append new records to `out`; True if the offset moved."""
        try:
            with open(path, "rb", buffering=0) as file:
                if os.fstat(file.fileno()).st_size < self._offset:
                    self._offset = 0  # truncated by recovery under us: re-read, the seq filter drops repeats
                file.seek(self._offset)
                data = file.read(READ_CHUNK_BYTES)
        except FileNotFoundError:
            return False
        result = decode_buffer(data)
        for offset, length, records in result.damage:
            self._note(path, self._offset + offset, length, records)
        consumed = len(data) - result.torn_bytes
        for record in result.records:
            seq = record["seq"]
            if seq > self.last_seq:
                out.append(record)
                self.last_seq = seq
        self._offset += consumed
        return consumed > 0
