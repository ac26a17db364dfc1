"""The job's paired path: sessions paired while decoding, users finished in a second Python pass.

Theory of operation
-------------------
**Decode and pair** (`decode_paired`, Python workers). Each segment file is decoded (`records.iter_rows`)
and paired inside the file (`filepass.pair_file`). The only rows that cross into the JVM are the file's
*closed sessions*, seven columns each (`SESSION_SCHEMA`) -- half as many rows as records -- and that Spark
job writes them straight into the sessions table: nothing is checkpointed, sorted or shuffled. The rest of
a file's pass travels in an accumulator (path -> counters, tallies, data end and the file's carries and
lateness values, pickled into one blob per second-pass partition; keyed by path and merged by replacing, so
a re-run task is not counted twice). If the per-file seq ranges show two files of a daemon overlapping, the
job discards all this and takes the record path (`job`), which overwrites the sessions table.

**Users and detectors** (`finish_paired`, Python workers again). The blobs -- ~1.1M carries at 10M
events, ~120 MB -- are grouped on the driver by partition (`part_of`: the uid_key's, or the detector's,
CRC32) and parallelized, one partition each; `userpass` joins each user's carries across files and daemons
(sessions across file edges, open sessions, concurrency ranges, days, flap windows) and each detector's
values. Its sessions are appended to the sessions table; each partition's tallies come back through an
accumulator.

**Tables.** The five small tables are built on the driver from the merged tallies with the reference's row
builders (`reference`), handed to Spark as a few thousand rows and written like the record path's.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import pickle
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from idled.pipeline.aggregate import Laps, Tables, _sessions_out
from idled.pipeline.decode import PerFileStats, daemon_names, default_partitions, file_totals
from idled.pipeline.filepass import FileResult, Session, pair_file
from idled.pipeline.output import SmallTables
from idled.pipeline.records import FileStats, iter_rows
from idled.pipeline.reference import concurrency_rows, dau_rows, session_length_rows
from idled.pipeline.rules import FlapParams
from idled.pipeline.tally import Tally
from idled.pipeline.userpass import PartitionResult, finish_detector, finish_user

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SESSION_SCHEMA", "Decoded", "decode_paired", "finish_paired", "small_table_rows", "part_of"]

SESSION_SCHEMA: Final = (
    "daemon INT, uid_key STRING, online_seq BIGINT, online_ts DOUBLE, offline_seq BIGINT, offline_ts DOUBLE, "
    "end_reason STRING"
)
_PICKLE: Final = pickle.HIGHEST_PROTOCOL

_SMALL_SCHEMAS: Final = {
    "concurrency": "date DATE, minute_start BIGINT, users_online BIGINT",
    "lateness": "date DATE, hour_start BIGINT, detector STRING, offlines BIGINT, early BIGINT, p50_s DOUBLE, "
                "p99_s DOUBLE, max_s DOUBLE",
    "flappers": "date DATE, uid STRING, uid_type STRING, short_sessions BIGINT, max_in_window BIGINT, "
                "first_flagged_ts DOUBLE",
    "dau": "date DATE, active_users BIGINT, sessions_started BIGINT",
    "session_lengths": "date DATE, bucket INT, label STRING, lo_s DOUBLE, hi_s DOUBLE, sessions BIGINT",
}


def part_of(key: str, parts: int) -> int:
    """The second pass's partition of a uid_key or detector: the same in every process (unlike `hash`)."""
    return zlib.crc32(key.encode()) % parts


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a pass builds millions of small acyclic objects: the collector
    would run every few hundred allocations for nothing (it tripled the cost of unpickling the carries)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _blobs(daemon: int, result: FileResult, parts: int) -> list[tuple[int, bytes]]:
    """A file's carries and lateness values as one pickled blob per second-pass partition."""
    carries: list[dict[str, Any]] = [{} for _ in range(parts)]
    for key, carry in result.carries.items():
        carries[part_of(key, parts)][key] = carry
    lateness: list[dict[str, Any]] = [{} for _ in range(parts)]
    for detector, hours in result.lateness.items():
        lateness[part_of(detector, parts)][detector] = hours
    return [(part, pickle.dumps((daemon, carries[part], lateness[part]), _PICKLE))
            for part in range(parts) if carries[part] or lateness[part]]


def _decode_files(daemon: int, short_s: float, parts: int, accumulator: Any,
                  files: Iterator[tuple[str, bytes]]) -> Iterator[Session]:
    """Executors: each (path, bytes) of one daemon's segment files -> its closed sessions; the rest of the
    file's pass goes to `accumulator` (path -> counters, tally, data end, carry blobs)."""
    with _gc_paused():
        for path, data in files:
            stats = FileStats()
            result = pair_file(iter_rows(data, daemon, stats), short_s)
            del data
            yield from result.sessions
            accumulator.add({path: (daemon, stats.as_tuple(), result.tally, result.data_end, _blobs(daemon, result, parts))})


@dataclass
class Decoded:
    """What the driver learned from the first pass (its sessions are written already)."""

    files: dict[str, int]  # `decode.file_totals`
    tally: Tally  # in-file sessions
    data_end: dict[int, float]  # per daemon: the largest ts of its records
    blobs: list[list[bytes]]  # carry blobs per second-pass partition


def _sessions_frame(spark: SparkSession, rdd: Any, names: Sequence[str]) -> DataFrame:
    from pyspark.sql import functions as F

    # Rows are built to the schema; Spark's per-row type check would cost ~2.7 us a row in Python.
    frame = spark.createDataFrame(rdd, SESSION_SCHEMA, verifySchema=False)
    return _sessions_out(
        frame.withColumn("duration_s", F.col("offline_ts") - F.col("online_ts")).withColumn("open", F.col("offline_seq").isNull()),
        names,
    )


def decode_paired(spark: SparkSession, dirs: Sequence[str], short_s: float, min_partitions: int | None, parts: int,
                  sessions_path: str) -> Decoded:
    """The first pass: decode and pair every file, writing its closed sessions to `sessions_path` on the
    way (no checkpoint of millions of rows); `parts` is the number of partitions of the second pass."""
    sc = spark.sparkContext
    partitions = min_partitions or default_partitions(dirs, sc.defaultParallelism)
    accumulator = sc.accumulator({}, PerFileStats())
    names = daemon_names(dirs)
    rdds = []
    for daemon, directory in enumerate(names):
        files = sc.binaryFiles(directory.rstrip("/") + "/*.seg", minPartitions=partitions)
        rdds.append(files.mapPartitions(functools.partial(_decode_files, daemon, short_s, parts, accumulator)))
    rdd = rdds[0] if len(rdds) == 1 else sc.union(rdds)
    _sessions_frame(spark, rdd, names).write.mode("overwrite").partitionBy("date").parquet(sessions_path)
    per_file: dict[str, tuple] = {}
    tally = Tally()
    data_end: dict[int, float] = {}
    blobs: list[list[bytes]] = [[] for _ in range(parts)]
    for path, (daemon, stats, file_tally, end, file_blobs) in accumulator.value.items():
        per_file[path] = (daemon, *stats)
        tally.merge(file_tally)
        if end is not None:
            data_end[daemon] = max(end, data_end.get(daemon, end))
        for part, blob in file_blobs:
            blobs[part].append(blob)
    return Decoded(file_totals(per_file), tally, data_end, blobs)


def _user_pass(data_end: Mapping[int, float], params: FlapParams, accumulator: Any,
               partition: Iterator[tuple[int, list[bytes]]]) -> Iterator[Session]:
    """Executors: one partition's carry blobs -> its sessions across file edges; tallies to `accumulator`."""
    with _gc_paused():
        for part, blobs in partition:
            users: dict[str, list[tuple[int, Any]]] = {}
            detectors: dict[str, list[Any]] = {}
            for blob in blobs:
                daemon, carries, lateness = pickle.loads(blob)
                for key, carry in carries.items():
                    chain = users.get(key)
                    if chain is None:
                        users[key] = [(daemon, carry)]
                    else:
                        chain.append((daemon, carry))
                for detector, hours in lateness.items():
                    detectors.setdefault(detector, []).append(hours)
            result = PartitionResult()
            sessions: list[Session] = []
            for key, chain in users.items():
                finish_user(key, chain, data_end, params, result, sessions)
                if len(sessions) >= 4096:
                    yield from sessions
                    sessions.clear()
            yield from sessions
            for detector, pieces in detectors.items():
                finish_detector(detector, pieces, result)
            accumulator.add({part: result})


def small_table_rows(result: PartitionResult) -> dict[str, list[dict[str, Any]]]:
    """The five small tables from the merged tallies of both passes."""
    return {
        "concurrency": concurrency_rows(result.deltas),
        "lateness": result.lateness,
        "flappers": result.flappers,
        "dau": dau_rows(result.active, result.tally.started),
        "session_lengths": session_length_rows(result.tally.lengths),
    }


def _small_frame(spark: SparkSession, name: str, rows: list[dict[str, Any]]) -> DataFrame:
    schema = _SMALL_SCHEMAS[name]
    columns = [part.split()[0] for part in schema.split(", ")]
    return spark.createDataFrame([tuple(row[c] for c in columns) for row in rows], schema)


def finish_paired(spark: SparkSession, decoded: Decoded, names: Sequence[str], params: FlapParams,
                  sessions_path: str, laps: Laps) -> tuple[Tables, SmallTables]:
    """The second pass (its sessions appended to `sessions_path`) and the five small tables' frames."""
    sc = spark.sparkContext
    accumulator = sc.accumulator({}, PerFileStats())
    parts = len(decoded.blobs)
    rdd = sc.parallelize(list(enumerate(decoded.blobs)), parts).mapPartitions(
        functools.partial(_user_pass, decoded.data_end, params, accumulator))
    _sessions_frame(spark, rdd, names).write.mode("append").partitionBy("date").parquet(sessions_path)
    result = PartitionResult(tally=decoded.tally)
    for part_result in accumulator.value.values():
        result.merge(part_result)
    laps.mark("user_pass")
    rows = small_table_rows(result)
    frames = {name: _small_frame(spark, name, r) for name, r in rows.items()}
    tally = result.tally
    counts = {"sessions": tally.sessions, "open_sessions": tally.open_sessions, "superseded": tally.superseded,
              "orphans": tally.orphans, "unique": decoded.files["records"] - decoded.files["malformed"]}
    by_detector = sorted(result.by_detector, key=lambda row: row["detector"])
    concurrency = [(row["minute_start"], row["users_online"]) for row in rows["concurrency"]]
    flapper_users = len({(row["uid"], row["uid_type"]) for row in rows["flappers"]})
    small = SmallTables(concurrency, sorted(rows["dau"], key=lambda row: row["date"]), len(rows["flappers"]), flapper_users)
    return Tables(frames, counts, by_detector), small
