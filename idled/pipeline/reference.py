"""Pure-Python reference for the pipeline: the rules of `idled.pipeline.rules`, written plainly.

It decodes with the same `records.iter_rows` (so both see the same events) and computes every table with
dicts and sorted lists, no Spark. Tests compare the Spark job's Parquet output with it; at a few hundred
thousand events it is also a usable tool on its own. Rows are dicts keyed by the output column names, with
``date`` a `datetime.date`.
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from idled.pipeline.records import FileStats, Row, iter_rows, split_uid_key
from idled.pipeline.rules import (
    BUCKETS,
    CLOSED,
    NOT_USER_ENDS,
    SUPERSEDED,
    FlapParams,
    bucket_index,
    bucket_label,
    day_range,
    minute_range,
    percentile,
    unix_date,
)

__all__ = [
    "Result", "load_dirs", "compute", "run_reference", "segment_files", "merge_grace", "joins_within_grace", "merge_ranges", "concurrency_rows",
    "lateness_stats", "lateness_rows", "flapper_rows", "dau_rows", "session_length_rows",
]

TableRows = list[dict[str, Any]]


@dataclass
class Result:
    tables: dict[str, TableRows]
    counts: dict[str, int] = field(default_factory=dict)


def segment_files(directory: str) -> list[str]:
    """Every *.seg file in `directory`, in no particular order (pairing never relies on file order)."""
    return [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".seg")]


def load_dirs(dirs: Sequence[str]) -> tuple[list[Row], dict[str, FileStats]]:
    """Rows of every segment of every daemon directory (daemon = index in `dirs`), and stats per file."""
    rows: list[Row] = []
    stats: dict[str, FileStats] = {}
    for daemon, directory in enumerate(dirs):
        for path in segment_files(directory):
            with open(path, "rb") as file:
                data = file.read()
            file_stats = FileStats()
            # The daemon's decoder alone (not `fastdecode`): the job's tables are compared with these.
            rows.extend(iter_rows(data, daemon, file_stats, fast=False))
            stats[path] = file_stats
    return rows, stats


def _date(ts: float) -> Any:
    return unix_date(int(ts // 86400))


def compute(rows: Iterable[Row], daemon_names: Sequence[str], params: FlapParams = FlapParams(), grace: float = 0.0) -> Result:
    """Every table from decoded rows; `grace` (seconds, rule 6 of `idled.pipeline.rules`) merges sessions for
    flappers and session_lengths."""
    by_uid: dict[tuple[int, str], list[Row]] = defaultdict(list)
    data_end: dict[int, float] = {}
    events = 0
    for row in rows:
        events += 1
        by_uid[(row[0], row[3])].append(row)
        if row[4] > data_end.get(row[0], float("-inf")):
            data_end[row[0]] = row[4]

    duplicates = orphans = superseded = 0
    sessions: TableRows = []
    lateness_values: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (daemon, key), uid_rows in by_uid.items():
        uid_rows.sort(key=lambda r: r[1])
        unique: list[Row] = []
        for row in uid_rows:
            if unique and unique[-1][1] == row[1]:
                duplicates += 1
            else:
                unique.append(row)
        uid, uid_type = split_uid_key(key)
        for i, row in enumerate(unique):
            _, seq, online, _, ts, reason, deadline, detector, device, _ = row
            if not online:
                if i == 0 or not unique[i - 1][2]:
                    orphans += 1
                if reason == "idle" and deadline is not None:
                    assert detector is not None  # records.to_row gives every idle offline a detector
                    lateness_values[(detector, int(ts // 3600) * 3600)].append(ts - deadline)
                continue
            nxt = unique[i + 1] if i + 1 < len(unique) else None
            if nxt is None:
                offline_seq = offline_ts = duration = end_reason = end_device = end_grace = None
                end = data_end[daemon]
            else:
                offline_seq, offline_ts, end_device, end_grace = nxt[1], nxt[4], nxt[8], nxt[9]
                end = offline_ts
                duration = offline_ts - ts
                if nxt[2]:
                    end_reason = SUPERSEDED
                    superseded += 1
                else:
                    end_reason = nxt[5]
            sessions.append({
                "date": _date(ts), "daemon": daemon_names[daemon], "uid": uid, "uid_type": uid_type,
                "online_seq": seq, "online_ts": ts, "offline_seq": offline_seq, "offline_ts": offline_ts,
                "duration_s": duration, "end_reason": end_reason, "open": nxt is None,
                "device": device, "end_device": end_device,
                "_key": key, "_end": max(end, ts), "_daemon": daemon, "_grace": end_grace,
            })

    merged = merge_grace(sessions, grace) if grace > 0 else sessions
    tables = {
        "concurrency": _concurrency(sessions),
        "lateness": lateness_rows(lateness_values),
        "flappers": _flappers(merged, params),
        "dau": _dau(sessions),
        "session_lengths": _session_lengths(merged),
    }
    open_sessions = sum(1 for s in sessions if s["open"])
    for s in sessions:
        del s["_key"], s["_end"], s["_daemon"], s["_grace"]
    tables["sessions"] = sessions
    counts = {
        "events": events, "duplicates": duplicates, "sessions": len(sessions), "open_sessions": open_sessions,
        "orphans": orphans, "superseded": superseded,
    }
    return Result(tables, counts)


def merge_grace(sessions: TableRows, grace: float) -> TableRows:
    """The user sessions of rule 6 of `idled.pipeline.rules` (grace): a daemon's consecutive sessions of a uid
    joined where the first ended by a ``closed`` offline without the daemon's ``grace`` and the next started
    less than `grace` seconds after it. Each keeps the first one's start and the last one's end (online_ts,
    duration_s, end_reason, open; what flappers and session_lengths read)."""
    chains: dict[tuple[int, str], TableRows] = defaultdict(list)
    for s in sessions:
        chains[(s["_daemon"], s["_key"])].append(s)
    merged: TableRows = []
    for chain in chains.values():
        chain.sort(key=lambda s: s["online_seq"])
        current: dict[str, Any] | None = None
        for s in chain:
            if current is not None and joins_within_grace(current, s["online_ts"], grace):
                current.update(offline_ts=s["offline_ts"], end_reason=s["end_reason"], open=s["open"], _grace=s["_grace"])
                current["duration_s"] = None if s["open"] else s["offline_ts"] - current["online_ts"]
                continue
            current = {k: s[k] for k in ("_key", "online_ts", "offline_ts", "duration_s", "end_reason", "open", "_grace")}
            merged.append(current)
    return merged


def joins_within_grace(session: dict[str, Any], next_start: float, grace: float) -> bool:
    """Rule 6 of `idled.pipeline.rules` (grace): does the session starting at `next_start` continue `session`
    (the one before it)?"""
    return (session["end_reason"] == CLOSED and session["_grace"] is None and not session["open"]
            and next_start - session["offline_ts"] < grace)


def merge_ranges(ranges: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The union of one user's inclusive integer ranges, as disjoint ranges in order (sorts `ranges`)."""
    ranges.sort()
    lo, hi = ranges[0]
    for a, b in ranges[1:]:
        if a > hi:
            yield lo, hi
            lo, hi = a, b
        elif b > hi:
            hi = b
    yield lo, hi


def _concurrency(sessions: TableRows) -> TableRows:
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for s in sessions:
        spans[s["_key"]].append(minute_range(s["online_ts"], s["_end"]))
    delta: dict[int, int] = defaultdict(int)
    for user_spans in spans.values():
        for lo, hi in merge_ranges(user_spans):
            delta[lo] += 1
            delta[hi + 1] -= 1
    return concurrency_rows(delta)


def concurrency_rows(delta: dict[int, int]) -> TableRows:
    """The concurrency table from per-minute changes (+1 where a user's merged range starts, -1 after it ends)."""
    if not delta:
        return []
    out = []
    users = 0
    last = max(delta) - 1  # the final delta only brings the count back to 0
    for minute in range(min(delta), last + 1):
        users += delta.get(minute, 0)
        out.append({"date": unix_date(minute * 60 // 86400), "minute_start": minute * 60, "users_online": users})
    return out


def lateness_stats(lateness: list[float]) -> dict[str, Any]:
    """offlines, early, p50_s, p99_s, max_s of one group's values (sorts them)."""
    lateness.sort()
    return {
        "offlines": len(lateness), "early": sum(1 for v in lateness if v < 0), "p50_s": percentile(lateness, 0.5),
        "p99_s": percentile(lateness, 0.99), "max_s": lateness[-1],
    }


def lateness_rows(values: dict[tuple[str, int], list[float]]) -> TableRows:
    """The lateness table from the values of each (detector, hour start)."""
    return [
        {"date": _date(hour), "hour_start": hour, "detector": detector, **lateness_stats(lateness)}
        for (detector, hour), lateness in values.items()
    ]


def _flappers(sessions: TableRows, params: FlapParams) -> TableRows:
    starts: dict[str, list[float]] = defaultdict(list)
    for s in sessions:
        if not s["open"] and s["duration_s"] < params.short_s and s["end_reason"] not in NOT_USER_ENDS:
            starts[s["_key"]].append(s["online_ts"])
    out: TableRows = []
    for key, ts_list in starts.items():
        out.extend(flapper_rows(key, ts_list, params))
    return out


def flapper_rows(key: str, ts_list: list[float], params: FlapParams) -> TableRows:
    """One user's flappers rows from the starts of their short user-ended sessions (sorts `ts_list`)."""
    ts_list.sort()
    per_day: dict[Any, dict[str, Any]] = {}
    for t in ts_list:
        day = _date(t)
        in_window = bisect.bisect_right(ts_list, t) - bisect.bisect_left(ts_list, t - params.window_s)
        row = per_day.get(day)
        if row is None:
            row = per_day[day] = {"short_sessions": 0, "max_in_window": 0, "first_flagged_ts": None}
        row["short_sessions"] += 1
        if in_window >= params.k:
            row["max_in_window"] = max(row["max_in_window"], in_window)
            if row["first_flagged_ts"] is None:
                row["first_flagged_ts"] = t
    uid, uid_type = split_uid_key(key)
    return [{"date": day, "uid": uid, "uid_type": uid_type, **row} for day, row in per_day.items() if row["first_flagged_ts"] is not None]


def _dau(sessions: TableRows) -> TableRows:
    users: dict[int, set[str]] = defaultdict(set)
    started: dict[int, int] = defaultdict(int)
    for s in sessions:
        first, last = day_range(s["online_ts"], s["_end"])
        for day in range(first, last + 1):
            users[day].add(s["_key"])
        started[first] += 1
    return dau_rows({day: len(keys) for day, keys in users.items()}, started)


def dau_rows(active: dict[int, int], started: dict[int, int]) -> TableRows:
    """The dau table from distinct users and sessions started per unix day."""
    return [
        {"date": unix_date(day), "active_users": n, "sessions_started": started.get(day, 0)}
        for day, n in active.items()
    ]


def _session_lengths(sessions: TableRows) -> TableRows:
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for s in sessions:
        if not s["open"]:
            counts[(int(s["online_ts"] // 86400), bucket_index(s["duration_s"]))] += 1
    return session_length_rows(counts)


def session_length_rows(counts: dict[tuple[int, int], int]) -> TableRows:
    """The session_lengths table from closed sessions per (unix day of the start, bucket index)."""
    out = []
    for (day, index), n in counts.items():
        out.append({
            "date": unix_date(day), "bucket": index, "label": bucket_label(index), "lo_s": BUCKETS[index],
            "hi_s": BUCKETS[index + 1] if index + 1 < len(BUCKETS) else None, "sessions": n,
        })
    return out


def run_reference(dirs: Sequence[str], params: FlapParams = FlapParams(),
                  grace: float = 0.0) -> tuple[Result, dict[str, FileStats]]:
    """Decode `dirs` and compute every table; daemon names are the directories' absolute paths."""
    rows, stats = load_dirs(dirs)
    names = [os.path.abspath(d) for d in dirs]
    return compute(rows, names, params, grace), stats
