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

Lateness values are gathered per (detector, hour) -- exact percentiles need every value of a group, which
`userpass` gets by collecting one detector's groups from every file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from idled.pipeline.records import Row
from idled.pipeline.rules import NOT_USER_ENDS, SUPERSEDED
from idled.pipeline.tally import Tally

__all__ = ["Carry", "Session", "FileResult", "pair_file", "FIRST_SEQ", "FIRST_ONLINE", "FIRST_TS", "FIRST_REASON",
           "LAST_SEQ", "LAST_ONLINE", "LAST_TS", "RANGES", "SHORTS", "FIRST_DEVICE", "LAST_DEVICE"]

# A closed or open session as it is written (`arrowwrite`): (daemon, uid_key, online_seq, online_ts,
# offline_seq, offline_ts, end_reason, device, end_device); the offline fields, end_reason and end_device are
# None for an open session. device: the online's; end_device: the device of the record that ended it.
Session: TypeAlias = tuple[int, str, int, float, "int | None", "float | None", "str | None", "str | None", "str | None"]

# A uid's carry out of one file, a list indexed by these positions (a list: the hot loop updates it in place).
Carry: TypeAlias = list[Any]
FIRST_SEQ, FIRST_ONLINE, FIRST_TS, FIRST_REASON, LAST_SEQ, LAST_ONLINE, LAST_TS, RANGES, SHORTS, FIRST_DEVICE, LAST_DEVICE = range(11)


@dataclass(slots=True)
class FileResult:
    """One file's pass: closed sessions, a carry per uid, lateness values, counters and the largest ts."""

    sessions: list[Session] = field(default_factory=list)
    carries: dict[str, Carry] = field(default_factory=dict)
    lateness: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # detector -> hour start -> values
    tally: Tally = field(default_factory=Tally)
    data_end: float | None = None


def pair_file(rows: Iterable[Row], short_s: float, result: FileResult | None = None) -> FileResult:
    """Pair the rows of one file (in file order, which is seq order when the file is a writer's), into
    `result` if given: the rows then continue the ones paired into it before, as the next file of a
    daemon's consecutive files continues the previous one. Sessions are appended to ``result.sessions``
    (a caller may take and clear them between files).

    The hot loop of the paired path (every record passes here): a closed session's contributions are
    `Tally.close` written out inline, which halves the loop's cost.
    """
    if result is None:
        result = FileResult()
    sessions, carries, lateness, tally = result.sessions, result.carries, result.lateness, result.tally
    append = sessions.append
    floor, ceil = math.floor, math.ceil
    data_end = -math.inf if result.data_end is None else result.data_end
    superseded = orphans = 0
    closed_before = len(sessions)
    for daemon, seq, online, key, ts, reason, deadline, detector, device, _grace in rows:
        if ts > data_end:
            data_end = ts
        if deadline is not None:  # an idle offline (`records.to_row`): a lateness sample, orphan or not
            _add_lateness(lateness, detector, ts, deadline)
        carry = carries.get(key)
        if carry is None:
            carries[key] = [seq, online, ts, reason, seq, online, ts, [], [], device, device]
            continue
        if carry[LAST_ONLINE]:
            start = carry[LAST_TS]
            if online:
                end_reason: str | None = SUPERSEDED
                superseded += 1
            else:
                end_reason = reason
            append((daemon, key, carry[LAST_SEQ], start, seq, ts, end_reason, carry[LAST_DEVICE], device))
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
