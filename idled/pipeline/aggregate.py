"""The output tables, each built from the paired rows (`pairing`); `build_tables` runs them in order.

* sessions: one row per online, with how and when it ended (`pairing.sessions_of`), the daemon by name;
* concurrency: per user, minute ranges ``[floor(start/60), ceil(end/60)-1]`` sorted and merged with a running
  max (two sessions touching the same minute count once), then +1/-1 at range ends summed per minute and a
  running sum over the (few thousand) minutes;
* dau: day ranges exploded with ``sequence`` (sessions span few days), distinct per user and day;
* flappers: a RANGE window of ``window_s`` seconds over each user's short-session starts;
* lateness: exact percentiles per (detector, hour) from each group's sorted values (`_lateness_stats`);
* session_lengths: a bucket index per closed session, counted per day.

The frames are lazy except for the few small collects `build_tables` needs (per-daemon data end, totals,
lateness by detector, the concurrency bounds); `Laps` records what each step cost.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from idled.pipeline.pairing import USER, date_of, lateness_input_of, pair, pair_count, sessions_of, span, uid_columns
from idled.pipeline.rules import BUCKETS, CLOSED, NOT_USER_ENDS, FlapParams, bucket_label
from idled.pipeline.schemas import SMALL_SCHEMAS
from idled.pipeline.spark import agg_row, materialize

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["TABLES", "Laps", "Tables", "build_tables", "merge_grace"]

TABLES: Final = ("sessions", "concurrency", "lateness", "flappers", "dau", "session_lengths")


def _concurrency(spark: SparkSession, sessions: DataFrame, bounds: tuple[int, int] | None = None) -> DataFrame:
    """Users online per minute. `bounds` (first, last minute, inclusive) fixes the timeline's extent instead
    of taking it from `sessions`: the incremental run recomputes a few days from the sessions covering them,
    while the extent is the whole history's (rows outside the days it rewrites are discarded by the caller)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first, last = span(F.col("online_ts"), F.col("end"), 60)
    spans = sessions.select(*USER, first.alias("m0"), last.alias("m1"))
    by_user = Window.partitionBy(*USER).orderBy("m0", "m1")
    before = by_user.rowsBetween(Window.unboundedPreceding, -1)
    upto = by_user.rowsBetween(Window.unboundedPreceding, 0)
    starts = F.when(F.col("_prev_max").isNull() | (F.col("m0") > F.col("_prev_max")), 1).otherwise(0)
    merged = (
        spans.withColumn("_prev_max", F.max("m1").over(before))
        .withColumn("_group", F.sum(starts).over(upto))
        .groupBy(*USER, "_group")
        .agg(F.min("m0").alias("m0"), F.max("m1").alias("m1"))
    )
    deltas = (
        merged.select(F.col("m0").alias("minute"), F.lit(1).alias("d"))
        .unionAll(merged.select((F.col("m1") + 1).alias("minute"), F.lit(-1).alias("d")))
        .groupBy("minute")
        .agg(F.sum("d").alias("d"))
    )
    deltas = materialize(deltas)  # a few thousand rows; without it the write below would redo the merge
    found = deltas.agg(F.min("minute"), F.max("minute")).first()
    if bounds is not None:
        # From the first delta (the running sum needs every earlier one) to the fixed last minute.
        low = bounds[0] if found is None or found[0] is None else min(bounds[0], found[0])
        extent: tuple[int, int] | None = (low, bounds[1] + 1)
    else:
        extent = None if found is None or found[0] is None else (found[0], found[1])
    if extent is None:
        return spark.createDataFrame([], SMALL_SCHEMAS["concurrency"])
    # Every minute from the first to the one before the last delta (which brings the count back to 0).
    minutes = spark.range(extent[0], extent[1], 1, 1).withColumnRenamed("id", "minute")
    timeline = Window.orderBy("minute").rowsBetween(Window.unboundedPreceding, 0)
    return (
        minutes.join(F.broadcast(deltas), "minute", "left")
        .select("minute", F.sum(F.coalesce(F.col("d"), F.lit(0))).over(timeline).alias("users_online"))
        .select(
            date_of(F.col("minute") * 60).alias("date"),
            (F.col("minute") * 60).alias("minute_start"),
            F.col("users_online").cast("bigint").alias("users_online"),
        )
    )


_PERCENTILES: Final = ((0.5, "p50_s"), (0.99, "p99_s"))


def _lateness_stats(lateness_input: DataFrame, keys: Sequence[str]) -> DataFrame:
    """offlines, early, p50_s, p99_s, max_s per `keys`.

    Exact percentiles: each group's values are collected and sorted (a primitive sort of at most one
    detector-day of doubles, ~1M at 10M events/day), then the two values around rank (n - 1) * p are
    interpolated as Spark's `percentile` does (`rules.percentile`). `percentile` itself gives the same numbers
    but keeps a hash map of boxed doubles per group, and a ranking window buffers whole groups: both were
    several times slower here.
    """
    from pyspark.sql import functions as F

    value = F.col("lateness")
    stats = lateness_input.groupBy(*keys).agg(
        F.count("*").alias("offlines"),
        F.count(F.when(value < 0, 1)).alias("early"),
        F.max(value).alias("max_s"),
        F.sort_array(F.collect_list(value)).alias("_sorted"),
    )
    columns = []
    for p, name in _PERCENTILES:
        position = (F.col("offlines") - 1) * p
        lower, higher = F.floor(position), F.ceil(position)
        low = F.element_at("_sorted", (lower + 1).cast("int"))
        high = F.element_at("_sorted", (higher + 1).cast("int"))
        columns.append(
            F.when((higher == lower) | (high == low), low).otherwise((higher - position) * low + (position - lower) * high).alias(name)
        )
    return stats.select(*keys, "offlines", "early", *columns, "max_s")


def _lateness(lateness_input: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return _lateness_stats(lateness_input, ["detector", "hour_start"]).select(
        date_of(F.col("hour_start")).alias("date"), "hour_start", "detector", "offlines", "early", "p50_s", "p99_s", "max_s"
    )


def _flappers(sessions: DataFrame, params: FlapParams) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    user_end = F.col("end_reason").isNull() | ~F.col("end_reason").isin(*sorted(NOT_USER_ENDS))
    short = sessions.where(~F.col("open") & (F.col("duration_s") < params.short_s) & user_end)
    window = Window.partitionBy(*USER).orderBy("online_ts").rangeBetween(-params.window_s, 0)
    flagged = F.col("in_window") >= params.k
    return (
        short.select(*USER, "online_ts", F.count("*").over(window).alias("in_window"))
        .groupBy("uid_key", date_of(F.col("online_ts")).alias("date"))
        .agg(
            F.count("*").alias("short_sessions"),
            F.max(F.when(flagged, F.col("in_window"))).alias("max_in_window"),
            F.min(F.when(flagged, F.col("online_ts"))).alias("first_flagged_ts"),
        )
        .where(F.col("first_flagged_ts").isNotNull())
        .select("date", *uid_columns(), "short_sessions", "max_in_window", "first_flagged_ts")
    )


def merge_grace(sessions: DataFrame, grace: float) -> DataFrame:
    """The user sessions of `rules` (rule 6): per (user, daemon) in online seq order, a session starts a new
    user session unless the one before ended by a ``closed`` offline without the daemon's grace less than
    `grace` seconds before it; each group keeps its first start and its last end. The columns flappers and
    session_lengths read (USER, online_ts, duration_s, end_reason, open)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy(*USER, "daemon").orderBy("online_seq")
    joins = (
        (F.lag("end_reason").over(window) == CLOSED) & F.lag("end_grace").over(window).isNull()
        & ~F.lag("open").over(window) & (F.col("online_ts") - F.lag("offline_ts").over(window) < grace)
    )
    starts = F.when(joins, 0).otherwise(1)
    grouped = sessions.select(*USER, "daemon", "online_seq", "online_ts", "offline_ts", "end_reason", "open",
                              F.sum(starts).over(window.rowsBetween(Window.unboundedPreceding, 0)).alias("_group"))
    merged = grouped.groupBy(*USER, "daemon", "_group").agg(
        F.min_by("online_ts", "online_seq").alias("online_ts"),
        F.max_by(F.struct("offline_ts", "end_reason", "open"), "online_seq").alias("_last"),
    )
    return merged.select(
        *USER, "online_ts", (F.col("_last.offline_ts") - F.col("online_ts")).alias("duration_s"),
        F.col("_last.end_reason").alias("end_reason"), F.col("_last.open").alias("open"),
    )


def _dau(sessions: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    first, last = span(F.col("online_ts"), F.col("end"), 86400)
    days = sessions.select("uid_key", first.alias("d0"), last.alias("d1"))
    active = (
        days.select("uid_key", F.explode(F.sequence("d0", "d1")).alias("day"))
        .distinct()
        .groupBy("day")
        .agg(F.count("*").alias("active_users"))
    )
    started = days.groupBy(F.col("d0").alias("day")).agg(F.count("*").alias("sessions_started"))
    return active.join(started, "day", "left").select(
        F.date_from_unix_date(F.col("day").cast("int")).alias("date"),
        "active_users",
        F.coalesce(F.col("sessions_started"), F.lit(0)).alias("sessions_started"),
    )


def _session_lengths(sessions: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    duration = F.col("duration_s")
    bucket = F.lit(0)
    for index in range(1, len(BUCKETS)):
        bucket = F.when(duration >= BUCKETS[index], F.lit(index)).otherwise(bucket)
    labels = F.array(*[F.lit(bucket_label(i)) for i in range(len(BUCKETS))])
    lows = F.array(*[F.lit(b) for b in BUCKETS])
    highs = F.array(*[F.lit(b) for b in BUCKETS[1:]], F.lit(None).cast("double"))
    position = F.col("bucket") + 1
    return (
        sessions.where(~F.col("open"))
        .groupBy(date_of(F.col("online_ts")).alias("date"), bucket.alias("bucket"))
        .agg(F.count("*").alias("sessions"))
        .select(
            "date", "bucket", F.element_at(labels, position).alias("label"), F.element_at(lows, position).alias("lo_s"),
            F.element_at(highs, position).alias("hi_s"), "sessions",
        )
    )


def _sessions_out(sessions: DataFrame, names: Sequence[str]) -> DataFrame:
    from pyspark.sql import functions as F

    name = F.element_at(F.array(*[F.lit(n) for n in names]), F.col("daemon") + 1)
    return sessions.select(
        date_of(F.col("online_ts")).alias("date"), name.alias("daemon"), *uid_columns(),
        "online_seq", "online_ts", "offline_seq", "offline_ts", "duration_s", "end_reason", "open", "device", "end_device",
    )


class Laps:
    """Named wall-clock laps between consecutive marks (which Spark actions cost what)."""

    def __init__(self, echo: bool = False) -> None:
        self.last = time.perf_counter()
        self.laps: dict[str, float] = {}
        self.echo = echo  # a line per step on stderr (progress on a terminal)

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self.last, 3)
        if self.echo:
            print(f"idled pipeline: {name.replace('_', ' ')} done in {now - self.last:.1f} s", file=sys.stderr, flush=True)
        self.last = now


@dataclass
class Tables:
    frames: dict[str, DataFrame]
    counts: dict[str, int]
    lateness_by_detector: list[dict[str, Any]]
    data_end: dict[int, float] = field(default_factory=dict)  # per daemon: the largest ts of its records


def build_tables(
    spark: SparkSession,
    events: DataFrame,
    names: Sequence[str],
    params: FlapParams,
    *,
    event_count: int,
    dedupe: bool = True,
    laps: Laps | None = None,
    grace: float = 0.0,
) -> Tables:
    """The six output DataFrames (lazy, but small collects happen here), plus counts. `grace` > 0: flappers and
    session_lengths count the user sessions joined over it (`merge_grace`).

    `dedupe` false skips the duplicate-seq pass: only safe when no two records of a daemon can share a seq,
    which `run_job` knows from the per-file seq ranges.
    """
    from pyspark.sql import functions as F

    laps = laps or Laps()
    data_end = {row[0]: row[1] for row in events.groupBy("daemon").agg(F.max("ts")).collect()}
    pairs = materialize(pair(events, dedupe))
    online = F.col("online")
    totals = agg_row(pairs.agg(
        F.count(F.when(online, 1)).alias("sessions"),
        F.count(F.when(online & F.col("next_online").isNull(), 1)).alias("open_sessions"),
        F.count(F.when(online & F.col("next_online"), 1)).alias("superseded"),
        F.count(F.when(F.col("orphan"), 1)).alias("orphans"),
    ))
    counts = totals.asDict()
    counts["unique"] = pair_count(events) if dedupe else event_count
    laps.mark("pair")
    sessions = sessions_of(pairs, data_end)
    lateness_input = lateness_input_of(pairs)
    by_detector = _lateness_stats(lateness_input, ["detector"]).orderBy("detector").collect()
    laps.mark("lateness_by_detector")
    concurrency = _concurrency(spark, sessions)
    laps.mark("concurrency_merge")
    user_sessions = merge_grace(sessions, grace) if grace > 0 else sessions
    frames = {
        "sessions": _sessions_out(sessions, names),
        "concurrency": concurrency,
        "lateness": _lateness(lateness_input),
        "flappers": _flappers(user_sessions, params),
        "dau": _dau(sessions),
        "session_lengths": _session_lengths(user_sessions),
    }
    return Tables(frames, counts, [row.asDict() for row in by_detector], data_end)
