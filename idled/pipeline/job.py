"""The Spark job: presence event segments in, Parquet tables + summary out. pyspark is imported lazily.

Theory of operation
-------------------
**Decode** (Python workers). Each ``--events`` directory is one daemon, numbered by its position on the
command line. ``sc.binaryFiles(DIR/*.seg, minPartitions)`` hands whole segment files to ``mapPartitions``,
which runs `records.iter_rows` -- i.e. the daemon's own ``eventlog.decode_buffer`` -- and yields flat tuples
that become a DataFrame with the explicit `EVENT_SCHEMA`. Per-file counters (bytes, records, corrupt,
malformed, torn bytes, seq range) go into an accumulator that maps file -> counters and merges by
*replacing*, so a task that Spark re-runs reports the same numbers again instead of adding them twice. A
corrupt record is skipped and counted, never fatal. The events are hash-partitioned by uid once and
materialized (`_materialize`): that action is the "decode" time. Every later per-user step -- pairing,
concurrency merge, DAU, flappers -- reuses this partitioning: the job shuffles the 10M-row data set once.

**Pairing** (JVM from here on). One window per (user, daemon) ordered by seq; ``lag``/``lead`` give each record
its neighbours, which is all `rules` needs: an online's successor decides how its session ends; an offline
whose predecessor is not an online is an orphan. Duplicate seqs can only exist when two files of a daemon
have overlapping seq ranges (a writer's segments never do); only then does the job add the window pass that
drops them. The rows later steps read -- onlines, orphans, offlines with a deadline -- are materialized as
``pairs``; sessions and the lateness input are projections of it.

**Tables.**

* concurrency: per user, minute ranges ``[floor(start/60), ceil(end/60)-1]`` sorted and merged with a running
  max (two sessions touching the same minute count once), then +1/-1 at range ends summed per minute and a
  running sum over the (few thousand) minutes;
* dau: day ranges exploded with ``sequence`` (sessions span few days), distinct per user and day;
* flappers: a RANGE window of ``window_s`` seconds over each user's short-session starts;
* lateness: exact percentiles per (detector, hour) by ranking (`_lateness_stats`);
* session_lengths: a bucket index per closed session, counted per day.

Each is written as Parquet partitioned by ``date``; "aggregate" time covers all of that (per-step laps are
in ``summary.json``). The driver then collects the small tables for ``summary.json``, the stdout report and
the chart.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from idled.pipeline.records import UID_INT, UID_STR, FileStats, Row, iter_rows, seq_ranges_overlap
from idled.pipeline.rules import BUCKETS, NOT_USER_ENDS, SUPERSEDED, FlapParams, bucket_label

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "TABLES", "EVENT_SCHEMA", "JobConfig", "JobResult", "start_spark", "spark_conf", "read_events",
    "build_tables", "run_job", "daemon_names",
]

TABLES: Final = ("sessions", "concurrency", "lateness", "flappers", "dau", "session_lengths")

EVENT_SCHEMA: Final = (
    "daemon INT, seq BIGINT, online BOOLEAN, uid_key STRING, ts DOUBLE, reason STRING, deadline DOUBLE, detector STRING"
)

# Root at WARN: Spark compares the root level with its own default (WARN) when the driver is Python and
# prints "Setting default log level to ..." if they differ. The chatty WARN sources are raised to ERROR.
_LOG4J: Final = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.window.name = org.apache.spark.sql.execution.window
logger.window.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


@dataclass(frozen=True, slots=True)
class JobConfig:
    events: tuple[str, ...]
    out: str
    master: str | None = "local[*]"
    driver_memory: str = "6g"
    shuffle_partitions: int = 4
    min_partitions: int | None = None  # binaryFiles hint; default: one per 32 MiB of segments, >= 2 per core
    flap: FlapParams = FlapParams()
    chart: bool = True
    extra_conf: tuple[tuple[str, str], ...] = ()  # --conf KEY=VALUE, applied last


@dataclass
class JobResult:
    summary: dict[str, Any]


# ---------------------------------------------------------------------------------------------- Spark


def _is_local(master: str | None) -> bool:
    return master is not None and master.startswith("local")


def spark_conf(master: str | None, *, driver_memory: str = "6g", shuffle_partitions: int = 4) -> dict[str, str]:
    """Settings for a small machine: quiet, no UI, few shuffle partitions, UTC."""
    conf = {
        "spark.app.name": "idled-pipeline",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": driver_memory,
        # Materialized row blocks (`_materialize`) are serialized; Kryo writes UnsafeRows as raw bytes.
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
    }
    log4j = os.path.join(tempfile.gettempdir(), f"idled-pipeline-log4j2-{os.getuid()}.properties")
    try:
        with open(log4j) as file:
            current = file.read()
    except FileNotFoundError:
        current = None
    if current != _LOG4J:
        with open(log4j + ".tmp", "w") as file:
            file.write(_LOG4J)
        os.replace(log4j + ".tmp", log4j)
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    if _is_local(master):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    return conf


def start_spark(
    master: str | None = "local[*]",
    *,
    driver_memory: str = "6g",
    shuffle_partitions: int = 4,
    extra_conf: Sequence[tuple[str, str]] = (),
) -> SparkSession:
    """A SparkSession for the job. master None: whatever spark-submit configured."""
    if _is_local(master):
        # Local workers are child processes: they must run this interpreter to import msgpack and idled.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    conf = spark_conf(master, driver_memory=driver_memory, shuffle_partitions=shuffle_partitions)
    conf.update(extra_conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ---------------------------------------------------------------------------------------------- decode


class PerFileStats:
    """AccumulatorParam (duck-typed, so this module need not import pyspark): path -> counters, last wins."""

    def zero(self, value: dict[str, tuple]) -> dict[str, tuple]:
        return {}

    def addInPlace(self, value1: dict[str, tuple], value2: dict[str, tuple]) -> dict[str, tuple]:  # noqa: N802
        value1.update(value2)
        return value1


def _decode_files(daemon: int, accumulator: Any, files: Iterator[tuple[str, bytes]]) -> Iterator[Row]:
    for path, data in files:
        stats = FileStats()
        yield from iter_rows(data, daemon, stats)
        accumulator.add({path: (daemon, *stats.as_tuple())})


def daemon_names(dirs: Sequence[str]) -> list[str]:
    """The name of each daemon in the output: its directory, absolute when it is a local path."""
    return [d if "://" in d else os.path.abspath(d) for d in dirs]


_SPLIT_BYTES: Final = 32 * 1024 * 1024


def _default_partitions(dirs: Sequence[str], parallelism: int) -> int:
    """About one partition per 32 MiB of local segments (a file is never split: whole files are decoded),
    at least two per core, so the last tasks of the decode stage are short and both cores stay busy."""
    total = 0
    for directory in dirs:
        if "://" in directory:
            continue
        for entry in os.scandir(directory):
            if entry.name.endswith(".seg") and entry.is_file():
                total += entry.stat().st_size
    return max(2 * parallelism, -(-total // _SPLIT_BYTES))


def read_events(spark: SparkSession, dirs: Sequence[str], min_partitions: int | None = None) -> tuple[DataFrame, Any]:
    """(events DataFrame with EVENT_SCHEMA, accumulator of per-file stats). Nothing runs until an action."""
    import functools

    sc = spark.sparkContext
    accumulator = sc.accumulator({}, PerFileStats())
    partitions = min_partitions or _default_partitions(dirs, sc.defaultParallelism)
    rdds = []
    for daemon, directory in enumerate(daemon_names(dirs)):
        files = sc.binaryFiles(directory.rstrip("/") + "/*.seg", minPartitions=partitions)
        rdds.append(files.mapPartitions(functools.partial(_decode_files, daemon, accumulator)))
    rdd = rdds[0] if len(rdds) == 1 else sc.union(rdds)
    return spark.createDataFrame(rdd, EVENT_SCHEMA), accumulator


# ---------------------------------------------------------------------------------------------- tables


# A user, as window/grouping keys: the 64-bit hash first, so sorts settle almost every comparison on an
# 8-byte prefix instead of comparing uid strings ("i:1000123" vs "i:1000124" share their first 8 bytes);
# uid_key after it keeps two users apart even if their hashes collide.
_USER: Final = ("uid_hash", "uid_key")


def _materialize(frame: DataFrame) -> DataFrame:
    """Compute `frame` once and keep its rows for the several queries that read it.

    A local checkpoint stores Spark's binary rows as they are, Kryo-serialized (memory, spilling to disk);
    `cache()` re-encodes them into compressed column batches, the top frame of sampled executor stacks, and
    keeping them deserialized cost ~30 CPU-seconds of GC at 10M events. The plan is cut here and the frame's
    partitioning (by user) is kept for later steps. Blocks are freed when the DataFrame is garbage-collected.
    """
    from pyspark import StorageLevel

    return frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)


def _date(seconds: Column) -> Column:
    from pyspark.sql import functions as F

    return F.date_from_unix_date(F.floor(seconds / 86400).cast("int"))


def _span(start: Column, end: Column, unit: int) -> tuple[Column, Column]:
    """rules._span as columns: first and last unit index [start, end) touches."""
    from pyspark.sql import functions as F

    first = F.floor(start / unit)
    return first, F.when(end > start, F.ceil(end / unit) - 1).otherwise(first)


def _uid_columns() -> list[Column]:
    from pyspark.sql import functions as F

    return [
        F.expr("substring(uid_key, 3)").alias("uid"),
        F.when(F.col("uid_key").startswith("i:"), F.lit(UID_INT)).otherwise(F.lit(UID_STR)).alias("uid_type"),
    ]


def _pair(events: DataFrame, dedupe: bool) -> DataFrame:
    """Each record with its neighbours; keeps the rows later steps read: onlines (sessions), offlines that
    are orphans or carry a deadline (lateness)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy(*_USER, "daemon").orderBy("seq")
    if dedupe:
        events = (
            events.withColumn("_prev_seq", F.lag("seq").over(window))
            .where(F.col("_prev_seq").isNull() | (F.col("_prev_seq") != F.col("seq")))
            .drop("_prev_seq")
        )
    orphan = ~F.col("online") & ~F.coalesce(F.lag("online").over(window), F.lit(False))
    paired = events.select(
        "daemon", "uid_hash", "uid_key", "online", "seq", "ts", "deadline", "detector",
        orphan.alias("orphan"),
        F.lead("online").over(window).alias("next_online"),
        F.lead("seq").over(window).alias("next_seq"),
        F.lead("ts").over(window).alias("next_ts"),
        F.lead("reason").over(window).alias("next_reason"),
    )
    return paired.where(F.col("online") | F.col("orphan") | F.col("deadline").isNotNull())


def _sessions(paired: DataFrame, data_end: dict[int, float]) -> DataFrame:
    from pyspark.sql import functions as F

    if data_end:
        ends = F.create_map(*[F.lit(x) for daemon, end in data_end.items() for x in (daemon, end)])[F.col("daemon")]
    else:
        ends = F.lit(None).cast("double")  # no events at all
    is_open = F.col("next_online").isNull()
    return paired.where(F.col("online")).select(
        "daemon",
        "uid_key",
        "uid_hash",
        F.col("seq").alias("online_seq"),
        F.col("ts").alias("online_ts"),
        F.col("next_seq").alias("offline_seq"),
        F.col("next_ts").alias("offline_ts"),
        (F.col("next_ts") - F.col("ts")).alias("duration_s"),
        F.when(F.col("next_online"), F.lit(SUPERSEDED)).otherwise(F.col("next_reason")).alias("end_reason"),
        is_open.alias("open"),
        F.greatest(F.coalesce(F.col("next_ts"), ends), F.col("ts")).alias("end"),
    )


def _concurrency(spark: SparkSession, sessions: DataFrame) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first, last = _span(F.col("online_ts"), F.col("end"), 60)
    spans = sessions.select(*_USER, first.alias("m0"), last.alias("m1"))
    by_user = Window.partitionBy(*_USER).orderBy("m0", "m1")
    before = by_user.rowsBetween(Window.unboundedPreceding, -1)
    upto = by_user.rowsBetween(Window.unboundedPreceding, 0)
    starts = F.when(F.col("_prev_max").isNull() | (F.col("m0") > F.col("_prev_max")), 1).otherwise(0)
    merged = (
        spans.withColumn("_prev_max", F.max("m1").over(before))
        .withColumn("_group", F.sum(starts).over(upto))
        .groupBy(*_USER, "_group")
        .agg(F.min("m0").alias("m0"), F.max("m1").alias("m1"))
    )
    deltas = (
        merged.select(F.col("m0").alias("minute"), F.lit(1).alias("d"))
        .unionAll(merged.select((F.col("m1") + 1).alias("minute"), F.lit(-1).alias("d")))
        .groupBy("minute")
        .agg(F.sum("d").alias("d"))
    )
    deltas = _materialize(deltas)  # a few thousand rows; without it the write below would redo the merge
    bounds = deltas.agg(F.min("minute"), F.max("minute")).first()
    if bounds is None or bounds[0] is None:
        return spark.createDataFrame([], "date DATE, minute_start BIGINT, users_online BIGINT")
    # Every minute from the first to the one before the last delta (which brings the count back to 0).
    minutes = spark.range(bounds[0], bounds[1], 1, 1).withColumnRenamed("id", "minute")
    timeline = Window.orderBy("minute").rowsBetween(Window.unboundedPreceding, 0)
    return (
        minutes.join(F.broadcast(deltas), "minute", "left")
        .select("minute", F.sum(F.coalesce(F.col("d"), F.lit(0))).over(timeline).alias("users_online"))
        .select(
            _date(F.col("minute") * 60).alias("date"),
            (F.col("minute") * 60).alias("minute_start"),
            F.col("users_online").cast("bigint").alias("users_online"),
        )
    )


def _lateness_input(paired: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    # records.to_row keeps a deadline only on idle offlines
    return paired.where(~F.col("online") & F.col("deadline").isNotNull()).select(
        "detector",
        (F.floor(F.col("ts") / 3600) * 3600).alias("hour_start"),
        (F.col("ts") - F.col("deadline")).alias("lateness"),
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
        _date(F.col("hour_start")).alias("date"), "hour_start", "detector", "offlines", "early", "p50_s", "p99_s", "max_s"
    )


def _flappers(sessions: DataFrame, params: FlapParams) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    user_end = F.col("end_reason").isNull() | ~F.col("end_reason").isin(*sorted(NOT_USER_ENDS))
    short = sessions.where(~F.col("open") & (F.col("duration_s") < params.short_s) & user_end)
    window = Window.partitionBy(*_USER).orderBy("online_ts").rangeBetween(-params.window_s, 0)
    flagged = F.col("in_window") >= params.k
    return (
        short.select(*_USER, "online_ts", F.count("*").over(window).alias("in_window"))
        .groupBy("uid_key", _date(F.col("online_ts")).alias("date"))
        .agg(
            F.count("*").alias("short_sessions"),
            F.max(F.when(flagged, F.col("in_window"))).alias("max_in_window"),
            F.min(F.when(flagged, F.col("online_ts"))).alias("first_flagged_ts"),
        )
        .where(F.col("first_flagged_ts").isNotNull())
        .select("date", *_uid_columns(), "short_sessions", "max_in_window", "first_flagged_ts")
    )


def _dau(sessions: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    first, last = _span(F.col("online_ts"), F.col("end"), 86400)
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
        .groupBy(_date(F.col("online_ts")).alias("date"), bucket.alias("bucket"))
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
        _date(F.col("online_ts")).alias("date"), name.alias("daemon"), *_uid_columns(),
        "online_seq", "online_ts", "offline_seq", "offline_ts", "duration_s", "end_reason", "open",
    )


class Laps:
    """Named wall-clock laps between consecutive marks (which Spark actions cost what)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self.last, 3)
        self.last = now


@dataclass
class Tables:
    frames: dict[str, DataFrame]
    counts: dict[str, int]
    lateness_by_detector: list[dict[str, Any]]


def build_tables(
    spark: SparkSession,
    events: DataFrame,
    names: Sequence[str],
    params: FlapParams,
    *,
    event_count: int,
    dedupe: bool = True,
    laps: Laps | None = None,
) -> Tables:
    """The six output DataFrames (lazy, but small collects happen here), plus counts.

    `dedupe` false skips the duplicate-seq pass: only safe when no two records of a daemon can share a seq,
    which `run_job` knows from the per-file seq ranges.
    """
    from pyspark.sql import functions as F

    laps = laps or Laps()
    data_end = {row[0]: row[1] for row in events.groupBy("daemon").agg(F.max("ts")).collect()}
    pairs = _materialize(_pair(events, dedupe))
    online = F.col("online")
    totals = pairs.agg(
        F.count(F.when(online, 1)).alias("sessions"),
        F.count(F.when(online & F.col("next_online").isNull(), 1)).alias("open_sessions"),
        F.count(F.when(online & F.col("next_online"), 1)).alias("superseded"),
        F.count(F.when(F.col("orphan"), 1)).alias("orphans"),
    ).first()
    counts = totals.asDict()
    counts["unique"] = _pair_count(events) if dedupe else event_count
    laps.mark("pair")
    sessions = _sessions(pairs, data_end)
    lateness_input = _lateness_input(pairs)
    by_detector = _lateness_stats(lateness_input, ["detector"]).orderBy("detector").collect()
    laps.mark("lateness_by_detector")
    concurrency = _concurrency(spark, sessions)
    laps.mark("concurrency_merge")
    frames = {
        "sessions": _sessions_out(sessions, names),
        "concurrency": concurrency,
        "lateness": _lateness(lateness_input),
        "flappers": _flappers(sessions, params),
        "dau": _dau(sessions),
        "session_lengths": _session_lengths(sessions),
    }
    return Tables(frames, counts, [row.asDict() for row in by_detector])


def _pair_count(events: DataFrame) -> int:
    """Records left after dropping duplicate (daemon, uid, seq): one more pass, only when overlaps exist."""
    return events.dropDuplicates(["daemon", "uid_key", "seq"]).count()


# ---------------------------------------------------------------------------------------------- run


def _file_totals(per_file: dict[str, tuple]) -> dict[str, int]:
    """Counters summed over files, plus how many daemons have files with overlapping seq ranges."""
    totals = {"files": len(per_file), "bytes": 0, "records": 0, "corrupt": 0, "malformed": 0, "torn_bytes": 0, "broken_files": 0}
    ranges: dict[int, list[tuple[int | None, int | None, int]]] = {}
    for daemon, size, records, corrupt, malformed, torn, broken, low, high, unordered in per_file.values():
        totals["bytes"] += size
        totals["records"] += records
        totals["corrupt"] += corrupt
        totals["malformed"] += malformed
        totals["torn_bytes"] += torn
        totals["broken_files"] += int(broken)
        ranges.setdefault(daemon, []).append((low, high, unordered))
    totals["daemons_with_overlapping_files"] = sum(1 for r in ranges.values() if seq_ranges_overlap(r))
    return totals


def run_job(config: JobConfig, spark: SparkSession | None = None) -> JobResult:
    """Decode, aggregate, write Parquet + summary.json (+ chart). Starts Spark unless one is given or active."""
    from pyspark.sql import SparkSession as _SparkSession

    t0 = time.perf_counter()
    # Stop Spark at the end only if this call started it (a caller's session, e.g. a test's, lives on).
    own_spark = spark is None and _SparkSession.getActiveSession() is None
    if spark is None:
        spark = start_spark(
            config.master, driver_memory=config.driver_memory, shuffle_partitions=config.shuffle_partitions,
            extra_conf=config.extra_conf,
        )
    try:
        return _run(config, spark, t0)
    finally:
        if own_spark:
            spark.stop()


def _run(config: JobConfig, spark: SparkSession, t0: float) -> JobResult:
    from pyspark.sql import functions as F

    t_started = time.perf_counter()
    names = daemon_names(config.events)

    events, accumulator = read_events(spark, config.events, config.min_partitions)
    # Hash-partitioned by user once, here: the pairing window (daemon, uid_key) and every later per-user
    # step (concurrency merge, DAU, flappers) reuse this partitioning instead of shuffling again.
    events = _materialize(events.repartition("uid_key").withColumn("uid_hash", F.xxhash64("uid_key")))
    t_decoded = time.perf_counter()
    files = _file_totals(accumulator.value)
    event_count = files["records"] - files["malformed"]

    laps = Laps()
    dedupe = files["daemons_with_overlapping_files"] > 0
    tables = build_tables(spark, events, names, config.flap, event_count=event_count, dedupe=dedupe, laps=laps)
    os.makedirs(config.out, exist_ok=True)
    written: dict[str, str] = {}
    for name in TABLES:
        frame = tables.frames[name]
        if name != "sessions":
            frame = frame.coalesce(1)  # small tables: one file per date, not one per shuffle partition
        path = os.path.join(config.out, name)
        frame.write.mode("overwrite").partitionBy("date").parquet(path)
        written[name] = path
        laps.mark(f"write_{name}")
    out = config.out

    def read_back(name: str) -> DataFrame:
        # The small tables are read back rather than recomputed; with their schema, so an empty table reads.
        return spark.read.schema(tables.frames[name].schema).parquet(written[name])

    concurrency = [
        (row["minute_start"], row["users_online"])
        for row in read_back("concurrency").select("minute_start", "users_online").orderBy("minute_start").collect()
    ]
    dau = [row.asDict() for row in read_back("dau").orderBy("date").collect()]
    flapper_rows = read_back("flappers").agg(F.count("*"), F.countDistinct("uid", "uid_type")).first()
    t_aggregated = time.perf_counter()

    peak = max(concurrency, key=lambda x: x[1], default=(None, 0))
    summary: dict[str, Any] = {
        "inputs": names,
        "out": os.path.abspath(out),
        "master": spark.sparkContext.master,
        "flap_params": {"k": config.flap.k, "short_s": config.flap.short_s, "window_s": config.flap.window_s},
        "counts": {
            **files,
            "events": event_count,
            "duplicates": event_count - tables.counts["unique"],
            "sessions": tables.counts["sessions"],
            "open_sessions": tables.counts["open_sessions"],
            "superseded_sessions": tables.counts["superseded"],
            "orphan_offlines": tables.counts["orphans"],
            "flapper_user_days": flapper_rows[0],
            "flapper_users": flapper_rows[1],
        },
        "peak_concurrency": {"minute_start": peak[0], "users_online": peak[1]},
        "dau": [{"date": str(row["date"]), "active_users": row["active_users"], "sessions_started": row["sessions_started"]} for row in dau],
        "lateness_by_detector": tables.lateness_by_detector,
        "tables": written,
        "timings_s": {
            "spark_start": round(t_started - t0, 3),
            "decode": round(t_decoded - t_started, 3),
            "aggregate": round(t_aggregated - t_decoded, 3),
            "aggregate_steps": laps.laps,
        },
    }
    if config.chart:
        from idled.pipeline.report import write_chart

        summary["chart"] = write_chart(concurrency, os.path.join(out, "concurrency.png"))
    total = time.perf_counter() - t0
    summary["timings_s"]["total"] = round(total, 3)
    summary["events_per_s"] = {
        "end_to_end": round(event_count / total) if total > 0 else None,
        "decode": round(event_count / (t_decoded - t_started)) if t_decoded > t_started else None,
    }
    with open(os.path.join(out, "summary.json"), "w") as file:
        json.dump(summary, file, indent=2, default=str)
        file.write("\n")
    return JobResult(summary)
