"""Incremental runs: each table's rows for what one batch changed, reading as little of ``--out`` as it can.

Theory of operation
-------------------
The batch B (`incremental`) holds the new sessions and every session open at the end of the previous run
(closed by now or still open). Closed sessions already in ``--out`` never change, and each is closed in
exactly one batch, so per table:

* sessions -- nothing is read back: B's closed sessions are *added* as new files to their date partitions
  and B's open sessions go to files of their own, which the next run deletes (`incremental`).
* session_lengths -- counts of closed sessions per (date, bucket): the old rows of B's dates plus B's
  counts, summed.
* lateness -- exact percentiles per (detector, hour): only the hours with new values are recomputed, from
  the stored values of those hours (the state's ``lateness_values``, added to like sessions) plus the new
  ones; the other hours' rows are kept.
* concurrency -- a minute's count can change only from ``low`` on: the first minute a new session starts,
  a carried session's end moved from (its old end was the previous data end), or the old timeline did not
  reach. Those minutes are recomputed from the sessions reaching them -- B, the closed sessions in ``--out``
  from ``low``'s day on that end at or after ``low``, the stored midnight-crossing ones from earlier days --
  each clipped to start at ``low`` (a running count from 0 there is then exact); earlier minutes are kept.
  The sessions table's files are sorted by offline time in small row groups, so the scan skips the
  sessions that ended before ``low`` (in an hourly run: nearly all of them).
* dau -- the days from ``low``'s on. Distinct users per day: the state's ``active_users`` (the distinct
  users of the closed sessions covering each day) plus B's users; sessions started: the old count plus B's
  new sessions (the carried ones were counted when they started). ``active_users`` gets B's closed sessions.
* flappers -- the days B's short sessions can flag, from the state's ``short_sessions`` (the closed short
  user-ended sessions, a file added per run) of those days and one flap window before, plus B's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from idled.pipeline.aggregate import Laps, _concurrency, _flappers, _lateness, _session_lengths
from idled.pipeline.pairing import USER, date_of, span
from idled.pipeline.rules import NOT_USER_ENDS, FlapParams, unix_date
from idled.pipeline.schemas import SMALL_SCHEMAS
from idled.pipeline.spark import agg_row

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "LATENESS_VALUES", "SHORT_SESSIONS", "STATE_TABLES", "SESSION_SCHEMA", "Change", "Refresh", "changes_of",
    "refreshed", "read_or_empty", "partitions", "SORTED_BY", "ROW_GROUP_BYTES",
]

# State tables, partitioned by date like the output tables: values and short sessions get a file per run,
# active users' partitions are replaced.
LATENESS_VALUES: Final = "lateness_values"
SHORT_SESSIONS: Final = "short_sessions"
ACTIVE_USERS: Final = "active_users"
STATE_TABLES: Final = (LATENESS_VALUES, SHORT_SESSIONS, ACTIVE_USERS)
SESSION_SCHEMA: Final = (
    "daemon INT, uid_key STRING, uid_hash BIGINT, online_seq BIGINT, online_ts DOUBLE, offline_seq BIGINT, "
    "offline_ts DOUBLE, duration_s DOUBLE, end_reason STRING, open BOOLEAN, end DOUBLE, device STRING, end_device STRING"
)
# How the sessions table's files are written: sorted by offline time in row groups of ~8 MiB, whose
# min/max statistics let a scan filtered on the times skip what ended long before.
SORTED_BY: Final = ("date", "offline_ts")  # the partition column first: Spark then keeps this order
ROW_GROUP_BYTES: Final = 8 << 20
_VALUES_SCHEMA: Final = "detector STRING, hour_start DOUBLE, lateness DOUBLE, date DATE"
_SHORT_SCHEMA: Final = "uid_key STRING, uid_hash BIGINT, online_ts DOUBLE, duration_s DOUBLE, end_reason STRING, open BOOLEAN, date DATE"
_ACTIVE_SCHEMA: Final = "uid_key STRING, date DATE"
_DAY: Final = 86400
_MINUTE: Final = 60


def _days(column: Column) -> Column:
    from pyspark.sql import functions as F

    return F.floor(column / _DAY)


def date_strings(days: Any) -> list[str]:
    return sorted(str(unix_date(d)) for d in days)


def read_or_empty(spark: SparkSession, path: str, schema: str) -> DataFrame:
    if os.path.isdir(path):
        return spark.read.schema(schema).parquet(path)
    return spark.createDataFrame([], schema)


def partitions(spark: SparkSession, table: str, schema: str | StructType, dates: Sequence[str]) -> DataFrame:
    """The given date partitions of a Parquet table (those that exist), with `schema`; empty if none."""
    paths = [os.path.join(table, f"date={d}") for d in dates]
    paths = [p for p in paths if os.path.isdir(p)]
    if not paths:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", table).parquet(*paths)


def _short_closed(flap: FlapParams) -> Column:
    """The sessions `_flappers` counts: closed, short, ended by the user (not a restart, shutdown or login
    elsewhere)."""
    from pyspark.sql import functions as F

    user_end = F.col("end_reason").isNull() | ~F.col("end_reason").isin(*sorted(NOT_USER_ENDS))
    return ~F.col("open") & (F.col("duration_s") < flap.short_s) & user_end


def _user_of(uid: Column, uid_type: Column) -> tuple[Column, Column]:
    """uid_key and uid_hash (`pairing.USER`) from the sessions table's uid columns."""
    from pyspark.sql import functions as F

    key = F.concat(F.when(uid_type == "int", F.lit("i:")).otherwise(F.lit("s:")), uid)
    return key.alias("uid_key"), F.xxhash64(key).alias("uid_hash")


@dataclass
class Change:
    """Where a batch changes the tables."""

    closed_days: set[int]  # session_lengths: the start days of B's closed sessions
    active_days: set[int]  # active_users: the days B's closed sessions cover
    flap_days: set[int]  # flappers
    low: int | None  # concurrency: the first minute whose count can change (None: no minute can)
    cover_days: set[int]  # dau and concurrency: low's day to the last day of the old or new timeline
    hours: list[float]  # lateness: the hours with new values
    lateness_new: DataFrame  # those values, with their date


def changes_of(sessions: DataFrame, lateness_new: DataFrame, flap: FlapParams, extent: tuple[int | None, int | None],
               old_last: int | None) -> Change:
    """Two small collects over B (sessions with carried, old_end, m0, d0) and its new lateness values."""
    from pyspark.sql import functions as F

    carried, is_open, end, old_end = F.col("carried"), F.col("open"), F.col("end"), F.col("old_end")
    # a carried session whose end moved changes the minutes from the earlier of its two ends on
    moved = F.when(carried & (old_end != end), F.floor(F.least(old_end, end) / _MINUTE))
    short = _short_closed(flap)
    row = agg_row(sessions.agg(
        F.min(F.when(~carried, F.col("m0")).otherwise(moved)),
        F.collect_set(F.when(~is_open, F.array(F.col("d0"), F.col("d1")))),
        F.collect_set(F.when(short, F.array(F.col("d0"), _days(F.col("online_ts") + flap.window_s)))),
    ))
    flap_days: set[int] = set()
    for first_day, last_day in row[2]:
        flap_days.update(range(int(first_day), int(last_day) + 1))
    candidates = [int(x) for x in (row[0], None if old_last is None else old_last + 1) if x is not None]
    low = min(candidates) if candidates else None
    high = max((x for x in (extent[1], old_last) if x is not None), default=None)
    cover = set(range(low * _MINUTE // _DAY, high * _MINUTE // _DAY + 1)) if low is not None and high is not None else set()
    hours = sorted(float(r[0]) for r in lateness_new.select("hour_start").distinct().collect())
    active_days: set[int] = set()
    for first_day, last_day in row[1]:
        active_days.update(range(int(first_day), int(last_day) + 1))
    return Change({int(d) for d, _ in row[1]}, active_days, flap_days, low, cover, hours, lateness_new)


def _old_reaching(spark: SparkSession, out: str, spanning: DataFrame, low: int) -> DataFrame:
    """Closed sessions already in ``--out`` that cover minute `low` or a later one (uid_key, uid_hash,
    online_ts, end): of the sessions partitions from `low`'s day on, and the stored midnight-crossing
    sessions of earlier days that reach it. Only those columns are read; the filter on the times skips the
    row groups that ended before (`SORTED_BY`)."""
    from pyspark.sql import functions as F

    table = os.path.join(out, "sessions")
    first_date = str(unix_date(low * _MINUTE // _DAY))
    dates = sorted(n[5:] for n in os.listdir(table) if n.startswith("date=") and n[5:] >= first_date) \
        if os.path.isdir(table) else []
    since = float(low * _MINUTE)
    stored = partitions(spark, table, "uid STRING, uid_type STRING, online_ts DOUBLE, offline_ts DOUBLE, open BOOLEAN",
                        dates)
    # what can reach `low` starts or ends at or after it (exactly: `m1 >= low` below)
    stored = stored.where(~F.col("open") & ((F.col("offline_ts") >= since) | (F.col("online_ts") >= since))).select(
        *_user_of(F.col("uid"), F.col("uid_type")), "online_ts", F.greatest("offline_ts", "online_ts").alias("end"),
    )
    earlier = spanning.where(_days(F.col("online_ts")) < low * _MINUTE // _DAY).select(*USER, "online_ts", "end")
    both = stored.unionByName(earlier)
    return both.where(span(F.col("online_ts"), F.col("end"), _MINUTE)[1] >= low)


def _summed_lengths(spark: SparkSession, out: str, sessions: DataFrame, days: set[int]) -> DataFrame:
    """session_lengths of the given days: the stored counts plus B's closed sessions'."""
    from pyspark.sql import functions as F

    new = _session_lengths(sessions.select("online_ts", "duration_s", "open"))
    old = partitions(spark, os.path.join(out, "session_lengths"), new.schema, date_strings(days))
    return old.unionByName(new).groupBy("date", "bucket", "label", "lo_s", "hi_s").agg(F.sum("sessions").alias("sessions"))


def _concurrency_tail(spark: SparkSession, out: str, sessions: DataFrame, spanning: DataFrame, change: Change,
                      last: int) -> DataFrame:
    """concurrency of the changed days: the kept minutes before `low`, the ones from `low` to `last` again."""
    from pyspark.sql import functions as F

    assert change.low is not None
    low = change.low
    reaching = sessions.where(F.col("m1") >= low).select(*USER, "online_ts", "end") \
        .unionByName(_old_reaching(spark, out, spanning, low))
    clipped = reaching.withColumn("online_ts", F.greatest(F.col("online_ts"), F.lit(float(low * _MINUTE))))
    tail = _concurrency(spark, clipped, (low, last))
    kept = partitions(spark, os.path.join(out, "concurrency"), SMALL_SCHEMAS["concurrency"],
                      date_strings(change.cover_days)).where(F.col("minute_start") < low * _MINUTE)
    return kept.unionByName(tail)


def _lateness_hours(spark: SparkSession, out: str, state_dir: str, change: Change) -> DataFrame:
    """lateness of the days with new values: the rows of the other hours kept, those hours recomputed."""
    from pyspark.sql import functions as F

    dates = date_strings({int(h) // _DAY for h in change.hours})
    stored = partitions(spark, os.path.join(state_dir, LATENESS_VALUES), _VALUES_SCHEMA, dates)
    values = stored.where(F.col("hour_start").isin(*change.hours)).unionByName(_new_values(change)).drop("date")
    recomputed = _lateness(values)
    kept = partitions(spark, os.path.join(out, "lateness"), recomputed.schema, dates)
    return kept.where(~F.col("hour_start").isin(*change.hours)).unionByName(recomputed)


def _day_users(sessions: DataFrame, days: set[int]) -> DataFrame:
    """(uid_key, day) of every day in `days` each session covers."""
    from pyspark.sql import functions as F

    day = F.explode(F.sequence(F.greatest(F.col("d0"), F.lit(min(days))), F.least(F.col("d1"), F.lit(max(days)))))
    return sessions.where((F.col("d1") >= min(days)) & (F.col("d0") <= max(days))).select("uid_key", day.alias("day")) \
        .where(F.col("day").isin(*sorted(days)))


def _stored_day_users(spark: SparkSession, state_dir: str, days: set[int]) -> DataFrame:
    from pyspark.sql import functions as F

    stored = partitions(spark, os.path.join(state_dir, ACTIVE_USERS), _ACTIVE_SCHEMA, date_strings(days))
    return stored.select("uid_key", F.unix_date("date").cast("long").alias("day"))


def _dau_days(spark: SparkSession, out: str, state_dir: str, sessions: DataFrame, days: set[int]) -> DataFrame:
    """dau of `days`: distinct users from the stored closed sessions' users plus B's; sessions started, the
    stored count plus B's sessions that are not carried."""
    from pyspark.sql import functions as F

    active = _stored_day_users(spark, state_dir, days).unionByName(_day_users(sessions, days)).distinct() \
        .groupBy("day").agg(F.count("*").alias("active_users"))
    old = partitions(spark, os.path.join(out, "dau"), SMALL_SCHEMAS["dau"], date_strings(days)) \
        .select(F.unix_date("date").cast("long").alias("day"), "sessions_started")
    new = sessions.where(~F.col("carried")).groupBy(F.col("d0").alias("day")).agg(F.count("*").alias("sessions_started"))
    started = old.unionByName(new).groupBy("day").agg(F.sum("sessions_started").alias("sessions_started"))
    return active.join(started, "day", "left").select(
        F.date_from_unix_date(F.col("day").cast("int")).alias("date"), "active_users",
        F.coalesce(F.col("sessions_started"), F.lit(0)).cast("long").alias("sessions_started"),
    )


def _active_users(spark: SparkSession, state_dir: str, sessions: DataFrame, days: set[int]) -> DataFrame:
    """The state's active users of `days` with B's closed sessions' added."""
    from pyspark.sql import functions as F

    closed = _day_users(sessions.where(~F.col("open")), days)
    return _stored_day_users(spark, state_dir, days).unionByName(closed).distinct() \
        .select("uid_key", F.date_from_unix_date(F.col("day").cast("int")).alias("date"))


def _new_values(change: Change) -> DataFrame:
    from pyspark.sql import functions as F

    return change.lateness_new.select("detector", F.col("hour_start").cast("double"), "lateness", "date")


@dataclass
class Refresh:
    """What a batch writes besides its sessions."""

    frames: dict[str, DataFrame]  # replaced tables (output and `STATE_TABLES`): the rows of their dates
    dates: dict[str, list[str]]  # the dates each replaces (a date absent from the rows: deleted)
    added: dict[str, DataFrame]  # state tables B adds files to


def refreshed(spark: SparkSession, out: str, state_dir: str, spanning: DataFrame, flap: FlapParams, sessions: DataFrame,
              change: Change, last: int | None, laps: Laps) -> Refresh:
    """Every table's new rows but the sessions'. `spanning`: the stored midnight-crossing sessions."""
    from pyspark.sql import functions as F

    base = sessions.select("uid_key", "uid_hash", "online_ts", "duration_s", "end_reason", "open")
    short = base.where(_short_closed(flap)).withColumn("date", date_of(F.col("online_ts")))
    frames: dict[str, DataFrame] = {}
    dates: dict[str, list[str]] = {
        "session_lengths": date_strings(change.closed_days), "flappers": date_strings(change.flap_days),
        "dau": date_strings(change.cover_days), "concurrency": date_strings(change.cover_days),
        "lateness": date_strings({int(h) // _DAY for h in change.hours}), ACTIVE_USERS: date_strings(change.active_days),
    }
    if change.closed_days:
        frames["session_lengths"] = _summed_lengths(spark, out, sessions, change.closed_days)
        frames[ACTIVE_USERS] = _active_users(spark, state_dir, sessions, change.active_days)
    if change.flap_days:
        back = -(-flap.window_s // _DAY)
        read = date_strings(range(min(change.flap_days) - back, max(change.flap_days) + 1))
        stored = partitions(spark, os.path.join(state_dir, SHORT_SESSIONS), _SHORT_SCHEMA, read) \
            .withColumn("uid_hash", F.xxhash64("uid_key"))  # the paired path stores it null
        rows = stored.unionByName(short).drop("date")
        frames["flappers"] = _flappers(rows, flap).where(F.col("date").isin(*dates["flappers"]))
    if change.cover_days and change.low is not None and last is not None:
        frames["dau"] = _dau_days(spark, out, state_dir, sessions, change.cover_days)
        frames["concurrency"] = _concurrency_tail(spark, out, sessions, spanning, change, last)
        laps.mark("concurrency_merge")
    if change.hours:
        frames["lateness"] = _lateness_hours(spark, out, state_dir, change)
    return Refresh(frames, dates, {LATENESS_VALUES: _new_values(change), SHORT_SESSIONS: short})
