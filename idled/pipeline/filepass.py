"""Decode-time pairing: a daemon's records paired as they are decoded (the paired path's first pass).

Theory of operation
-------------------
A writer's segment holds one daemon's records in seq order, and a daemon's segments hold disjoint seq
ranges. So a uid's next record *in the file* is its next record overall -- except across the file's edges:
the uid's first record in the file may have a predecessor in an earlier file, and its last one a successor
in a later file. This pass pairs everything between the edges exactly as `rules` says (an online ended by
the uid's next record, superseded by a second online, an offline after an offline is an orphan) and keeps
per uid a small `Carry`: its first and last record plus what its sessions contribute to the per-user
tables (merged minute ranges, short-session starts; see `tally`). Files that follow each other in seq are
paired as one stream by passing the same `FileResult` on (`paired` does so for a run of a daemon's
consecutive files), which moves the edges to the ends of the run. `userpass` joins the carries of a uid
across runs and daemons; the closed sessions go to the sessions table as they are.

Whether the premise holds is known only once every file is decoded (the per-file seq ranges, and
`FileStats.unordered` for a file out of seq order): the job checks `records.seq_ranges_overlap` and, if two
files of a daemon overlap, discards this pass and pairs every record in the JVM instead (`pairing`).

Each session carries its devices (the online's, and the device of the record that ended it) into the
sessions table. With ``--grace`` (`UserSessions`), flappers and session_lengths count *user sessions* --
sessions joined over the grace (`rules`, rule 6) -- instead of sessions: the stream's sessions of a uid are
joined after the loop, the ones complete within the stream counted here, the uid's first and last left in
the carry for `userpass` to join across the stream's edges.

Lateness values are gathered per (detector, hour) -- exact percentiles need every value of a group, which
`userpass` gets by collecting one detector's groups from every file.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from idled.pipeline.records import Row
from idled.pipeline.rules import CLOSED, NOT_USER_ENDS, SUPERSEDED, bucket_index
from idled.pipeline.tally import Tally

__all__ = ["Carry", "Session", "FileResult", "pair_file", "FIRST_SEQ", "FIRST_ONLINE", "FIRST_TS", "FIRST_REASON",
           "LAST_SEQ", "LAST_ONLINE", "LAST_TS", "RANGES", "SHORTS", "FIRST_DEVICE", "LAST_DEVICE", "FIRST_GRACE", "UNITS",
           "Unit", "unit_of", "UserSessions"]

# A closed or open session as it is written (`arrowwrite`): (daemon, uid_key, online_seq, online_ts,
# offline_seq, offline_ts, end_reason, device, end_device, end_grace); the offline fields, end_reason,
# end_device and end_grace are None for an open session. device: the online's; end_device: the device of the
# record that ended it; end_grace: the daemon's grace on the offline that ended it (not a column: `--grace`).
Session: TypeAlias = tuple[int, str, int, float, "int | None", "float | None", "str | None", "str | None", "str | None",
                           "float | None"]

# A uid's carry out of one file, a list indexed by these positions (a list: the hot loop updates it in place).
# UNITS: with a grace (`UserSessions`), None or the uid's first and last user sessions of the stream.
Carry: TypeAlias = list[Any]
(FIRST_SEQ, FIRST_ONLINE, FIRST_TS, FIRST_REASON, LAST_SEQ, LAST_ONLINE, LAST_TS, RANGES, SHORTS, FIRST_DEVICE,
 LAST_DEVICE, FIRST_GRACE, UNITS) = range(13)


@dataclass(slots=True)
class FileResult:
    """One file's pass: closed sessions, a carry per uid, lateness values, counters and the largest ts."""

    sessions: list[Session] = field(default_factory=list)
    carries: dict[str, Carry] = field(default_factory=dict)
    lateness: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # detector -> hour start -> values
    tally: Tally = field(default_factory=Tally)
    data_end: float | None = None


def pair_file(rows: Iterable[Row], short_s: float, result: FileResult | None = None,
              user_sessions: UserSessions | None = None) -> FileResult:
    """Pair the rows of one file (in file order, which is seq order when the file is a writer's), into
    `result` if given: the rows then continue the ones paired into it before, as the next file of a
    daemon's consecutive files continues the previous one. Sessions are appended to ``result.sessions``
    (a caller may take and clear them between files).

    The hot loop of the paired path (every record passes here): a closed session's contributions are
    `Tally.close` written out inline, which halves the loop's cost. With `user_sessions` (a grace), short
    sessions are not taken here but from the joined user sessions, after the loop.
    """
    if result is None:
        result = FileResult()
    sessions, carries, lateness, tally = result.sessions, result.carries, result.lateness, result.tally
    append = sessions.append
    floor, ceil = math.floor, math.ceil
    data_end = -math.inf if result.data_end is None else result.data_end
    superseded = orphans = 0
    closed_before = len(sessions)
    if user_sessions is not None:
        short_s = -math.inf  # no session is short: user sessions are (`UserSessions.add_closed`)
    for daemon, seq, online, key, ts, reason, deadline, detector, device, grace in rows:
        if ts > data_end:
            data_end = ts
        if deadline is not None:  # an idle offline (`records.to_row`): a lateness sample, orphan or not
            _add_lateness(lateness, detector, ts, deadline)
        carry = carries.get(key)
        if carry is None:
            carries[key] = [seq, online, ts, reason, seq, online, ts, [], [], device, device, grace, None]
            continue
        if carry[LAST_ONLINE]:
            start = carry[LAST_TS]
            if online:
                end_reason: str | None = SUPERSEDED
                superseded += 1
            else:
                end_reason = reason
            append((daemon, key, carry[LAST_SEQ], start, seq, ts, end_reason, carry[LAST_DEVICE], device, grace))
            # Tally.close(start, ts, end_reason, short_s, carry[RANGES], carry[SHORTS]), inline:
            first = floor(start / 60)
            last = ceil(ts / 60) - 1 if ts > start else first
            ranges = carry[RANGES]
            if ranges and first <= ranges[-1] + 1 and last >= ranges[-2] - 1:
                if first < ranges[-2]:
                    ranges[-2] = first
                if last > ranges[-1]:
                    ranges[-1] = last
            else:
                ranges += (first, last)
            if ts - start < short_s and end_reason not in NOT_USER_ENDS:
                carry[SHORTS].append(start)
        elif not online:
            orphans += 1
        carry[LAST_SEQ] = seq
        carry[LAST_ONLINE] = online
        carry[LAST_TS] = ts
        carry[LAST_DEVICE] = device
    tally.sessions += len(sessions) - closed_before
    if user_sessions is not None:
        user_sessions.add_closed(sessions, closed_before, carries, tally)
    tally.superseded += superseded
    tally.orphans += orphans
    if data_end > -math.inf:
        result.data_end = data_end
    return result


def _add_lateness(lateness: dict[str, dict[int, list[float]]], detector: str | None, ts: float, deadline: float) -> None:
    assert detector is not None  # `records.to_row` sets both or neither
    hours = lateness.get(detector)
    if hours is None:
        hours = lateness[detector] = {}
    hour = int(ts // 3600) * 3600
    values = hours.get(hour)
    if values is None:
        hours[hour] = [ts - deadline]
    else:
        values.append(ts - deadline)


# A user session being joined over a grace (`rules`, rule 6): [start, end ts, end_reason, joinable], joinable
# when its last session ended by a closed offline without the daemon's grace.
Unit: TypeAlias = list[Any]


def unit_of(start: float, end: float, end_reason: str | None, end_grace: float | None) -> Unit:
    return [start, end, end_reason, end_reason == CLOSED and end_grace is None]


@dataclass(frozen=True, slots=True)
class UserSessions:
    """Joining sessions into user sessions over a grace (`--grace`), for flappers and session_lengths.

    A stream's closed sessions of a uid come in seq order; each joins the user session before it when that one
    is joinable and it starts less than `grace` seconds after its end. Only a uid's first user session of the
    stream (something before the stream may join it) and its last (something after may) are unfinished: they
    stay in the carry (``UNITS``: [first] or [first, last]) for `userpass`; every one between is finished here
    -- counted into session_lengths (``Tally.lengths``) and, if short and user-ended, into the carry's short
    starts.
    """

    grace: float
    short_s: float

    def joins(self, unit: Unit, start: float) -> bool:
        return bool(unit[3]) and start - unit[1] < self.grace

    def finish(self, unit: Unit, tally: Tally, shorts: list[float]) -> None:
        """Count a closed user session: session_lengths by the day of its start, flappers if it is short."""
        start = unit[0]
        duration = unit[1] - start
        key = (int(start // 86400), bucket_index(duration))
        tally.lengths[key] = tally.lengths.get(key, 0) + 1
        if duration < self.short_s and unit[2] not in NOT_USER_ENDS:
            shorts.append(start)

    def add_closed(self, sessions: list[Session], first: int, carries: dict[str, Carry], tally: Tally) -> None:
        """The closed sessions ``sessions[first:]`` (in seq order per uid) into their carries' units."""
        for session in itertools.islice(sessions, first, None):
            carry = carries[session[1]]
            unit = unit_of(session[3], session[5], session[6], session[9])  # type: ignore[arg-type]
            units = carry[UNITS]
            if units is None:
                carry[UNITS] = [unit]
                continue
            last = units[-1]
            if self.joins(last, unit[0]):
                last[1:] = unit[1:]
            elif len(units) == 1:
                units.append(unit)
            else:
                self.finish(last, tally, carry[SHORTS])
                units[1] = unit
