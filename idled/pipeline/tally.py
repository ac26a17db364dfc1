"""What the paired path counts on its way: per-session contributions and the mergeable tallies of a run.

Theory of operation
-------------------
The paired path (`paired`) never materializes one row per record or per session for the derived tables.
Each session, wherever it is paired -- inside a segment file (`filepass`) or across files (`userpass`) --
adds its contribution here at once (`Tally.close` for a closed one, `Tally.open` for one still open) to the
*user's* running lists: its minute ranges, merged on the fly with the previous range when they overlap or
touch (concurrency and DAU only need the union of a user's minutes), and the starts of its short
user-ended sessions (flappers). Sessions started per UTC day (dau) and closed sessions per (day, length
bucket) (session_lengths) are plain counters that add across files and partitions; they are counted when a
batch of sessions is written, from its columns at once (`Tally.count_written`, numpy: a tenth of the cost
of counting in the pairing loop).

A `Tally` holds only counters that add, so the driver merges the tallies of every file and every partition
with `Tally.merge`, in any order, and gets the same numbers as one pass over everything. The user-level
lists are finished per user by `userpass` (union across files and daemons, flap windows).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

from idled.pipeline.rules import BUCKETS, NOT_USER_ENDS, minute_range

__all__ = ["Tally", "add_range"]

_DAY: Final = 86400.0
_BUCKETS: Final = np.array(BUCKETS)
K = TypeVar("K")
_KEYS_PER_DAY: Final = 1 << 8  # (day, bucket) as one int64 key: len(BUCKETS) is far below it
assert len(BUCKETS) < _KEYS_PER_DAY


def _counts(keys: npt.NDArray[np.int64]) -> Iterator[tuple[int, int]]:
    """(value, how often it occurs) of `keys` (np.unique on int64: a sort, ~10x faster than on rows of floats)."""
    values, counts = np.unique(keys, return_counts=True)
    return zip(values.tolist(), counts.tolist())


def _add(counter: dict[K, int], counts: Iterable[tuple[K, int]]) -> None:
    for key, n in counts:
        counter[key] = counter.get(key, 0) + n


def add_range(ranges: list[int], first: int, last: int) -> None:
    """Append [first, last] to a flat [a0, b0, a1, b1, ...] list, merged into the last range when they
    overlap or touch (the union of minutes is all that counts; ranges arriving out of order stay separate
    and are merged by the final sort in `userpass`)."""
    if ranges and first <= ranges[-1] + 1 and last >= ranges[-2] - 1:
        if first < ranges[-2]:
            ranges[-2] = first
        if last > ranges[-1]:
            ranges[-1] = last
    else:
        ranges.append(first)
        ranges.append(last)


@dataclass(slots=True)
class Tally:
    """Counters of a file, a partition or the whole run; every field adds under `merge`."""

    started: dict[int, int] = field(default_factory=dict)  # unix day -> sessions started
    lengths: dict[tuple[int, int], int] = field(default_factory=dict)  # (unix day, bucket) -> closed sessions
    sessions: int = 0
    open_sessions: int = 0
    superseded: int = 0
    orphans: int = 0

    def close(self, start: float, end_ts: float, end_reason: str | None, short_s: float, ranges: list[int],
              shorts: list[float]) -> None:
        """A closed session [start, end_ts] of a user whose minute ranges and short starts are given (its
        day and length bucket are counted when it is written: `count_written`)."""
        self.sessions += 1
        first, last = minute_range(start, end_ts)  # an end before the start (a clock step) counts as the start
        add_range(ranges, first, last)
        if end_ts - start < short_s and end_reason not in NOT_USER_ENDS:
            shorts.append(start)

    def open(self, start: float, data_end: float, ranges: list[int]) -> None:
        """An open session: it covers the minutes up to its daemon's data end."""
        self.sessions += 1
        self.open_sessions += 1
        first, last = minute_range(start, data_end)
        add_range(ranges, first, last)

    def count_written(self, starts: npt.NDArray[np.float64], ends: npt.NDArray[np.float64], lengths: bool = True) -> None:
        """Sessions started per day, and closed ones per (day, length bucket) unless `lengths` is false, of
        sessions as they are written: their starts and ends (NaN for an open session) as arrays, counted at
        once instead of per session."""
        _add(self.started, _counts(np.floor(starts / _DAY).astype(np.int64)))  # as `rules.day_range` (dau)
        if not lengths:
            return
        closed = ~np.isnan(ends)
        durations = ends[closed] - starts[closed]
        days = np.floor_divide(starts[closed], _DAY).astype(np.int64)  # as the `date` column: Python's float //
        buckets = np.maximum(np.searchsorted(_BUCKETS, durations, side="right") - 1, 0)
        _add(self.lengths, ((divmod(key, _KEYS_PER_DAY), n) for key, n in _counts(days * _KEYS_PER_DAY + buckets)))

    def merge(self, other: Tally) -> None:
        _add(self.started, other.started.items())
        _add(self.lengths, other.lengths.items())
        self.sessions += other.sessions
        self.open_sessions += other.open_sessions
        self.superseded += other.superseded
        self.orphans += other.orphans
