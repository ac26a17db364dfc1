"""The job's paired path: sessions paired while decoding, users finished in a second Python pass.

Theory of operation
-------------------
**Decode and pair** (`decode_paired`, Python workers). A writer names a segment by its first seq, so a
daemon's local segment files in name order are its record stream in seq order. They are cut into *runs* of
consecutive files of near-equal size (`runs_of_files`, 2 per core by default, largest first), one task
each, and a task reads its files by path and pairs online/offline while decoding (`records.iter_rows`,
`filepass.pair_file`): within a file and across the edges of the files of its run, so only a user's first
and last record in the run are left for later. The task writes its closed sessions -- half as many rows as
records -- into the sessions table itself, as Arrow columns into Parquet (`arrowwrite`): no row crosses
into the JVM, nothing is checkpointed, sorted or shuffled. The rest comes back to the driver as the task's
result: per-file counters, the files it joined, tallies, data end, and a *carry* per (run, user) and the
lateness values, pickled into one blob per second-pass partition. Directories given as URIs are read
through Spark (`binaryFiles`) instead, one file per run.

The premise is checked on the driver once every file is decoded: if two files of a daemon overlap in seq
(`records.seq_ranges_overlap`), or a run joined two files that are not neighbours in seq order
(`joins_in_seq_order`: a renamed file), the job discards all this and takes the record path (`job`), which
overwrites the sessions table.

**Users and detectors** (`finish_paired`, Python workers again). The blobs -- ~400k carries at 10M events
with 4 runs -- are grouped on the driver by partition (`part_of`: the uid_key's, or the detector's, CRC32)
and parallelized, one partition each; `userpass` joins each user's carries across runs and daemons
(sessions across run edges, open sessions, concurrency ranges, days, flap windows) and each detector's
values. It writes its sessions next to the first pass's; each partition's tallies come back as the task's
result.

**Tables.** The five small tables are built on the driver from the merged tallies with the reference's row
builders (`reference`) and written by the driver, a few thousand rows (`arrowwrite.write_rows`). Spark
here only schedules Python tasks: no SQL job runs on this path.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import pickle
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from idled.pipeline.aggregate import Laps, Tables
from idled.pipeline.arrowwrite import clear, write_rows, write_sessions
from idled.pipeline.decode import daemon_names, default_partitions, file_totals
from idled.pipeline.filepass import FileResult, Session, UserSessions, pair_file
from idled.pipeline.output import SmallTables
from idled.pipeline.pool import TaskPool
from idled.pipeline.records import FileStats, iter_rows
from idled.pipeline.reference import concurrency_rows, dau_rows, session_length_rows
from idled.pipeline.rules import FlapParams
from idled.pipeline.schemas import SMALL_SCHEMAS
from idled.pipeline.tally import Tally
from idled.pipeline.userpass import PartitionResult, finish_detector, finish_user

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Run", "Decoded", "runs_of_files", "joins_in_seq_order", "decode_paired", "finish_paired", "small_table_rows", "part_of"]

_PICKLE: Final = pickle.HIGHEST_PROTOCOL


def _sessions_table(out: str) -> str:
    return os.path.join(out, "sessions")


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


def _blobs(daemon: int, streams: Sequence[FileResult], parts: int) -> list[tuple[int, bytes]]:
    """The carries and lateness values of a task's streams as one pickled blob per second-pass partition:
    (daemon, a carries dict per stream, a lateness dict per stream)."""
    carries: list[list[dict[str, Any]]] = [[{} for _ in streams] for _ in range(parts)]
    lateness: list[list[dict[str, Any]]] = [[{} for _ in streams] for _ in range(parts)]
    for i, stream in enumerate(streams):
        for key, carry in stream.carries.items():
            carries[part_of(key, parts)][i][key] = carry
        for detector, hours in stream.lateness.items():
            lateness[part_of(detector, parts)][i][detector] = hours
    return [(part, pickle.dumps((daemon, carries[part], lateness[part]), _PICKLE))
            for part in range(parts) if any(carries[part]) or any(lateness[part])]


# One run of a daemon's segment files, paired in one task: (daemon, paths of consecutive files, in seq order).
Run: TypeAlias = tuple[int, list[str]]
# What a task returns per run: (per-file counters, joined files, tally, data end, daemon, carry blobs).
RunResult: TypeAlias = tuple[dict[str, tuple], list[tuple[str, str]], Tally, "float | None", int, list[tuple[int, bytes]]]


def runs_of_files(names: Sequence[str], count: int) -> list[Run] | None:
    """Every daemon's segment files in name order -- a writer names a segment by its first seq -- cut into
    runs of consecutive files of near-equal bytes, about `count` runs in all, largest first. None if a
    directory is not local (a URI: its files are read through Spark, one per task)."""
    if any("://" in directory for directory in names):
        return None
    listed: list[tuple[int, list[tuple[str, int]]]] = []
    for daemon, directory in enumerate(names):
        # As Spark's file listing: hidden files ("." or "_" first) are not segments.
        files = sorted((entry.path, entry.stat().st_size) for entry in os.scandir(directory)
                       if entry.name.endswith(".seg") and entry.name[0] not in "._" and entry.is_file())
        listed.append((daemon, files))
    target = max(1, sum(size for _, files in listed for _, size in files) / count)
    sized: list[tuple[int, Run]] = []
    for daemon, files in listed:
        run: list[str] = []
        run_bytes = 0
        for path, size in files:
            # Cut before this file if taking it overshoots the target by more than leaving it undershoots.
            if run and run_bytes + size - target > target - run_bytes:
                sized.append((run_bytes, (daemon, run)))
                run, run_bytes = [], 0
            run.append(path)
            run_bytes += size
        if run:
            sized.append((run_bytes, (daemon, run)))
    # Largest first: Spark starts tasks in partition order, so the short runs fill in at the end.
    sized.sort(key=lambda item: -item[0])
    return [run for _, run in sized]


def _pair_run(daemon: int, files: Iterable[tuple[str, bytes]], names: Sequence[str], short_s: float, grace: float,
              parts: int, table: str) -> RunResult:
    """One task's files of one daemon, in the given order; each file's closed sessions are written into
    `table` as soon as it is paired.

    A file whose first record comes after every record of the files before it continues their *stream*: it
    is paired into the same `FileResult`, so the sessions across that edge close here, and the join is
    returned for the driver to check that no other file's seqs fall between (`joins_in_seq_order`). Any
    other file starts a stream of its own (a writer's files come in name order = seq order; a renamed or
    copied one need not)."""
    streams: list[FileResult] = []
    joins: list[tuple[str, str]] = []
    user_sessions = UserSessions(grace, short_s) if grace > 0 else None
    per_file: dict[str, tuple] = {}
    high: int | None = None
    last = ""
    for path, data in files:
        stats = FileStats()
        rows = iter_rows(data, daemon, stats)
        first = next(rows, None)
        if first is not None:
            if streams and high is not None and first[1] > high:
                joins.append((last, path))
            else:
                streams.append(FileResult())
            pair_file(itertools.chain((first,), rows), short_s, streams[-1], user_sessions)
            write_sessions(streams[-1].sessions, names, table, f"{daemon}-{os.path.basename(path)}", streams[-1].tally,
                           lengths=user_sessions is None)
            streams[-1].sessions.clear()
            assert stats.max_seq is not None  # set with the first row
            high = stats.max_seq if high is None else max(high, stats.max_seq)
            last = path
        del data
        per_file[path] = (daemon, *stats.as_tuple())
    tally = Tally()
    data_end: float | None = None
    for stream in streams:
        tally.merge(stream.tally)
        if stream.data_end is not None:
            data_end = stream.data_end if data_end is None else max(data_end, stream.data_end)
    return per_file, joins, tally, data_end, daemon, _blobs(daemon, streams, parts)


def joins_in_seq_order(per_file: Mapping[str, tuple], joins: Iterable[tuple[str, str]]) -> bool:
    """True if every joined pair of files is a file and the next file with records in its daemon's seq
    order (`per_file`: path -> (daemon, *FileStats.as_tuple())) -- else a stream skipped another file's
    records, and its pairing is wrong."""
    order: dict[int, list[tuple[int, str]]] = {}
    for path, (daemon, *_counters, low, _high, _unordered) in per_file.items():
        if low is not None:
            order.setdefault(daemon, []).append((low, path))
    successor: dict[str, str] = {}
    for files in order.values():
        files.sort()
        successor.update((a, b) for (_, a), (_, b) in zip(files, files[1:]))
    return all(successor.get(a) == b for a, b in joins)


def _read(paths: Iterable[str]) -> Iterator[tuple[str, bytes]]:
    for path in paths:
        with open(path, "rb") as file:
            yield path, file.read()


def _pair_runs(names: Sequence[str], short_s: float, grace: float, parts: int, table: str,
               runs: Iterator[Run]) -> Iterator[RunResult]:
    """Executors: each run of local files, read from the path (the same on the driver and every executor)."""
    with _gc_paused():
        for daemon, paths in runs:
            yield _pair_run(daemon, _read(paths), names, short_s, grace, parts, table)


def _pair_read_files(daemon: int, names: Sequence[str], short_s: float, grace: float, parts: int, table: str,
                     files: Iterator[tuple[str, bytes]]) -> Iterator[RunResult]:
    """Executors: files read by Spark (`binaryFiles`, any filesystem), in no known order: one run each."""
    with _gc_paused():
        for path, data in files:
            yield _pair_run(daemon, ((path, data),), names, short_s, grace, parts, table)


@dataclass
class Decoded:
    """What the driver learned from the first pass (its sessions are written already)."""

    files: dict[str, int]  # `decode.file_totals`
    in_seq_order: bool  # every stream's files follow each other in their daemon's seq order
    tally: Tally  # in-file sessions
    data_end: dict[int, float]  # per daemon: the largest ts of its records
    blobs: list[list[bytes]]  # carry blobs per second-pass partition
    per_file: dict[str, tuple]  # path -> (daemon, *FileStats.as_tuple())


def decode_paired(spark: SparkSession | None, dirs: Sequence[str], short_s: float, min_partitions: int | None, parts: int,
                  out: str, grace: float = 0.0, pool: TaskPool | None = None) -> Decoded:
    """The first pass: decode and pair every file, its closed sessions written into ``out/sessions`` on the
    way (`arrowwrite`); `parts` is the number of partitions of the second pass; `grace` > 0: user sessions
    joined over it (`filepass.UserSessions`) for flappers and session_lengths. Without `spark`, the tasks run
    in `pool`, local processes (`pool`; local directories only)."""
    table = _sessions_table(out)
    clear(table)
    names = daemon_names(dirs)
    results: list[RunResult]
    if spark is None:
        if pool is None:
            raise ValueError("decode_paired needs a SparkSession or a TaskPool")
        runs = runs_of_files(names, min_partitions or 2 * pool.processes)
        if runs is None:
            raise ValueError("directories given as URIs are read through Spark")
        results = pool.run(functools.partial(_pair_runs, names, short_s, grace, parts, table), runs)
        return _decoded(results, parts)
    sc = spark.sparkContext
    runs = runs_of_files(names, min_partitions or 2 * sc.defaultParallelism)
    if runs is not None:
        results = sc.parallelize(runs, max(1, len(runs))).mapPartitions(
            functools.partial(_pair_runs, names, short_s, grace, parts, table)).collect()
    else:
        partitions = min_partitions or default_partitions(dirs, sc.defaultParallelism)
        results = sc.union([
            sc.binaryFiles(directory.rstrip("/") + "/*.seg", minPartitions=partitions).mapPartitions(
                functools.partial(_pair_read_files, daemon, names, short_s, grace, parts, table))
            for daemon, directory in enumerate(names)
        ]).collect()
    return _decoded(results, parts)


def _decoded(results: Iterable[RunResult], parts: int) -> Decoded:
    """The driver's merge of the first pass's task results."""
    per_file: dict[str, tuple] = {}
    joins: list[tuple[str, str]] = []
    tally = Tally()
    data_end: dict[int, float] = {}
    blobs: list[list[bytes]] = [[] for _ in range(parts)]
    for run_files, run_joins, run_tally, end, daemon, run_blobs in results:
        per_file.update(run_files)
        joins.extend(run_joins)
        tally.merge(run_tally)
        if end is not None:
            data_end[daemon] = max(end, data_end.get(daemon, end))
        for part, blob in run_blobs:
            blobs[part].append(blob)
    return Decoded(file_totals(per_file), joins_in_seq_order(per_file, joins), tally, data_end, blobs, per_file)


def _user_pass(data_end: Mapping[int, float], params: FlapParams, grace: float, names: Sequence[str], table: str,
               partition: Iterator[tuple[int, list[bytes]]]) -> Iterator[PartitionResult]:
    """Executors: one partition's carry blobs -> its sessions across file edges and open ones, written into
    `table`; yields the partition's tallies."""
    with _gc_paused():
        for part, blobs in partition:
            users: dict[str, list[tuple[int, Any]]] = {}
            detectors: dict[str, list[Any]] = {}
            for blob in blobs:
                daemon, streams, lateness = pickle.loads(blob)
                for carries in streams:
                    for key, carry in carries.items():
                        chain = users.get(key)
                        if chain is None:
                            users[key] = [(daemon, carry)]
                        else:
                            chain.append((daemon, carry))
                for pieces in lateness:
                    for detector, hours in pieces.items():
                        detectors.setdefault(detector, []).append(hours)
            result = PartitionResult()
            sessions: list[Session] = []
            user_sessions = UserSessions(grace, params.short_s) if grace > 0 else None
            for key, chain in users.items():
                finish_user(key, chain, data_end, params, result, sessions, user_sessions)
            write_sessions(sessions, names, table, f"users-{part}", result.tally, lengths=user_sessions is None)
            for detector, pieces in detectors.items():
                finish_detector(detector, pieces, result)
            yield result


def small_table_rows(result: PartitionResult) -> dict[str, list[dict[str, Any]]]:
    """The five small tables from the merged tallies of both passes."""
    return {
        "concurrency": concurrency_rows(result.deltas),
        "lateness": result.lateness,
        "flappers": result.flappers,
        "dau": dau_rows(result.active, result.tally.started),
        "session_lengths": session_length_rows(result.tally.lengths),
    }


def finish_paired(spark: SparkSession | None, decoded: Decoded, names: Sequence[str], params: FlapParams,
                  out: str, laps: Laps, grace: float = 0.0,
                  pool: TaskPool | None = None) -> tuple[Tables, SmallTables, dict[str, str]]:
    """The second pass (its sessions added to ``out/sessions``), then the five small tables written under
    `out`; returns the tables' counts, what the summary needs of them, and table name -> path. Without
    `spark`, the second pass runs in `pool`."""
    parts = len(decoded.blobs)
    table = _sessions_table(out)
    task = functools.partial(_user_pass, decoded.data_end, params, grace, names, table)
    items = list(enumerate(decoded.blobs))
    results: list[PartitionResult]
    if spark is not None:
        results = spark.sparkContext.parallelize(items, parts).mapPartitions(task).collect()
    elif pool is not None:
        results = pool.run(task, items)
    else:
        raise ValueError("finish_paired needs a SparkSession or a TaskPool")
    result = PartitionResult(tally=decoded.tally)
    for part_result in results:
        result.merge(part_result)
    laps.mark("user_pass")
    rows = small_table_rows(result)
    written = {"sessions": table}
    for name, schema in SMALL_SCHEMAS.items():
        written[name] = os.path.join(out, name)
        write_rows(rows[name], schema, written[name])
    laps.mark("write_small_tables")
    tally = result.tally
    counts = {"sessions": tally.sessions, "open_sessions": tally.open_sessions, "superseded": tally.superseded,
              "orphans": tally.orphans, "unique": decoded.files["records"] - decoded.files["malformed"]}
    by_detector = sorted(result.by_detector, key=lambda row: row["detector"])
    concurrency = [(row["minute_start"], row["users_online"]) for row in rows["concurrency"]]
    flapper_users = len({(row["uid"], row["uid_type"]) for row in rows["flappers"]})
    small = SmallTables(concurrency, sorted(rows["dau"], key=lambda row: row["date"]), len(rows["flappers"]), flapper_users)
    return Tables({}, counts, by_detector, decoded.data_end), small, written
