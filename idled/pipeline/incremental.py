"""Incremental runs: process only the log written since the last run, add what is new to the tables.

Theory of operation
-------------------
The tables of a full run are functions of the *sessions* (plus the idle offlines' lateness values), and a
closed session never changes once its offline is seen. So a run needs the new records, the sessions still
open at the end of the previous run, and -- for the derived tables -- some of the closed sessions already
written. The state directory (``--state DIR``) holds:

* ``state.json`` -- the inputs (daemon directories, in order), the flap parameters and ``--out`` it was made
  with; per daemon its largest seq and ts seen (the seq *watermark* and the data end) and per segment file
  ``consumed`` (bytes decoded: the file's size minus its torn tail) and its counters; cumulative counts;
  the first minute and the last closed-session minute of the concurrency timeline; ``open_files``, the
  files of ``--out``'s sessions table that hold the open sessions.
* ``gen-N/open`` -- open sessions (daemon, uid_key, seq, ts, device): they re-enter the next run as online records.
* ``gen-N/spanning`` -- closed sessions that cross a UTC midnight: the only closed sessions that cover a
  day other than their own ``date`` partition (the paired path keeps their uid_key, online_ts and end only;
  it stores no Spark hash of the uid here or in ``short_sessions``, so the record path recomputes
  ``uid_hash`` from uid_key wherever it reads them).
* ``lateness_values`` -- the lateness values, partitioned by date (exact percentiles need every value of an
  hour), a file added per run; ``short_sessions`` -- the closed short user-ended sessions (what flappers
  count), likewise; ``active_users`` -- per date the distinct users of the closed sessions covering it.

A run decodes each new file from byte 0 and each grown file from its ``consumed`` offset (a record
boundary: the torn tail of the last run is decoded again, complete by now), drops records at or below the
daemon's watermark (a re-copied old segment: counted as duplicates), adds the carried open sessions as
online records, and pairs them exactly as a full run does (`pairing.pair`). That gives the *batch*
sessions B: the new ones, and the carried ones now closed or still open. Every old open session is in B
and old closed rows never change, so the sessions table only grows: B's closed sessions are added as new
files to their date partitions (never rewritten), B's open ones are written to files of their own
(``open-gN-*``) and the previous run's open files are deleted. The derived tables rewrite the dates B
changes, each reading only what it needs of the old sessions (`refresh`).

Two paths compute B and the tables. The paired path (`incpaired`, `incrtables`; the default) pairs the new
bytes in Python tasks and builds every table's changed partitions in Python, as a full run's paired path
does. This module's path -- the record path: rows into Spark, pairing by a window (`pairing.pair`), the
tables in Spark SQL (`refresh`) -- runs when two new files of a daemon overlap in seq (duplicates
possible: the window drops them). Both read and write the same state and ``--out``, so either continues
the other's runs.

Everything is staged under ``state/staging``; a journal (``journal.json``: the moves -- partitions
replaced, files added, the old open files deleted -- and the new state) is written atomically before
anything in ``--out`` changes, and an interrupted run finishes the journal when it next starts, so
``--out`` and the state never disagree. A first run (generation 0) replaces the sessions partitions it
writes whole, like every other table's.

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
from idled.pipeline.refresh import (
    ROW_GROUP_BYTES, SESSION_SCHEMA, SORTED_BY, STATE_TABLES, Refresh, changes_of, read_or_empty, refreshed,
)
from idled.pipeline.rules import FlapParams
from idled.pipeline.statedir import (
    State, StateError, added_moves, apply_journal, commit_journal, date_moves, file_totals_of, load_state, pending_work,
    session_moves,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# State handling lives in `statedir`; re-exported here, the one import for callers.
__all__ = [
    "StateError", "State", "load_state", "pending_work", "apply_journal", "file_totals_of", "run_incremental",
    "SESSION_TABLES",
]

SESSION_TABLES: Final = ("sessions", "concurrency", "lateness", "flappers", "dau", "session_lengths")
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

_SESSION_COLUMNS: Final = tuple(part.split()[0] for part in SESSION_SCHEMA.split(", "))
# The open sessions carried to the next run, re-entering it as online records (with the online's device).
_OPEN_SCHEMA: Final = "daemon INT, uid_key STRING, seq BIGINT, ts DOUBLE, device STRING"


@dataclass
class Batch:
    """What one incremental run computed before writing."""

    refresh: Refresh  # the other tables
    closed_sessions: DataFrame  # rows of the sessions table added as new files
    open_sessions: DataFrame  # the open sessions' rows of the sessions table: files the next run deletes
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


def _plan(spark: SparkSession, state: State, out: str, names: Sequence[str], flap: FlapParams,
          work: list[tuple[int, str, int, int]], laps: Laps) -> Batch:
    from pyspark.sql import functions as F

    from idled.pipeline.aggregate import _sessions_out
    from idled.pipeline.pairing import lateness_input_of, pair, sessions_of, span
    from idled.pipeline.spark import agg_row, materialize

    sc = spark.sparkContext
    data = json.loads(json.dumps(state.data))  # the new state, a deep copy
    accumulator = sc.accumulator({}, PerFileStats())
    rdd = sc.parallelize(work, max(1, min(len(work), 2 * sc.defaultParallelism)))
    batch = spark.createDataFrame(rdd.mapPartitions(functools.partial(_decode_tails, accumulator)), EVENT_SCHEMA, verifySchema=False)
    old_gen = state.gen_dir()
    carried = read_or_empty(spark, os.path.join(old_gen, "open"), _OPEN_SCHEMA)
    carried_events = carried.select(
        "daemon", "seq", F.lit(True).alias("online"), "uid_key", "ts", F.lit(None).cast("string").alias("reason"),
        F.lit(None).cast("double").alias("deadline"), F.lit(None).cast("string").alias("detector"), "device",
        F.lit(None).cast("double").alias("grace"),
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
    totals = agg_row(sessions.agg(
        F.count("*"), F.count(F.when(F.col("open"), 1)), F.count(F.when(F.col("end_reason") == "superseded", 1)),
        F.count(F.when(F.col("carried"), 1)), F.min("m0"), F.max("m1"), F.max(F.when(~F.col("open"), F.col("m1"))),
    ))
    counts["sessions"] += totals[0] - totals[3]
    counts["open_sessions"] = totals[1]
    counts["superseded"] += totals[2]
    counts["orphans"] += pairs.where(F.col("orphan")).count()
    laps.mark("pair")

    old_last = data["last_minute"]
    extent = _extent(data, totals)
    lateness_new = lateness_input_of(pairs).withColumn("date", F.date_from_unix_date(F.floor(F.col("hour_start") / _DAY).cast("int")))
    change = changes_of(sessions, lateness_new, flap, extent, old_last)
    laps.mark("changed_days")
    # the paired path stores no uid_hash (Spark's xxhash64): computed here for every stored row alike
    spanning_old = read_or_empty(spark, os.path.join(old_gen, "spanning"), SESSION_SCHEMA).withColumn("uid_hash", F.xxhash64("uid_key"))
    refresh = refreshed(spark, out, state.path, spanning_old, flap, sessions, change, extent[1], laps)
    is_open = F.col("open")
    spanning_new = sessions.where(~is_open & (F.col("d1") > F.col("d0"))).select(*_SESSION_COLUMNS)
    open_rows = sessions.where(is_open).select("daemon", "uid_key", F.col("online_seq").alias("seq"), F.col("online_ts").alias("ts"),
                                               "device")
    data["generation"] = state.generation + 1
    return Batch(refresh, _sessions_out(sessions.where(~is_open), names), _sessions_out(sessions.where(is_open), names),
                 data, open_rows, spanning_old.unionByName(spanning_new))


def _session_moves(state: State, batch: Batch, staging: str, out: str, laps: Laps) -> tuple[list[tuple[str | None, str]], list[str]]:
    """Stage B's sessions: the moves that put them into ``--out``, and the open ones' files (relative)."""
    closed_root, open_root = os.path.join(staging, "sessions"), os.path.join(staging, "sessions_open")
    for frame, root in ((batch.closed_sessions, closed_root), (batch.open_sessions, open_root)):
        frame.coalesce(1).sortWithinPartitions(*SORTED_BY).write.option("parquet.block.size", ROW_GROUP_BYTES) \
            .partitionBy("date").parquet(root)
    laps.mark("write_sessions")
    return session_moves(state, batch.state["generation"], closed_root, open_root, out)


def _commit(state: State, batch: Batch, out: str, laps: Laps) -> None:
    """Stage every changed partition, every added file and the new state, journal the moves, apply them."""
    staging = os.path.join(state.path, "staging")
    shutil.rmtree(staging, ignore_errors=True)
    new_gen = state.gen_dir(batch.state["generation"])
    shutil.rmtree(new_gen, ignore_errors=True)
    batch.open_rows.write.parquet(os.path.join(new_gen, "open"))
    batch.spanning.coalesce(1).write.parquet(os.path.join(new_gen, "spanning"))
    laps.mark("write_state")
    moves, batch.state["open_files"] = _session_moves(state, batch, staging, out, laps)
    for table, frame in batch.refresh.added.items():
        staged_root = os.path.join(staging, table)
        frame.coalesce(1).write.partitionBy("date").parquet(staged_root)
        moves += added_moves(staged_root, os.path.join(state.path, table), f"g{batch.state['generation']}-")
        laps.mark(f"write_{table}")
    for table, dates in batch.refresh.dates.items():
        staged_root = os.path.join(staging, table)
        rewritten = batch.refresh.frames.get(table)
        if rewritten is not None:
            rewritten.coalesce(1).write.partitionBy("date").parquet(staged_root)
            laps.mark(f"write_{table}")
        target_root = os.path.join(state.path if table in STATE_TABLES else out, table)
        moves += date_moves(staged_root, target_root, dates)
    for table in SESSION_TABLES:
        os.makedirs(os.path.join(out, table), exist_ok=True)
    commit_journal(state.path, moves, batch.state)
    laps.mark("commit")


def run_incremental(spark: SparkSession, state: State, out: str, names: Sequence[str], flap: FlapParams,
                    work: list[tuple[int, str, int, int]], laps: Laps) -> dict[str, Any]:
    """Process `work`, rewrite the changed partitions of `out`; returns the new state's data."""
    batch = _plan(spark, state, out, names, flap, work, laps)
    _commit(state, batch, out, laps)
    return batch.state
