"""Incremental runs on the paired path: each table's new rows for one batch, in Python (numpy, pyarrow).

Theory of operation
-------------------
The same computation as `refresh` (read there why each table needs what it reads), without Spark: the
batch B -- the new sessions and every session open at the end of the previous run, closed by now or still
open -- arrives as columns (`Batch`), and the few old rows each table needs are read with pyarrow from the
date partitions they live in. `change_of` finds where B changes the tables (the days, the hours, the first
minute whose concurrency can change); `table_rows` builds the rows of those partitions:

* session_lengths -- the stored counts of B's closed sessions' start days plus B's;
* lateness -- the hours with new values, recomputed from the stored values of those hours plus the new
  ones (`reference.lateness_rows`), the other hours' rows kept;
* concurrency -- from minute ``low`` on, from the sessions reaching it: B's, the closed ones in ``--out``
  from ``low``'s day on that end at or after ``low`` (the sessions files are sorted by offline time, so the
  filtered scan skips nearly every row group), the stored midnight-crossing ones of earlier days; each
  clipped to start at ``low``, merged per user into the union of its minutes (`_union_deltas`: a sort and a
  running maximum, vectorised), +1/-1 at each range's ends, a running sum;
* dau -- distinct users per day from the state's ``active_users`` plus B's; sessions started, the stored
  count plus B's sessions that were not carried;
* flappers -- the stored short sessions of the flap days and one window before, plus B's
  (`reference.flapper_rows`);
* and the state tables: ``active_users`` of the days B's closed sessions cover, B's lateness values and
  short sessions (added as files).

A user here is its uid_key (``i:42``, ``s:42``), as everywhere in the paired path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from idled.pipeline.reference import dau_rows, flapper_rows, lateness_rows, session_length_rows
from idled.pipeline.rules import BUCKETS, NOT_USER_ENDS, FlapParams, unix_date

__all__ = ["Batch", "Change", "change_of", "table_rows", "read_partitions", "key_of"]

_DAY: Final = 86400
_MINUTE: Final = 60
_BUCKETS: Final = np.array(BUCKETS)
Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


def _span(start: Floats, end: Floats, unit: int) -> tuple[Ints, Ints]:
    """`pairing.span` on arrays: the first and last unit index [start, end) touches."""
    first = np.floor(start / unit).astype(np.int64)
    last = np.where(end > start, np.ceil(end / unit).astype(np.int64) - 1, first)
    return first, last


@dataclass
class Batch:
    """B as columns: every session of the batch, closed or open (``end`` of an open one: its daemon's data
    end; ``old_end`` of a carried one: where the previous run had it end, NaN for the others)."""

    keys: list[str]  # uid_key
    start: Floats
    end: Floats  # max(offline_ts or the data end, start)
    duration: Floats  # offline_ts - start; NaN while open
    is_open: Bools
    carried: Bools
    user_end: Bools  # not ended by a restart, a shutdown or a login elsewhere
    old_end: Floats
    lateness: dict[tuple[str, int], list[float]]  # B's new lateness values per (detector, hour start)

    def __post_init__(self) -> None:
        self.m0, self.m1 = _span(self.start, self.end, _MINUTE)
        self.d0, self.d1 = _span(self.start, self.end, _DAY)


@dataclass
class Change:
    """Where B changes the tables (as `refresh.Change`), and the timeline's new extent."""

    closed_days: set[int]
    active_days: set[int]
    flap_days: set[int]
    low: int | None
    cover_days: set[int]
    hours: list[int]
    first_minute: int | None
    closed_last_minute: int | None
    last_minute: int | None


def _days_of(first: Ints, last: Ints) -> set[int]:
    days: set[int] = set()
    for a, b in set(zip(first.tolist(), last.tolist())):
        days.update(range(a, b + 1))
    return days


def _short(batch: Batch, flap: FlapParams) -> Bools:
    """B's sessions flappers count: closed, short, ended by the user."""
    return ~batch.is_open & (np.nan_to_num(batch.duration, nan=np.inf) < flap.short_s) & batch.user_end


def _min(values: npt.NDArray[Any]) -> int | None:
    return int(values.min()) if len(values) else None


def _max(values: npt.NDArray[Any]) -> int | None:
    return int(values.max()) if len(values) else None


def change_of(batch: Batch, flap: FlapParams, state: dict[str, Any]) -> Change:
    """What B changes, given the state before it (``first_minute``, ``closed_last_minute``, ``last_minute``)."""
    closed = ~batch.is_open
    old_first, old_closed_last, old_last = state["first_minute"], state["closed_last_minute"], state["last_minute"]
    first = min((x for x in (old_first, _min(batch.m0)) if x is not None), default=None)
    closed_last = max((x for x in (old_closed_last, _max(batch.m1[closed])) if x is not None), default=None)
    last = max((x for x in (closed_last, _max(batch.m1)) if x is not None), default=None)
    # a carried session whose end moved changes the minutes from the earlier of its two ends on
    moved = batch.carried & (batch.old_end != batch.end) & ~np.isnan(batch.old_end)
    moved_from = np.floor(np.minimum(batch.old_end[moved], batch.end[moved]) / _MINUTE).astype(np.int64)
    candidates = [x for x in (_min(batch.m0[~batch.carried]), _min(moved_from),
                              None if old_last is None else old_last + 1) if x is not None]
    low = min(candidates) if candidates else None
    high = max((x for x in (last, old_last) if x is not None), default=None)
    cover = set(range(low * _MINUTE // _DAY, high * _MINUTE // _DAY + 1)) if low is not None and high is not None else set()
    short = _short(batch, flap)
    flap_last = np.floor((batch.start[short] + flap.window_s) / _DAY).astype(np.int64)
    return Change(
        closed_days=set(batch.d0[closed].tolist()), active_days=_days_of(batch.d0[closed], batch.d1[closed]),
        flap_days=_days_of(batch.d0[short], flap_last), low=low, cover_days=cover,
        hours=sorted({hour for _, hour in batch.lateness}), first_minute=first, closed_last_minute=closed_last,
        last_minute=last,
    )


def date_strings(days: Iterable[int]) -> list[str]:
    return sorted(str(unix_date(d)) for d in days)


def read_partitions(table: str, dates: Iterable[str], columns: Sequence[str], where: Any = None) -> dict[str, Any]:
    """date -> the pyarrow table of that date partition of `table` (only those that exist), `columns` only,
    filtered by the pyarrow expression `where` (row groups it excludes by their statistics are not read)."""
    import pyarrow.dataset as ds

    found = {}
    for date in dates:
        path = os.path.join(table, f"date={date}")
        if os.path.isdir(path):
            found[date] = ds.dataset(path, format="parquet").to_table(columns=list(columns), filter=where)
    return found


def key_of(uid: Sequence[str], uid_type: Sequence[str]) -> list[str]:
    """uid_key from the sessions table's uid columns."""
    return [("i:" if kind == "int" else "s:") + text for text, kind in zip(uid, uid_type)]


def _session_lengths(batch: Batch, out: str, days: set[int]) -> list[dict[str, Any]]:
    closed = ~batch.is_open
    counts: dict[tuple[int, int], int] = {}
    buckets = np.maximum(np.searchsorted(_BUCKETS, batch.duration[closed], side="right") - 1, 0)
    for key in zip(np.floor_divide(batch.start[closed], _DAY).astype(np.int64).tolist(), buckets.tolist()):
        counts[key] = counts.get(key, 0) + 1
    for date, rows in read_partitions(os.path.join(out, "session_lengths"), date_strings(days), ["bucket", "sessions"]).items():
        day = _unix_day(date)
        for bucket, n in zip(rows["bucket"].to_pylist(), rows["sessions"].to_pylist()):
            counts[(day, bucket)] = counts.get((day, bucket), 0) + n
    return session_length_rows(counts)


def _unix_day(date: str) -> int:
    import datetime as dt

    return (dt.date.fromisoformat(date) - dt.date(1970, 1, 1)).days


def _lateness(batch: Batch, out: str, state_dir: str, hours: list[int]) -> list[dict[str, Any]]:
    from idled.pipeline.refresh import LATENESS_VALUES

    wanted = set(hours)
    values: dict[tuple[str, int], list[float]] = {k: list(v) for k, v in batch.lateness.items()}
    dates = date_strings({h // _DAY for h in hours})
    import pyarrow.dataset as ds

    where = ds.field("hour_start").isin([float(h) for h in hours])
    for stored in read_partitions(os.path.join(state_dir, LATENESS_VALUES), dates, ["detector", "hour_start", "lateness"],
                                  where).values():
        for detector, hour, value in zip(*(stored[c].to_pylist() for c in ("detector", "hour_start", "lateness"))):
            values.setdefault((detector, int(hour)), []).append(value)
    rows = lateness_rows(values)
    for date, kept in read_partitions(os.path.join(out, "lateness"), dates,
                                      ["hour_start", "detector", "offlines", "early", "p50_s", "p99_s", "max_s"]).items():
        day = unix_date(_unix_day(date))
        rows += [{"date": day, **row} for row in kept.to_pylist() if int(row["hour_start"]) not in wanted]
    return rows


def _union_deltas(users: Ints, m0: Ints, m1: Ints) -> tuple[Ints, Ints]:
    """Per user the union of its minute ranges, as (minutes where a merged range starts, minutes after one
    ends): sorted by (user, m0), a range starts a new merged range when its m0 is past the running maximum
    of the user's earlier m1 (offset by the user's number so the maximum restarts at each user)."""
    if not len(users):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.lexsort((m1, m0, users))
    u, a, b = users[order], m0[order], m1[order]
    offset = u * (1 << 32)
    running = np.maximum.accumulate(b + offset) - offset  # the user's largest m1 so far (within the user)
    new_user = np.r_[True, u[1:] != u[:-1]]
    starts = new_user | (a > np.r_[0, running[:-1]])
    ends_at = np.r_[np.flatnonzero(starts)[1:], len(u)] - 1  # each merged range's last member
    return a[starts], running[ends_at] + 1


def _concurrency(batch: Batch, out: str, spanning: Any, low: int, last: int) -> list[dict[str, Any]]:
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    since = float(low * _MINUTE)
    reach = batch.m1 >= low
    keys = [k for k, r in zip(batch.keys, reach.tolist()) if r]
    starts, ends = [batch.start[reach]], [batch.end[reach]]
    table = os.path.join(out, "sessions")
    first_date = str(unix_date(low * _MINUTE // _DAY))
    dates = sorted(n[5:] for n in os.listdir(table) if n.startswith("date=") and n[5:] >= first_date) if os.path.isdir(table) else []
    where = ~ds.field("open") & ((ds.field("offline_ts") >= since) | (ds.field("online_ts") >= since))
    for stored in read_partitions(table, dates, ["uid", "uid_type", "online_ts", "offline_ts"], where).values():
        keys += key_of(stored["uid"].to_pylist(), stored["uid_type"].to_pylist())
        online = stored["online_ts"].to_numpy()
        starts.append(online)
        ends.append(np.maximum(stored["offline_ts"].to_numpy(), online))
    if spanning is not None and spanning.num_rows:
        earlier = pc.less(pc.floor(pc.divide(spanning["online_ts"], float(_DAY))), float(low * _MINUTE // _DAY))
        old = spanning.filter(earlier)
        keys += old["uid_key"].to_pylist()
        starts.append(old["online_ts"].to_numpy())
        ends.append(old["end"].to_numpy())
    start, end = np.concatenate(starts), np.concatenate(ends)
    clipped = np.maximum(start, since)
    m0, m1 = _span(clipped, end, _MINUTE)
    keep = _span(start, end, _MINUTE)[1] >= low
    import pyarrow as pa

    users = pa.array(keys, pa.string()).dictionary_encode().indices.to_numpy().astype(np.int64)[keep]
    up, down = _union_deltas(users, m0[keep], m1[keep])
    size = last - low + 1
    if size <= 0:
        return []
    delta = np.bincount(up - low, minlength=size + 1)[: size + 1] - np.bincount(np.minimum(down - low, size), minlength=size + 1)[: size + 1]
    counts = np.cumsum(delta[:size])
    minutes = np.arange(low, last + 1)
    return [{"date": unix_date(m * _MINUTE // _DAY), "minute_start": m * _MINUTE, "users_online": n}
            for m, n in zip(minutes.tolist(), counts.tolist())]


def _kept_concurrency(out: str, days: set[int], low: int) -> list[dict[str, Any]]:
    rows = []
    for date, kept in read_partitions(os.path.join(out, "concurrency"), date_strings(days), ["minute_start", "users_online"]).items():
        day = unix_date(_unix_day(date))
        rows += [{"date": day, **row} for row in kept.to_pylist() if row["minute_start"] < low * _MINUTE]
    return rows


def _day_users(batch: Batch, mask: Bools, days: set[int]) -> dict[int, Any]:
    """The distinct uid_keys (a pyarrow array) per day in `days` of the sessions in `mask`, over the days each
    covers; with the state's (`_stored_users`) added by `_union`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = pa.array(batch.keys, pa.string())
    users = {}
    for day in days:
        covers = mask & (batch.d0 <= day) & (batch.d1 >= day)
        users[day] = pc.unique(keys.filter(pa.array(covers)))
    return users


def _stored_users(state_dir: str, days: set[int]) -> dict[int, Any]:
    from idled.pipeline.refresh import ACTIVE_USERS

    return {_unix_day(date): rows["uid_key"].combine_chunks()
            for date, rows in read_partitions(os.path.join(state_dir, ACTIVE_USERS), date_strings(days), ["uid_key"]).items()}


def _union(users: dict[int, Any], stored: dict[int, Any]) -> dict[int, Any]:
    import pyarrow as pa
    import pyarrow.compute as pc

    return {day: pc.unique(pa.concat_arrays([keys, stored[day]])) if day in stored else keys for day, keys in users.items()}


def _dau(batch: Batch, out: str, state_dir: str, days: set[int]) -> list[dict[str, Any]]:
    active = _union(_day_users(batch, np.ones(len(batch.keys), bool), days), _stored_users(state_dir, days))
    started: dict[int, int] = {}
    for day in batch.d0[~batch.carried].tolist():
        started[day] = started.get(day, 0) + 1
    for date, rows in read_partitions(os.path.join(out, "dau"), date_strings(days), ["sessions_started"]).items():
        day = _unix_day(date)
        started[day] = started.get(day, 0) + sum(rows["sessions_started"].to_pylist())
    return dau_rows({day: len(users) for day, users in active.items() if len(users)}, started)


def _flappers(batch: Batch, state_dir: str, flap: FlapParams, days: set[int]) -> list[dict[str, Any]]:
    from idled.pipeline.refresh import SHORT_SESSIONS

    back = -(-flap.window_s // _DAY)
    starts: dict[str, list[float]] = {}
    short = _short(batch, flap)
    for key, start in zip((k for k, s in zip(batch.keys, short.tolist()) if s), batch.start[short].tolist()):
        starts.setdefault(key, []).append(start)
    read = date_strings(range(min(days) - back, max(days) + 1))
    for stored in read_partitions(os.path.join(state_dir, SHORT_SESSIONS), read, ["uid_key", "online_ts"]).values():
        for key, start in zip(stored["uid_key"].to_pylist(), stored["online_ts"].to_pylist()):
            starts.setdefault(key, []).append(start)
    wanted = {unix_date(d) for d in days}
    return [row for key, values in starts.items() if len(values) >= flap.k
            for row in flapper_rows(key, values, flap) if row["date"] in wanted]


def _active_users(batch: Batch, state_dir: str, days: set[int]) -> Any:
    """The state's active users of `days` with B's closed sessions' added: a pyarrow table (uid_key, date)."""
    import pyarrow as pa

    users = _union(_day_users(batch, ~batch.is_open, days), _stored_users(state_dir, days))
    parts = [pa.table({"uid_key": keys, "date": pa.array([unix_date(day)] * len(keys), pa.date32())})
             for day, keys in sorted(users.items())]
    return pa.concat_tables(parts)


def table_rows(batch: Batch, change: Change, out: str, state_dir: str, spanning: Any,
               flap: FlapParams) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The rows of every replaced table's changed partitions, and which dates each replaces (a date absent
    from its rows is deleted). `spanning`: the stored midnight-crossing sessions (pyarrow, or None)."""
    from idled.pipeline.refresh import ACTIVE_USERS

    rows: dict[str, Any] = {}  # rows as dicts; the state's active users as a pyarrow table (~100k a day)
    dates = {
        "session_lengths": date_strings(change.closed_days), "flappers": date_strings(change.flap_days),
        "dau": date_strings(change.cover_days), "concurrency": date_strings(change.cover_days),
        "lateness": date_strings({h // _DAY for h in change.hours}), ACTIVE_USERS: date_strings(change.active_days),
    }
    if change.closed_days:
        rows["session_lengths"] = _session_lengths(batch, out, change.closed_days)
        rows[ACTIVE_USERS] = _active_users(batch, state_dir, change.active_days)
    if change.flap_days:
        rows["flappers"] = _flappers(batch, state_dir, flap, change.flap_days)
    if change.cover_days and change.low is not None and change.last_minute is not None:
        rows["dau"] = _dau(batch, out, state_dir, change.cover_days)
        rows["concurrency"] = _kept_concurrency(out, change.cover_days, change.low) + \
            _concurrency(batch, out, spanning, change.low, change.last_minute)
    if change.hours:
        rows["lateness"] = _lateness(batch, out, state_dir, change.hours)
    return rows, dates


def user_ended(end_reasons: Sequence[str | None]) -> Bools:
    return np.array([reason is None or reason not in NOT_USER_ENDS for reason in end_reasons], dtype=bool)
