"""The Spark job: presence event segments in, Parquet tables + summary out. pyspark is imported lazily.

Theory of operation
-------------------
Each ``--events`` directory is one daemon; Python workers run the daemon's own decoder (`records.iter_rows`)
over its segment files. A corrupt record is skipped and counted, never fatal.

**The paired path** (`paired`, the default). A writer's segments hold a daemon's records in seq order and in
disjoint seq ranges, so each task pairs online/offline while decoding a run of a daemon's consecutive files
and writes the closed sessions into the sessions table itself (`arrowwrite`); only a small carry per (run,
user) -- first and last record, merged minute ranges, short-session starts -- goes on to a second Python
pass that joins each user across runs and daemons (sessions across run edges, open sessions, concurrency,
DAU, flappers) and each detector's lateness values. The driver builds the five small tables from the merged
tallies and writes them the same way. Spark only schedules the Python tasks: no SQL job, shuffle or JVM row
conversion.

**The record path** (`decode`, `pairing`, `aggregate`). If the per-file seq ranges show two files of a
daemon overlapping (a copied or re-cut segment: duplicates possible, in-file order no longer the uid's
order), or a run joined files that are not neighbours in seq, the paired output is discarded and the
records are decoded again into one row each, hash-partitioned by uid once, paired by a window per (user,
daemon) ordered by seq with the duplicate-dropping pass, and the tables are built in the JVM.

**Incremental runs** (``--state``) take the paired path too (`incpaired`: the new bytes paired in Python
tasks -- or, for a small batch on a local master, in a process pool without starting Spark -- the tables'
changed partitions built in Python, `incrtables`), and the record path's steps (`incremental`) when new
files of a daemon overlap in seq; both under the output's lock (`compact`).

Both paths write the same tables, partitioned by ``date`` (`output`), and ``summary.json`` says which ran
(``pairing``); "decode" and "aggregate" times and per-step laps are in its ``timings_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idled.pipeline.aggregate import TABLES, Laps, Tables, build_tables
from idled.pipeline.decode import EVENT_SCHEMA, daemon_names, file_totals, read_events
from idled.pipeline.freshness import log_read_of, watermark_of
from idled.pipeline.output import SmallTables, read_small_tables, summarize, write_summary, write_tables
from idled.pipeline.pool import TaskPool, local_cores
from idled.pipeline.rules import FlapParams, check_grace
from idled.pipeline.spark import master_of, materialize, spark_conf, start_spark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from idled.pipeline.statedir import State

# The job's public names, several defined in the stage modules and re-exported so `idled.pipeline.job` stays
# the one import for callers.
__all__ = [
    "TABLES", "EVENT_SCHEMA", "JobConfig", "JobResult", "start_spark", "spark_conf", "read_events",
    "build_tables", "run_job", "daemon_names",
]


@dataclass(frozen=True, slots=True)
class JobConfig:
    events: tuple[str, ...]
    out: str
    master: str | None = "local[*]"
    driver_memory: str = "6g"
    shuffle_partitions: int = 4
    # decode tasks: the number of runs local segments are cut into (`paired.runs_of_files`, default 2 per
    # core); else the binaryFiles hint, given to each directory (`decode.default_partitions`)
    min_partitions: int | None = None
    flap: FlapParams = FlapParams()
    chart: bool = True
    extra_conf: tuple[tuple[str, str], ...] = ()  # --conf KEY=VALUE, applied last
    # Spark's console progress bar plus a line per finished step on stderr (the CLI sets it on a terminal)
    progress: bool = False
    # --incremental --state DIR: process only what is new since the last run with this state (`incremental`)
    state: str | None = None
    # --grace SECONDS: flappers and session_lengths count sessions joined over a grace (`rules`, rule 6); not
    # available with --incremental
    grace: float = 0.0
    # --local-batch-bytes N: with a local master, the paired path runs in a process pool without starting
    # Spark (`pool`) when its input -- a full run's segment files, an incremental run's new bytes -- is at
    # most N bytes (`incpaired.local_batch`); None: any size; 0: always Spark
    local_batch_bytes: int | None = None

    def __post_init__(self) -> None:
        check_grace(self.grace)
        if self.grace > 0 and self.state is not None:
            raise ValueError("--grace is not supported with --incremental (run a full job)")


@dataclass
class JobResult:
    summary: dict[str, Any]


def run_job(config: JobConfig, spark: SparkSession | None = None) -> JobResult:
    """Decode, aggregate, write Parquet + summary.json (+ chart). Starts Spark unless one is given or active."""
    t0 = time.perf_counter()
    if config.state is not None:
        return _run_incremental(config, spark, t0)
    processes = local_cores(config.master)
    pooled = spark is None and processes is not None and _without_spark(config)
    if pooled:
        with TaskPool(processes or 1, preload=["idled.pipeline.paired"]) as pool:
            result = _run(config, None, t0, pool)  # no JVM, unless the record path must run
        if result is not None:
            return result
    with _session(config, spark, light_jvm=not pooled) as session:
        result = _run(config, session, t0, records=pooled)  # the pool found the paired premise broken
        assert result is not None  # with Spark, a run always finishes
        return result


def _without_spark(config: JobConfig) -> bool:
    """A full run's paired path in a local pool (`pool`): local directories of at most `local_batch_bytes`
    segment bytes (None: any size; 0: always Spark)."""
    if config.local_batch_bytes == 0 or any("://" in directory for directory in config.events):
        return False
    if config.local_batch_bytes is None:
        return True
    total = sum(entry.stat().st_size for directory in config.events for entry in os.scandir(directory)
                if entry.name.endswith(".seg") and entry.is_file())
    return total <= config.local_batch_bytes


@contextlib.contextmanager
def _session(config: JobConfig, spark: SparkSession | None, light_jvm: bool = False) -> Iterator[SparkSession]:
    """`spark`, or a session started for `config`; stopped at the end only if started here (a caller's
    session, e.g. a test's, lives on). `light_jvm`: a session for the paired path, whose JVMs only schedule
    Python tasks (`spark.LIGHT_JVM_OPTIONS`); the record path may then run in it too, slower."""
    from pyspark.sql import SparkSession as _SparkSession

    own_spark = spark is None and _SparkSession.getActiveSession() is None
    if spark is None:
        spark = start_spark(
            config.master, driver_memory=config.driver_memory, shuffle_partitions=config.shuffle_partitions,
            extra_conf=config.extra_conf, progress=config.progress, light_jvm=light_jvm,
        )
    if own_spark:
        _OWNED.add(id(spark))
    try:
        yield spark
    finally:
        if own_spark:
            _OWNED.discard(id(spark))
            stopping = _STOPPING.pop(id(spark), None)
            if stopping is not None:
                stopping.join()
            else:
                spark.stop()


# Sessions started by this run (`_session`), and those already stopping in the background (`_release`).
_OWNED: set[int] = set()
_STOPPING: dict[int, threading.Thread] = {}


def _release(spark: SparkSession | None) -> None:
    """Stop a session this run started, in the background, once no Spark work is left: an incremental run's
    driver work after the Spark tasks (second pass, tables, commit: ~3 s at 10M events a day) then overlaps
    Spark's shutdown (~1 s, executors included) instead of waiting for it at the end."""
    if spark is not None and id(spark) in _OWNED and id(spark) not in _STOPPING:
        stopping = threading.Thread(target=spark.stop, name="idled-spark-stop", daemon=True)
        stopping.start()
        _STOPPING[id(spark)] = stopping


def _decode(spark: SparkSession, config: JobConfig) -> tuple[DataFrame, dict[str, tuple]]:
    """The materialized events, partitioned by user, and the per-file counters."""
    from pyspark.sql import functions as F

    events, accumulator = read_events(spark, config.events, config.min_partitions)
    # Hash-partitioned by user once, here: the pairing window (daemon, uid_key) and every later per-user
    # step (concurrency merge, DAU, flappers) reuse this partitioning instead of shuffling again.
    events = materialize(events.repartition("uid_key").withColumn("uid_hash", F.xxhash64("uid_key")))
    return events, dict(accumulator.value)


def _run(config: JobConfig, spark: SparkSession | None, t0: float, pool: TaskPool | None = None,
         records: bool = False) -> JobResult | None:
    """A full run. Without `spark`, the paired path in `pool` (local processes) -- or None if its premise
    fails (the caller starts Spark for the record path); `records`: straight to the record path."""
    from idled.pipeline.paired import decode_paired, finish_paired

    t_started = time.perf_counter()
    names = daemon_names(config.events)
    decoded = None
    if not records:
        decoded = decode_paired(spark, config.events, config.flap.short_s, config.min_partitions,
                                config.shuffle_partitions, config.out, config.grace, pool)
        files, per_file = decoded.files, decoded.per_file
    laps = Laps(echo=config.progress)
    path = "paired"
    if decoded is None or files["daemons_with_overlapping_files"] > 0 or not decoded.in_seq_order:
        # In-file pairing assumed disjoint, ordered files: decode again and pair record by record (the
        # sessions written by the first pass are overwritten).
        if spark is None:
            return None
        path = "records"
        events, per_file = _decode(spark, config)
        files = file_totals(per_file)
    t_decoded = time.perf_counter()
    event_count = files["records"] - files["malformed"]
    if config.progress:
        print(f"idled pipeline: decoded {event_count:,} events in {t_decoded - t_started:.1f} s", file=sys.stderr, flush=True)
    if decoded is not None and path == "paired":  # (else spark is set: the record path)
        tables, small, written = finish_paired(spark, decoded, names, config.flap, config.out, laps, config.grace,
                                               pool)
    else:
        assert spark is not None
        tables = build_tables(spark, events, names, config.flap, event_count=event_count, dedupe=True, laps=laps,
                              grace=config.grace)
        written = write_tables(tables.frames, config.out, laps)
        small = read_small_tables(spark, tables.frames, written)
    t_aggregated = time.perf_counter()

    timings: dict[str, Any] = {
        "spark_start": round(t_started - t0, 3),
        "decode": round(t_decoded - t_started, 3),
        "aggregate": round(t_aggregated - t_decoded, 3),
        "aggregate_steps": laps.laps,
    }
    summary = summarize(
        names=names, out=config.out, master=_master(config, spark, pool.processes if pool is not None else 1), flap=config.flap, files=files,
        event_count=event_count, tables=tables, small=small, written=written, timings=timings,
    )
    summary["pairing"] = path
    summary.update(watermark_of(names, tables.data_end))
    summary["log_read"] = log_read_of(names, {p: (v[0], v[1], v[5]) for p, v in per_file.items()})
    return _finish(config, summary, timings, small, t0, rated=(event_count, t_decoded - t_started))


def _run_incremental(config: JobConfig, spark: SparkSession | None, t0: float) -> JobResult:
    """An incremental run under the output's lock (`compact.output_lock`: never beside a compaction), after
    finishing an interrupted compaction."""
    from idled.pipeline.compact import finish_compaction, output_lock

    with output_lock(config.out):
        finish_compaction(config.out)
        return _run_incremental_locked(config, spark, t0)


def _run_incremental_locked(config: JobConfig, spark: SparkSession | None, t0: float) -> JobResult:
    """The batch (`_update`) between the state's check (no Spark if nothing is new) and the summary."""
    from idled.pipeline.incremental import load_state, pending_work

    assert config.state is not None
    names = daemon_names(config.events)
    state = load_state(config.state, names, config.out, config.flap)
    work = pending_work(state)
    summary_path = os.path.join(config.out, "summary.json")
    if not work and os.path.exists(summary_path):
        # Nothing new: no Spark, nothing written; the last run's summary stands.
        with open(summary_path) as file:
            summary = json.load(file)
        summary["incremental"] = {"files_decoded": 0, "nothing_new": True}
        return JobResult(summary)
    from idled.pipeline.incpaired import local_batch

    if spark is None and work and local_batch(config.master, work, config.local_batch_bytes):
        return _incremental_in(config, None, t0, state, work)  # a small batch: no JVM to start
    with _session(config, spark, light_jvm=True) as session:
        return _incremental_in(config, session, t0, state, work)


def _incremental_in(config: JobConfig, spark: SparkSession | None, t0: float, state: State,
                    work: list[tuple[int, str, int, int]]) -> JobResult:
    from idled.pipeline.incremental import file_totals_of
    from idled.pipeline.readback import lateness_by_detector, small_tables
    from idled.pipeline.refresh import LATENESS_VALUES

    names = daemon_names(config.events)
    t_started = time.perf_counter()
    laps = Laps(echo=config.progress)
    master = _master(config, spark, local_cores(config.master) or 1)  # (the session may stop during _update)
    data, path = _update(spark, state, config, names, work, laps) if work else (state.data, None)
    t_done = time.perf_counter()
    counts = data["counts"]
    written = {name: os.path.join(config.out, name) for name in TABLES}
    small = small_tables(config.out)  # read back with pyarrow: the summary needs no Spark job
    tables = Tables(
        {}, {"sessions": counts["sessions"], "open_sessions": counts["open_sessions"], "superseded": counts["superseded"],
             "orphans": counts["orphans"], "unique": counts["events"] - counts["duplicates"]},
        lateness_by_detector(os.path.join(state.path, LATENESS_VALUES)),
    )
    laps.mark("summary")
    timings: dict[str, Any] = {"spark_start": round(t_started - t0, 3), "incremental": round(t_done - t_started, 3),
                               "incremental_steps": laps.laps}
    summary = summarize(
        names=names, out=config.out, master=master, flap=config.flap, files=file_totals_of(data),
        event_count=counts["events"], tables=tables, small=small, written=written, timings=timings,
    )
    summary["incremental"] = {"files_decoded": len(work), "nothing_new": False, "state": os.path.abspath(state.path)}
    summary["pairing"] = path
    summary.update(_state_freshness(names, data))
    return _finish(config, summary, timings, small, t0, rated=None)  # (a batch's rate says little of the whole)


def _update(spark: SparkSession | None, state: State, config: JobConfig, names: list[str], work: list[tuple[int, str, int, int]],
            laps: Laps) -> tuple[dict[str, Any], str]:
    """The batch through the paired path (`incpaired`), or -- if two new files of a daemon overlap in seq or
    a run joined files that are not neighbours -- the record path (`incremental.run_incremental`); returns
    the new state's data and which path ran."""
    from idled.pipeline.incpaired import commit_paired, plan_paired
    from idled.pipeline.incremental import run_incremental

    planned = plan_paired(spark, state, config.out, names, config.flap, work, laps, release=_release)
    if planned is None:
        with _session(config, spark) as session:
            return run_incremental(session, state, config.out, names, config.flap, work, laps), "records"
    commit_paired(state, planned, config.out, names, laps)
    return planned.state, "paired"


def _master(config: JobConfig, spark: SparkSession | None, processes: int) -> str:
    return master_of(spark) if spark is not None else f"{config.master} (no Spark: a pool of {processes} processes)"


def _finish(config: JobConfig, summary: dict[str, Any], timings: dict[str, Any], small: SmallTables, t0: float,
            rated: tuple[int, float] | None) -> JobResult:
    """The summary's tail, the same for a full and an incremental run: the chart, the total time (chart
    included), the rates -- ``rated`` is (events, seconds spent decoding them), None for no rates -- then
    summary.json."""
    summary["grace_s"] = config.grace
    if config.chart:
        from idled.pipeline.report import write_chart

        summary["chart"] = write_chart(small.concurrency, os.path.join(config.out, "concurrency.png"))
    total = time.perf_counter() - t0
    timings["total"] = round(total, 3)
    events, decoding = rated if rated is not None else (0, 0.0)
    summary["events_per_s"] = {
        "end_to_end": round(events / total) if rated is not None and total > 0 else None,
        "decode": round(events / decoding) if rated is not None and decoding > 0 else None,
    }
    write_summary(summary, config.out)
    return JobResult(summary)


def _state_freshness(names: list[str], data: dict[str, Any]) -> dict[str, Any]:
    """The summary's freshness keys (`freshness`) from an incremental run's state."""
    daemons = {int(index): entry for index, entry in data["daemons"].items()}
    per_file = {os.path.join(names[index], name): (index, file["size"], file["torn_bytes"])
                for index, entry in daemons.items() for name, file in entry["files"].items()}
    return {**watermark_of(names, {index: entry["data_end"] for index, entry in daemons.items()}),
            "log_read": log_read_of(names, per_file)}
