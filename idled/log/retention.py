"""Retention: which of the oldest segments a log may delete, by size and by age.

Theory of operation
-------------------
``EventLog.apply_retention`` (run after every rotation, and by the writer at least every ``retention_every``)
lists the segments and asks `victims` which to delete: whole segments from the oldest end, while the log is
over ``retention_bytes`` or while a segment's mtime (the time of its newest record) is older than
``retention_seconds``. It stops at the first segment it keeps, so the log stays one contiguous range of seqs,
and never names the active segment (nor the newest one, whichever is active). Worked by hand, with
``retention_bytes`` 2,500, no age limit, and four segments of 1,000 bytes (the last active)::

    [1..43] 1000   [44..90] 1000   [91..130] 1000   [131..] 1000 (active)     total 4000
    [1..43]   deleted: 3000 left, still over
    [44..90]  deleted: 2000 left, no longer over: stop               -> covered_below 91

``covered_below`` is the name (first seq) of the oldest segment kept: every record of the victims lies below
it. The caller deletes them only once a snapshot covers that seq (``idled.log.snapshot``: the open sessions
and the last-seen map), so retention never makes recovery forget who is online or when a user was last seen;
if the snapshot cannot be written, nothing uncovered is deleted. A segment that vanished meanwhile (a
``stat`` that finds nothing) is skipped; deleting one that is already gone counts as deleted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["victims", "delete"]


def victims(segments: Sequence[tuple[int, str]], active: str | None, retention_bytes: int,
            cutoff: float) -> tuple[list[str], int]:
    """(the segments to delete, oldest first; the seq below which all their records lie -- 0 if none) out of
    ``segments`` ((first seq, path), in seq order). ``active``: the active segment's path (None: the newest);
    ``cutoff``: the wall time before which a segment's mtime is too old."""
    if len(segments) < 2:
        return [], 0
    stats = []
    total = 0
    for first, path in segments:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        stats.append((first, path, st.st_size, st.st_mtime))
        total += st.st_size
    active = active or segments[-1][1]
    paths: list[str] = []
    covered_below = 0
    for index, (_first, path, size, mtime) in enumerate(stats[:-1]):
        if path == active or not (total > retention_bytes or mtime < cutoff):
            break
        paths.append(path)
        covered_below = stats[index + 1][0]
        total -= size
    return paths, covered_below


def delete(paths: Sequence[str]) -> list[str]:
    """Unlink ``paths`` (one already gone counts as deleted); returns them."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return list(paths)
