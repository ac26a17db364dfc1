"""The analytics rules, stated once: the Spark job and the pure-Python reference both implement these.

Sessions (per daemon and uid, events ordered by seq)
----------------------------------------------------
Each ``--events`` directory is one daemon; seqs are compared only within a daemon, and the pairing never
looks at file names or at the order files are read in.

1. Records with the same (daemon, uid, seq) are one record: later copies are *duplicates*, dropped and
   counted (a segment copied twice into a directory must not double anything).
2. An ``online`` starts a session. What follows it decides how the session ends:
   - an ``offline``: the session is *closed* at that offline's ts, with its reason as ``end_reason``
     (``restart``: the daemon died with the session online and closed it when it came back);
   - another ``online`` (no offline between them -- the daemon never does this, so a record was lost or
     corrupted): closed at the new online's ts with end_reason ``superseded``, counted; the new online
     starts the next session;
   - nothing: the session is *open* (``open = true``, no offline_ts/duration/end_reason).
3. An ``offline`` whose predecessor is not an ``online`` (first record of the uid, or after another
   offline) is an *orphan*: counted, not a session. Typical cause: its online was in a segment deleted by
   retention, or corrupt.
4. ``duration = offline_ts - online_ts``, as logged: never negative in a log written since idled's wall
   clock stopped going backwards (docs/operations.md, "Clock steps"); an older log's may be, after a step
   back. For intervals (concurrency, DAU) a session covers ``[online_ts, end)`` with ``end = offline_ts`` for
   closed sessions and the daemon's *data end* (the largest ts among its records) for open ones, raised to
   ``online_ts`` if smaller.

5. Sessions are *user-level*: the daemon emits ``online`` when a user's first session (device) comes and
   ``offline`` when its last goes, so a session here is the time the user was online on any device, whatever
   devices came and went in between. An event caused by a device session carries ``"device": D``: a
   session's ``device`` is its online's (None for a plain login), its ``end_device`` the device of the
   record that ended it (the offline's, or the superseding online's; None while open). Every length below
   (``duration_s``, session_lengths, flappers' short sessions) is a user's, never a device's.
6. Grace (``--grace G``, seconds, default 0 = none). A daemon with ``offline_grace`` delays a ``closed``
   offline by its grace and drops it if the user logs in again meanwhile; the offline it emits carries
   ``"grace": G`` (ts = the original close time; its seq may come after later records of other users, never
   of the same user). For logs written without it, the job can apply one: a daemon's consecutive sessions of
   a uid (in online seq order) are *joined* when the first ended by an offline with reason ``closed`` and no
   ``grace`` field (the daemon already applied its own to those) and the next starts less than G seconds
   after that offline's ts. A joined *user session* starts with its first session and ends as its last does
   (offline ts, end_reason, open). flappers and session_lengths count user sessions; the sessions table,
   concurrency and dau keep the logged sessions.

Users are uids across all daemons: ``42`` (int) and ``"42"`` (str) are different users, the same uid on two
daemons is one user.

Tables
------
* concurrency -- for each minute ``[m, m + 60)`` from the first to the last minute anyone is online, the
  number of distinct users online at *any* time during it (a 10 s session counts in its minute; sampling at
  minute start would miss it). A session covers minutes ``floor(start/60) .. ceil(end/60) - 1`` (just
  ``floor(start/60)`` when ``end == start``).
* lateness -- ``ts - deadline`` of offline records with reason ``idle``, per detector and UTC hour of the
  offline: count, ``early`` (lateness < 0: the detector fired before the deadline, a bug), exact p50/p99
  (linear interpolation between closest ranks, Spark's ``percentile``) and max.
* flappers -- a user flaps when at least ``k`` of their *short* (user) sessions (closed, ``duration < short_s``,
  end_reason not ``restart``/``shutdown``/``superseded``: daemon-caused or reconstructed ends say nothing
  about the user) start within ``window_s`` seconds of each other (first to last start <= window_s). One row
  per user and UTC day on which such a window ended.
* dau -- per UTC day, distinct users online at any time during it (sessions spanning midnight count on each
  day) and the sessions started that day.
* session_lengths -- closed (user) sessions per UTC day of their start and length bucket (`BUCKETS`, lower bound
  inclusive; negative durations fall in the first bucket).

Every table is partitioned by ``date`` (UTC): of the session start, minute, hour, or flagged window end.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Final

__all__ = [
    "FlapParams", "BUCKETS", "SUPERSEDED", "CLOSED", "check_grace", "NOT_USER_ENDS", "bucket_index", "bucket_label",
    "minute_range", "day_range", "unix_date", "percentile",
]

SUPERSEDED: Final = "superseded"
CLOSED: Final = "closed"  # the only end reason a grace joins over (rule 6)
MAX_GRACE_S: Final = 3600.0  # as the daemon's offline_grace
NOT_USER_ENDS: Final = frozenset({"restart", "shutdown", SUPERSEDED})

# Lower bounds in seconds of the session-length buckets; the last bucket is open-ended.
BUCKETS: Final[tuple[float, ...]] = (
    0.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0,
)


@dataclass(frozen=True, slots=True)
class FlapParams:
    """A user flaps when >= k sessions shorter than short_s start within window_s seconds."""

    k: int = 5
    short_s: float = 60.0
    window_s: int = 3600  # whole seconds: Spark's RANGE frame bounds are integers

    def __post_init__(self) -> None:
        if self.k < 1 or not self.short_s > 0 or type(self.window_s) is not int or self.window_s < 0:
            raise ValueError("flap parameters need k >= 1, short_s > 0, window_s a whole number of seconds >= 0")


def check_grace(grace: float) -> float:
    """`grace` if it is a valid ``--grace`` (0 <= G <= 3600 seconds, finite), else ValueError."""
    if not 0.0 <= grace <= MAX_GRACE_S:
        raise ValueError(f"--grace needs 0 <= seconds <= {MAX_GRACE_S:g}, got {grace}")
    return float(grace)


def bucket_index(duration: float) -> int:
    """Index into BUCKETS of the bucket holding `duration` (negative -> 0)."""
    index = 0
    for i, low in enumerate(BUCKETS):
        if duration >= low:
            index = i
    return index


def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def bucket_label(index: int) -> str:
    """"10s-30s", ..., "1d+"."""
    low = BUCKETS[index]
    if index + 1 < len(BUCKETS):
        return f"{_fmt(low)}-{_fmt(BUCKETS[index + 1])}"
    return f"{_fmt(low)}+"


def _span(start: float, end: float, unit: int) -> tuple[int, int]:
    first = math.floor(start / unit)
    if end > start:
        return first, math.ceil(end / unit) - 1
    return first, first


def minute_range(start: float, end: float) -> tuple[int, int]:
    """First and last minute index (unix seconds // 60) that [start, end) touches."""
    return _span(start, end, 60)


def day_range(start: float, end: float) -> tuple[int, int]:
    """First and last UTC day index (days since 1970-01-01) that [start, end) touches."""
    return _span(start, end, 86400)


_EPOCH: Final = _dt.date(1970, 1, 1)


def unix_date(day: int) -> _dt.date:
    return _EPOCH + _dt.timedelta(days=day)


def percentile(sorted_values: list[float], p: float) -> float:
    """Exact percentile with linear interpolation, computed the way Spark's `percentile` does."""
    position = (len(sorted_values) - 1) * p
    lower = math.floor(position)
    higher = math.ceil(position)
    low_value = sorted_values[lower]
    if higher == lower:
        return low_value
    high_value = sorted_values[higher]
    if high_value == low_value:
        return low_value
    return (higher - position) * low_value + (position - lower) * high_value
