"""The paired path's second pass: each user's carries joined across files and daemons, each detector's lateness.

Theory of operation
-------------------
`filepass` left, per (file, uid), a `Carry`: the uid's first and last record in the file and its in-file
contributions. All carries of a uid meet in one call of `finish_user` (the job hash-partitions them by
uid_key). Per daemon, sorted by first seq -- the daemon's files hold disjoint seq ranges, so this is the
uid's record order -- each carry's last record is followed by the next carry's first record: an online
there ends its session at that record (superseded if it is another online), an offline after an offline is
an orphan, and so is a daemon's very first record of the uid if it is an offline. An online at the end of
the last carry is open: it covers the minutes up to its daemon's data end. The user's minute ranges from
every carry and these sessions are merged into their union (`reference.merge_ranges`), which gives its +1/-1
per-minute changes for concurrency and its days for DAU; the starts of its short user-ended sessions give
its flappers rows (`reference.flapper_rows`).

With a grace (``--grace``), the user sessions are joined on: each carry's first and last unfinished user
session (`filepass.UserSessions`) and the sessions across file edges, fed in seq order to a `_Joiner`,
which counts each finished one into session_lengths and, if short, the flappers' starts; a user session
still open at the end is not counted.

Each detector's lateness values meet in one `finish_detector` call: the per-hour rows and the detector's
totals for the summary, exact, from sorted values (`reference.lateness_stats`).

`PartitionResult` holds what a partition of users and detectors adds up to; the driver merges them
(`PartitionResult.merge`) and builds the small tables with the reference's row builders. Everything here is
plain Python: the Spark job and the tests call the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from idled.pipeline.filepass import (
    FIRST_DEVICE, FIRST_GRACE, FIRST_ONLINE, FIRST_REASON, FIRST_SEQ, FIRST_TS, LAST_DEVICE, LAST_ONLINE, LAST_SEQ, LAST_TS,
    RANGES, SHORTS, UNITS, Carry, Session, Unit, UserSessions, unit_of,
)
from idled.pipeline.reference import flapper_rows, lateness_rows, lateness_stats, merge_ranges
from idled.pipeline.rules import SUPERSEDED, FlapParams
from idled.pipeline.tally import Tally

__all__ = ["PartitionResult", "finish_user", "finish_detector"]


@dataclass(slots=True)
class PartitionResult:
    """What one partition of users and detectors contributes; fields add under `merge`."""

    tally: Tally = field(default_factory=Tally)
    deltas: dict[int, int] = field(default_factory=dict)  # minute -> change in users online
    active: dict[int, int] = field(default_factory=dict)  # unix day -> distinct users online that day
    flappers: list[dict[str, Any]] = field(default_factory=list)
    lateness: list[dict[str, Any]] = field(default_factory=list)
    by_detector: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: PartitionResult) -> None:
        self.tally.merge(other.tally)
        for minute, d in other.deltas.items():
            self.deltas[minute] = self.deltas.get(minute, 0) + d
        for day, n in other.active.items():
            self.active[day] = self.active.get(day, 0) + n
        self.flappers.extend(other.flappers)
        self.lateness.extend(other.lateness)
        self.by_detector.extend(other.by_detector)


class _Joiner:
    """A daemon's user sessions of one uid over a grace (`filepass.UserSessions`), fed in seq order: the
    sessions across file edges and each carry's unfinished user sessions; finished ones are counted."""

    def __init__(self, rules: UserSessions, tally: Tally, shorts: list[float]) -> None:
        self.rules, self.tally, self.shorts = rules, tally, shorts
        self.current: Unit | None = None

    def feed(self, unit: Unit) -> None:
        current = self.current
        if current is not None and self.rules.joins(current, unit[0]):
            current[1:] = unit[1:]
        else:
            self.finish()
            self.current = list(unit)

    def finish(self) -> None:
        if self.current is not None:
            self.rules.finish(self.current, self.tally, self.shorts)
            self.current = None

    def feed_open(self, start: float) -> None:
        """The open session at the end: joined to the last user session, or after it; never counted."""
        if self.current is not None and self.rules.joins(self.current, start):
            self.current = None
        self.finish()


def _join_chain(daemon: int, key: str, chain: list[Carry], data_end: float, short_s: float, tally: Tally,
                ranges: list[int], shorts: list[float], sessions: list[Session], user_sessions: UserSessions | None) -> None:
    """One daemon's carries of a uid, in seq order: the sessions across file edges, orphans, the open one;
    with a grace, their user sessions joined and counted."""
    previous: Carry | None = None
    joiner = _Joiner(user_sessions, tally, shorts) if user_sessions is not None else None
    if joiner is not None:
        short_s = -math.inf  # short sessions are user sessions, counted by the joiner
    for carry in chain:
        online = carry[FIRST_ONLINE]
        if previous is not None and previous[LAST_ONLINE]:
            end_reason = SUPERSEDED if online else carry[FIRST_REASON]
            if online:
                tally.superseded += 1
            start = previous[LAST_TS]
            end_grace = None if online else carry[FIRST_GRACE]
            sessions.append((daemon, key, previous[LAST_SEQ], start, carry[FIRST_SEQ], carry[FIRST_TS], end_reason,
                             previous[LAST_DEVICE], carry[FIRST_DEVICE], end_grace))
            tally.close(start, carry[FIRST_TS], end_reason, short_s, ranges, shorts)
            if joiner is not None:
                joiner.feed(unit_of(start, carry[FIRST_TS], end_reason, end_grace))
        elif not online:
            tally.orphans += 1
        units = carry[UNITS]
        if joiner is not None and units:
            joiner.feed(units[0])
            if len(units) == 2:  # the stream's first user session ended before its last began
                joiner.finish()
                joiner.feed(units[1])
        previous = carry
    if previous is not None and previous[LAST_ONLINE]:
        sessions.append((daemon, key, previous[LAST_SEQ], previous[LAST_TS], None, None, None, previous[LAST_DEVICE], None,
                         None))
        tally.open(previous[LAST_TS], data_end, ranges)
        if joiner is not None:
            joiner.feed_open(previous[LAST_TS])
    if joiner is not None:
        joiner.finish()


def finish_user(key: str, carries: Iterable[tuple[int, Carry]], data_end: Mapping[int, float], params: FlapParams,
                result: PartitionResult, sessions: list[Session], user_sessions: UserSessions | None = None) -> None:
    """Every carry of user `key` (daemon, carry): its sessions across file edges go to `sessions`, the rest
    into `result`. `user_sessions`: the grace (`filepass.UserSessions`), or None for none."""
    chains: dict[int, list[Carry]] = {}
    for daemon, carry in carries:
        chains.setdefault(daemon, []).append(carry)
    ranges: list[int] = []
    shorts: list[float] = []
    for daemon, chain in chains.items():
        chain.sort(key=lambda c: c[FIRST_SEQ])
        _join_chain(daemon, key, chain, data_end[daemon], params.short_s, result.tally, ranges, shorts, sessions,
                    user_sessions)
        for carry in chain:
            ranges.extend(carry[RANGES])
            shorts.extend(carry[SHORTS])
    if ranges:
        deltas, active = result.deltas, result.active
        days: set[int] = set()
        for lo, hi in merge_ranges(list(zip(ranges[::2], ranges[1::2]))):
            deltas[lo] = deltas.get(lo, 0) + 1
            deltas[hi + 1] = deltas.get(hi + 1, 0) - 1
            days.update(range(lo // 1440, hi // 1440 + 1))
        for day in days:
            active[day] = active.get(day, 0) + 1
    if len(shorts) >= params.k:
        result.flappers.extend(flapper_rows(key, shorts, params))


def finish_detector(detector: str, pieces: Iterable[Mapping[int, list[float]]], result: PartitionResult) -> None:
    """Every file's lateness values of `detector` (hour start -> values): its lateness rows and totals."""
    hours: dict[tuple[str, int], list[float]] = {}
    every: list[float] = []
    for piece in pieces:
        for hour, values in piece.items():
            hours.setdefault((detector, hour), []).extend(values)
            every.extend(values)
    result.lateness.extend(lateness_rows(hours))
    if every:
        result.by_detector.append({"detector": detector, **lateness_stats(every)})
