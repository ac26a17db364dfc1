"""Incremental runs: process only the log written since the last run, rewrite only the dates that changed.

Theory of operation
-------------------
The tables of a full run are functions of the *sessions* (plus the idle offlines' lateness values), and a
closed session never changes once its offline is seen. So a run needs the new records, the sessions still
open at the end of the previous run, and -- to recompute a day's derived rows -- the closed sessions that
touch that day. The state directory (``--state DIR``) holds exactly that:

* ``state.json`` -- the inputs (daemon directories, in order), the flap parameters and ``--out`` it was made
  with; per daemon its largest seq and ts seen (the seq *watermark* and the data end) and per segment file
  ``consumed`` (bytes decoded: the file's size minus its torn tail) and its counters; cumulative counts;
  the first minute and the last closed-session minute of the concurrency timeline.
* ``gen-N/open`` -- open sessions (daemon, uid_key, seq, ts): they re-enter the next run as online records.
* ``gen-N/spanning`` -- closed sessions that cross a UTC midnight: the only closed sessions that cover a
  day other than their own ``date`` partition.
* ``lateness`` -- the lateness values, partitioned by date (exact percentiles need every value of an hour).

A run decodes each new file from byte 0 and each grown file from its ``consumed`` offset (a record
boundary: the torn tail of the last run is decoded again, complete by now), drops records at or below the
daemon's watermark (a re-copied old segment: counted as duplicates), adds the carried open sessions as
online records, and pairs them exactly as a full run does (`pairing.pair`). That gives the *batch*
sessions B: the new ones, and the carried ones now closed or still open. Since every old open session is
in B and old closed rows never change, every table's day D is recomputed from

    old closed sessions of D's partition  +  old spanning sessions reaching D  +  B

for the days B touches: sessions and session_lengths, the dates of B's starts; flappers, each short
session's date up to the date one flap window later (reading one window of days back); dau and
concurrency, the days a session's coverage changed (a carried session: between its old end, the previous
data end, and its new one) and those the timeline's extent moved over; lateness, the days of the new
values. Everything is staged under ``state/staging``; a journal (``journal.json``: the partition moves and
the new state) is written atomically before any output partition is replaced, and an interrupted run
finishes the journal when it next starts, so ``--out`` and the state never disagree.

Equality with a full run holds for logs that are appended to (a daemon's own directory: new segments,
a growing active segment, recovery truncating a torn tail, retention deleting old files -- whose sessions
the state and ``--out`` keep, so the tables equal one full run over *everything ever seen*). A record with
a seq at or below the watermark that was never seen (a late-arriving older segment) cannot be paired
incrementally: it is counted as a duplicate, and a full run is the way to include it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from idled.pipeline.aggregate import Laps
from idled.pipeline.decode import EVENT_SCHEMA, PerFileStats
from idled.pipeline.records import FileStats, Row, iter_rows, seq_ranges_overlap
from idled.pipeline.rules import FlapParams
from idled.pipeline.statedir import State, StateError, apply_journal, file_totals_of, load_state, pending_work, replace_json

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

# State handling lives in `statedir`; re-exported here, the one import for callers.
__all__ = [
    "StateError", "State", "load_state", "pending_work", "apply_journal", "file_totals_of", "run_incremental",
    "lateness_by_detector", "SESSION_TABLES",
]

SESSION_TABLES: Final = ("sessions", "concurrency", "lateness", "flappers", "dau", "session_lengths")
LATENESS_VALUES: Final = "lateness_values"  # a state table, staged and swapped like the output tables
_DAY: Final = 86400


def _decode_tails(accumulator: Any, items: Iterator[tuple[int, str, int, int]]) -> Iterator[Row]:
    """Executors: read each file from its offset (same path as on the driver: local or a shared mount)."""
    for daemon, path, offset, watermark in items:
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read()
        stats = FileStats()
        dropped = 0
        for row in iter_rows(data, daemon, stats):
            if row[1] <= watermark:
                dropped += 1
                continue
            yield row
        accumulator.add({path: (daemon, offset, dropped, *stats.as_tuple())})


# ---------------------------------------------------------------------------------------------- frames

_SESSION_COLUMNS: Final = (
    "daemon", "uid_key", "uid_hash", "online_seq", "online_ts", "offline_seq", "offline_ts", "duration_s",
    "end_reason", "open", "end",
)
_SESSION_SCHEMA: Final = (
    "daemon INT, uid_key STRING, uid_hash BIGINT, online_seq BIGINT, online_ts DOUBLE, offline_seq BIGINT, "
    "offline_ts DOUBLE, duration_s DOUBLE, end_reason STRING, open BOOLEAN, end DOUBLE"
)


def _days(column: Column) -> Column:
    from pyspark.sql import functions as F

    return F.floor(column / _DAY)


def _partitions(spark: SparkSession, table: str, schema: str, dates: Sequence[str]) -> DataFrame:
    """The given date partitions of a Parquet table (those that exist), with `schema`; empty if none."""
    paths = [os.path.join(table, f"date={d}") for d in dates]
    paths = [p for p in paths if os.path.isdir(p)]
    if not paths:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", table).parquet(*paths)


_OUT_SESSIONS_SCHEMA: Final = (
    "daemon STRING, uid STRING, uid_type STRING, online_seq BIGINT, online_ts DOUBLE, offline_seq BIGINT, "
    "offline_ts DOUBLE, duration_s DOUBLE, end_reason STRING, open BOOLEAN, date DATE"
)


def _old_closed(spark: SparkSession, out: str, names: Sequence[str], dates: Sequence[str]) -> DataFrame:
    """Closed sessions of the given dates from ``--out``, back in the session schema of `pairing`."""
    from pyspark.sql import functions as F

    rows = _partitions(spark, os.path.join(out, "sessions"), _OUT_SESSIONS_SCHEMA, dates).where(~F.col("open"))
    key = F.concat(F.when(F.col("uid_type") == "int", F.lit("i:")).otherwise(F.lit("s:")), F.col("uid"))
    daemon = (F.array_position(F.array(*[F.lit(n) for n in names]), F.col("daemon")) - 1).cast("int")
    return rows.select(
        daemon.alias("daemon"), key.alias("uid_key"), F.xxhash64(key).alias("uid_hash"), "online_seq", "online_ts",
        "offline_seq", "offline_ts", "duration_s", "end_reason", "open",
        F.greatest(F.col("offline_ts"), F.col("online_ts")).alias("end"),
    )


def _date_strings(days: set[int]) -> list[str]:
    from idled.pipeline.rules import unix_date

    return sorted(str(unix_date(d)) for d in days)


def _day_set(frame: DataFrame, column: Column) -> set[int]:
    return {int(r[0]) for r in frame.select(column.alias("d")).distinct().collect() if r[0] is not None}


@dataclass
class Batch:
    """What one incremental run computed before writing."""

    frames: dict[str, DataFrame]  # table -> rows of the changed dates only
    dates: dict[str, list[str]]  # table -> dates to replace (absent from the frame: delete)
    state: dict[str, Any]  # the new state.json
    open_rows: DataFrame
    spanning: DataFrame


def _count_files(data: dict[str, Any], per_file: dict[str, tuple]) -> bool:
    """Fold the run's per-file counters into the new state; True if two new files of a daemon overlap in seq."""
    ranges: dict[int, list[tuple[int | None, int | None, int]]] = {}
    counts = data["counts"]
    for path, (daemon, offset, dropped, size, records, corrupt, malformed, torn, broken, low, high, unordered) in per_file.items():
        files = data["daemons"][str(daemon)]["files"]
        name = os.path.basename(path)
        known = files.get(name) if offset > 0 else None
        entry = known or {"records": 0, "corrupt": 0, "malformed": 0}
        entry.update(size=offset + size, consumed=offset + size - torn, torn_bytes=torn, broken=bool(broken))
        entry["records"] += records
        entry["corrupt"] += corrupt
        entry["malformed"] += malformed
        files[name] = entry
        counts["events"] += records - malformed
        counts["duplicates"] += dropped
        ranges.setdefault(daemon, []).append((low, high, unordered))
    return any(seq_ranges_overlap(r) for r in ranges.values())


def _extent(data: dict[str, Any], totals: Any) -> tuple[int | None, int | None]:
    """The timeline's new (first, last) minute: first of any session, last of any (open ones are all in B)."""
    old_first = data["first_minute"]
    first = totals[4] if old_first is None else (old_first if totals[4] is None else min(old_first, totals[4]))
    closed_last = data["closed_last_minute"]
    if totals[6] is not None:
        closed_last = totals[6] if closed_last is None else max(closed_last, totals[6])
    candidates = [x for x in (closed_last, totals[5]) if x is not None]
    last = max(candidates) if candidates else None
    data.update(first_minute=first, closed_last_minute=closed_last, last_minute=last)
    return first, last


@dataclass
class Days:
    """Day numbers (unix days) each table rewrites."""

    sessions: set[int]
    closed: set[int]  # session_lengths
    flap: set[int]
    cover: set[int]  # dau and concurrency
    lateness: set[int]
    lateness_new: DataFrame


def _changed_days(sessions: DataFrame, pairs: DataFrame, flap: FlapParams, firsts: tuple[int | None, int | None],
                  lasts: tuple[int | None, int | None]) -> Days:
    from pyspark.sql import functions as F

    from idled.pipeline.pairing import lateness_input_of

    carried_col, is_open = F.col("carried"), F.col("open")
    session_days = _day_set(sessions.where(~(carried_col & is_open)), F.col("d0"))
    closed_days = _day_set(sessions.where(~is_open), F.col("d0"))
    from idled.pipeline.rules import NOT_USER_ENDS

    user_end = F.col("end_reason").isNull() | ~F.col("end_reason").isin(*sorted(NOT_USER_ENDS))
    short = sessions.where(~is_open & (F.col("duration_s") < flap.short_s) & user_end)
    flap_days: set[int] = set()
    for row in short.select("d0", _days(F.col("online_ts") + flap.window_s)).distinct().collect():
        flap_days.update(range(int(row[0]), int(row[1]) + 1))
    low_end = F.least(F.col("old_end"), F.col("end"))
    high_end = F.greatest(F.col("old_end"), F.col("end"))
    cover = sessions.select(F.explode(F.when(carried_col, F.sequence(_days(low_end), _days(high_end)))
                                      .otherwise(F.sequence(F.col("d0"), F.col("d1")))).alias("d"))
    cover_days = _day_set(cover, F.col("d"))
    lateness_new = lateness_input_of(pairs).withColumn("date", F.date_from_unix_date(_days(F.col("hour_start")).cast("int")))
    lateness_days = _day_set(lateness_new, _days(F.col("hour_start")))
    for before, after in (firsts, lasts):
        if before is not None and after is not None and before != after:
            cover_days.update(range(min(before, after) * 60 // _DAY, max(before, after) * 60 // _DAY + 1))
        elif before is None and after is not None:
            cover_days.add(after * 60 // _DAY)
    return Days(session_days, closed_days, flap_days, cover_days, lateness_days, lateness_new)


def _frames(spark: SparkSession, state: State, out: str, names_list: list[str], flap: FlapParams, sessions: DataFrame,
            days: Days, extent: tuple[int | None, int | None], laps: Laps) -> tuple[dict[str, DataFrame], dict[str, list[str]]]:
    """Each table's rows for the days it rewrites, and those days' dates (a date absent from the rows: deleted)."""
    from pyspark.sql import functions as F

    from idled.pipeline.aggregate import _concurrency, _dau, _flappers, _lateness, _session_lengths, _sessions_out
    from idled.pipeline.pairing import span
    from idled.pipeline.spark import materialize

    d0, d1 = span(F.col("online_ts"), F.col("end"), _DAY)
    first, last = extent
    session_days, closed_days, flap_days, cover_days, lateness_days = days.sessions, days.closed, days.flap, days.cover, days.lateness
    lateness_new = days.lateness_new
    old_gen = state.gen_dir()
    base = sessions.select(*_SESSION_COLUMNS)

    def with_days(frame: DataFrame) -> DataFrame:
        return frame.withColumn("d0", d0).withColumn("d1", d1)

    # The old closed sessions of every day any table re-reads, read from --out once.
    back = -(-flap.window_s // _DAY)
    flap_read = set(range(min(flap_days) - back, max(flap_days) + 1)) if flap_days else set()
    wanted = session_days | closed_days | flap_read | cover_days
    old_rows = materialize(with_days(_old_closed(spark, out, names_list, _date_strings(wanted)))) if wanted else None
    laps.mark("read_old_sessions")

    def closed_old(dates: list[str]) -> DataFrame:
        assert old_rows is not None
        from idled.pipeline.rules import unix_date

        days = [d for d in wanted if str(unix_date(d)) in set(dates)]
        return old_rows.where(F.col("d0").isin(*days)).drop("d0", "d1")

    def in_days(frame: DataFrame, days: set[int]) -> DataFrame:
        return frame.where(F.col("d0").isin(*sorted(days))) if days else frame.limit(0)

    frames: dict[str, DataFrame] = {}
    dates: dict[str, list[str]] = {}
    if session_days:
        rows = with_days(closed_old(_date_strings(session_days))).unionByName(in_days(with_days(base), session_days))
        frames["sessions"] = _sessions_out(rows, names_list)
    dates["sessions"] = _date_strings(session_days)
    if closed_days:
        rows = closed_old(_date_strings(closed_days)).unionByName(in_days(with_days(base), closed_days).drop("d0", "d1"))
        frames["session_lengths"] = _session_lengths(rows)
    dates["session_lengths"] = _date_strings(closed_days)
    if flap_days:
        rows = closed_old(_date_strings(flap_read)).unionByName(base)
        frames["flappers"] = _flappers(rows, flap).where(F.col("date").isin(*_date_strings(flap_days)))
    dates["flappers"] = _date_strings(flap_days)
    if cover_days:
        cover_dates = _date_strings(cover_days)
        spanning_old = with_days(_read_or_empty(spark, os.path.join(old_gen, "spanning"), _SESSION_SCHEMA))
        reaching = spanning_old.where(~F.col("d0").isin(*sorted(cover_days)) & (F.col("d1") >= min(cover_days)))
        rows = closed_old(cover_dates).unionByName(reaching.drop("d0", "d1")).unionByName(base)
        frames["dau"] = _dau(rows).where(F.col("date").isin(*cover_dates))
        if first is not None and last is not None:
            frames["concurrency"] = _concurrency(spark, rows, (first, last)).where(
                F.col("date").isin(*cover_dates) & (F.col("minute_start") >= first * 60)
            )
    dates["dau"] = dates["concurrency"] = _date_strings(cover_days)
    if lateness_days:
        lateness_dates = _date_strings(lateness_days)
        values = _partitions(spark, os.path.join(state.path, LATENESS_VALUES), "detector STRING, hour_start DOUBLE, lateness DOUBLE, date DATE",
                             lateness_dates).unionByName(lateness_new.select("detector", F.col("hour_start").cast("double"), "lateness", "date"))
        values = materialize(values)
        frames[LATENESS_VALUES] = values
        frames["lateness"] = _lateness(values.drop("date"))
    dates["lateness"] = dates[LATENESS_VALUES] = _date_strings(lateness_days)
    return frames, dates


def _plan(spark: SparkSession, state: State, out: str, names: Sequence[str], flap: FlapParams,
          work: list[tuple[int, str, int, int]], laps: Laps) -> Batch:
    from pyspark.sql import functions as F

    from idled.pipeline.pairing import pair, sessions_of, span
    from idled.pipeline.spark import materialize

    sc = spark.sparkContext
    data = json.loads(json.dumps(state.data))  # the new state, a deep copy
    accumulator = sc.accumulator({}, PerFileStats())
    rdd = sc.parallelize(work, max(1, min(len(work), 2 * sc.defaultParallelism)))
    batch = spark.createDataFrame(rdd.mapPartitions(functools.partial(_decode_tails, accumulator)), EVENT_SCHEMA, verifySchema=False)
    old_gen = state.gen_dir()
    carried = _read_or_empty(spark, os.path.join(old_gen, "open"), "daemon INT, uid_key STRING, seq BIGINT, ts DOUBLE")
    carried_events = carried.select(
        "daemon", "seq", F.lit(True).alias("online"), "uid_key", "ts", F.lit(None).cast("string").alias("reason"),
        F.lit(None).cast("double").alias("deadline"), F.lit(None).cast("string").alias("detector"),
    )
    events = materialize(batch.unionByName(carried_events).repartition("uid_key").withColumn("uid_hash", F.xxhash64("uid_key")))
    laps.mark("decode")

    dedupe = _count_files(data, accumulator.value)
    counts = data["counts"]
    for row in events.groupBy("daemon").agg(F.max("seq"), F.max("ts")).collect():
        entry = data["daemons"][str(row[0])]
        entry["max_seq"] = row[1] if entry["max_seq"] is None else max(entry["max_seq"], row[1])
        entry["data_end"] = row[2] if entry["data_end"] is None else max(entry["data_end"], row[2])
    data_end = {int(k): v["data_end"] for k, v in data["daemons"].items() if v["data_end"] is not None}

    pairs = materialize(pair(events, dedupe))
    if dedupe:
        counts["duplicates"] += events.count() - events.dropDuplicates(["daemon", "uid_key", "seq"]).count()
    m0, m1 = span(F.col("online_ts"), F.col("end"), 60)
    d0, d1 = span(F.col("online_ts"), F.col("end"), _DAY)
    # The carried sessions, with the end they had: the previous data end of their daemon.
    old_ends = state.data["daemons"]
    old_end_map = F.create_map(*[F.lit(x) for k, v in old_ends.items() if v["data_end"] is not None for x in (int(k), v["data_end"])]) \
        if any(v["data_end"] is not None for v in old_ends.values()) else None
    marks = carried.select("daemon", "uid_key", F.col("seq").alias("online_seq"), F.lit(True).alias("carried"))
    sessions = materialize(
        sessions_of(pairs, data_end).join(marks, ["daemon", "uid_key", "online_seq"], "left")
        .withColumn("carried", F.coalesce(F.col("carried"), F.lit(False)))
        .withColumn("old_end", F.greatest(old_end_map[F.col("daemon")], F.col("online_ts")) if old_end_map is not None
                    else F.lit(None).cast("double"))
        .withColumn("m0", m0).withColumn("m1", m1).withColumn("d0", d0).withColumn("d1", d1)
    )
    totals = sessions.agg(
        F.count("*"), F.count(F.when(F.col("open"), 1)), F.count(F.when(F.col("end_reason") == "superseded", 1)),
        F.count(F.when(F.col("carried"), 1)), F.min("m0"), F.max("m1"), F.max(F.when(~F.col("open"), F.col("m1"))),
    ).first()
    counts["sessions"] += totals[0] - totals[3]
    counts["open_sessions"] = totals[1]
    counts["superseded"] += totals[2]
    counts["orphans"] += pairs.where(F.col("orphan")).count()
    laps.mark("pair")

    old_first, old_last = data["first_minute"], data["last_minute"]
    first, last = _extent(data, totals)
    days = _changed_days(sessions, pairs, flap, (old_first, first), (old_last, last))
    laps.mark("changed_days")
    frames, dates = _frames(spark, state, out, list(names), flap, sessions, days, (first, last), laps)
    is_open = F.col("open")
    spanning_new = sessions.where(~is_open & (F.col("d1") > F.col("d0"))).select(*_SESSION_COLUMNS)
    spanning = _read_or_empty(spark, os.path.join(old_gen, "spanning"), _SESSION_SCHEMA).unionByName(spanning_new)
    open_rows = sessions.where(is_open).select("daemon", "uid_key", F.col("online_seq").alias("seq"), F.col("online_ts").alias("ts"))
    data["generation"] = state.generation + 1
    return Batch(frames, dates, data, open_rows, spanning)


def _read_or_empty(spark: SparkSession, path: str, schema: str) -> DataFrame:
    if os.path.isdir(path):
        return spark.read.schema(schema).parquet(path)
    return spark.createDataFrame([], schema)


def _commit(state: State, batch: Batch, out: str, laps: Laps) -> None:
    """Stage every changed partition and the new state, journal the moves, then apply the journal."""
    staging = os.path.join(state.path, "staging")
    shutil.rmtree(staging, ignore_errors=True)
    new_gen = state.gen_dir(batch.state["generation"])
    shutil.rmtree(new_gen, ignore_errors=True)
    batch.open_rows.write.parquet(os.path.join(new_gen, "open"))
    batch.spanning.coalesce(1).write.parquet(os.path.join(new_gen, "spanning"))
    moves: list[tuple[str | None, str]] = []
    for table, dates in batch.dates.items():
        if not dates:
            continue
        target_root = os.path.join(state.path, LATENESS_VALUES) if table == LATENESS_VALUES else os.path.join(out, table)
        staged_root = os.path.join(staging, table)
        frame = batch.frames.get(table)
        if frame is not None:
            if table != "sessions":
                frame = frame.coalesce(1)
            frame.write.partitionBy("date").parquet(staged_root)
            laps.mark(f"write_{table}")
        for date in dates:
            staged = os.path.join(staged_root, f"date={date}")
            moves.append((staged if os.path.isdir(staged) else None, os.path.join(target_root, f"date={date}")))
    for table in SESSION_TABLES:
        os.makedirs(os.path.join(out, table), exist_ok=True)
    replace_json(os.path.join(state.path, "journal.json"), {"moves": moves, "state": batch.state})
    apply_journal(state.path)
    laps.mark("commit")


def run_incremental(spark: SparkSession, state: State, out: str, names: Sequence[str], flap: FlapParams,
                    work: list[tuple[int, str, int, int]], laps: Laps) -> dict[str, Any]:
    """Process `work`, rewrite the changed partitions of `out`; returns the new state's data."""
    batch = _plan(spark, state, out, names, flap, work, laps)
    _commit(state, batch, out, laps)
    return batch.state




def lateness_by_detector(spark: SparkSession, state: State) -> list[dict[str, Any]]:
    from idled.pipeline.aggregate import _lateness_stats

    values = _read_or_empty(spark, os.path.join(state.path, LATENESS_VALUES), "detector STRING, hour_start DOUBLE, lateness DOUBLE")
    return [row.asDict() for row in _lateness_stats(values, ["detector"]).orderBy("detector").collect()]
