"""Incremental runs on the paired path: the new bytes decoded and paired in Python, the tables updated in Python.

Theory of operation
-------------------
What an incremental run must compute is stated in `incremental`; this is how the paired path does it,
with Spark scheduling Python tasks and nothing else (as the full run's paired path, `paired`):

1. **Decode and pair the new bytes** (Spark tasks). The pending work -- each new file from byte 0, each
   grown one from where the last run stopped -- is cut into runs of a daemon's consecutive files
   (`runs_of_work`), one task each. A task reads its files from their offsets, drops every record at or
   below its daemon's seq watermark (a re-copied old segment: counted as duplicates), and pairs the rest
   as a full run does (`filepass.pair_file`, files continuing each other as one stream); it writes its
   closed in-stream sessions into a staging table (`arrowwrite`) and returns its carries, lateness values
   and counters.
2. **The premise** is checked on the driver as in a full run: two new files of a daemon overlapping in seq,
   or a run joining files that are not neighbours, and the run is handed to the record path instead
   (`incremental.run_incremental`, Spark SQL; the staging is discarded).
3. **Carried sessions and the second pass** (driver). The sessions open at the end of the last run become
   one more stream per daemon: an online record each, below every new seq, paired into carries like any
   other (`carried_streams`). Every carry of a user meets in `userpass.finish_user` -- so a carried
   session is closed by the user's first new record, superseded by a new online, or stays open -- which
   gives the sessions across stream edges and the open ones.
4. **The batch** B is the staged in-stream sessions read back plus the second pass's, as columns
   (`incrtables.Batch`); `incrtables` computes every table's changed partitions from B and the few stored
   rows each needs; B's closed sessions are written sorted by offline time, one file per date partition,
   its open ones to files of their own, and all of it is committed through the state's journal
   (`statedir`), exactly as the record path commits.

The driver holds B (an hourly run's ~300k sessions at 10M events a day: a few tens of MB) and the carries
(one per user and run); a first run over a long history holds all of its carries -- as a full run's second
pass does, only on one process.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import numpy as np

from idled.pipeline.aggregate import Laps
from idled.pipeline.arrowwrite import session_columns, write_by_date
from idled.pipeline.filepass import FileResult, Session, pair_file
from idled.pipeline.incrtables import Batch, change_of, table_rows, user_ended
from idled.pipeline.paired import _gc_paused, joins_in_seq_order
from idled.pipeline.pool import run_tasks
from idled.pipeline.records import FileStats, Row, iter_rows
from idled.pipeline.rules import FlapParams
from idled.pipeline.statedir import State
from idled.pipeline.tally import Tally
from idled.pipeline.userpass import PartitionResult, finish_user

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Work", "runs_of_work", "local_batch", "Pass1", "decode_tails", "carried_streams", "second_pass", "plan_paired"]

# (daemon, path, offset, seq watermark): a file's bytes not yet decoded (`statedir.pending_work`).
Work: TypeAlias = tuple[int, str, int, int]
# Rows per row group of the sessions files (~5 MB of columns): small enough that a scan filtered on
# offline_ts (concurrency's) skips what ended long before, as Spark's 8 MiB blocks did.
SESSION_ROW_GROUP: Final = 65536
_OPEN_SCHEMA: Final = (("daemon", "int32"), ("uid_key", "string"), ("seq", "int64"), ("ts", "float64"), ("device", "string"))


def runs_of_work(work: Sequence[Work], count: int) -> list[list[Work]]:
    """Each daemon's pending files (in name order = seq order) cut into runs of near-equal new bytes, about
    `count` in all, largest first (as `paired.runs_of_files`)."""
    sized = [(item, max(0, os.path.getsize(item[1]) - item[2])) for item in work]
    target = max(1, sum(size for _, size in sized) / count)
    runs: list[tuple[int, list[Work]]] = []
    for _, items in itertools.groupby(sized, key=lambda entry: entry[0][0]):
        run: list[Work] = []
        run_bytes = 0
        for item, size in items:
            if run and run_bytes + size - target > target - run_bytes:
                runs.append((run_bytes, run))
                run, run_bytes = [], 0
            run.append(item)
            run_bytes += size
        if run:
            runs.append((run_bytes, run))
    runs.sort(key=lambda entry: -entry[0])
    return [run for _, run in runs]


def _above(rows: Iterator[Row], watermark: int, dropped: list[int]) -> Iterator[Row]:
    for row in rows:
        if row[1] > watermark:
            yield row
        else:
            dropped[0] += 1


# What a task returns: per-file counters (path -> (daemon, offset, dropped, *FileStats.as_tuple())), the
# files it joined into one stream, its streams (sessions already written).
TaskResult: TypeAlias = tuple[dict[str, tuple], list[tuple[str, str]], list[tuple[int, FileResult]]]


def _pair_tails(names: Sequence[str], short_s: float, table: str, run: Sequence[Work]) -> TaskResult:
    """One run of a daemon's files from their offsets, as `paired._pair_run` pairs a run of whole files."""
    from idled.pipeline.arrowwrite import write_sessions

    streams: list[tuple[int, FileResult]] = []
    joins: list[tuple[str, str]] = []
    per_file: dict[str, tuple] = {}
    high: int | None = None
    last = ""
    for daemon, path, offset, watermark in run:
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read()
        stats, dropped = FileStats(), [0]
        rows = _above(iter_rows(data, daemon, stats), watermark, dropped)
        first = next(rows, None)
        if first is not None:
            if streams and high is not None and first[1] > high:
                joins.append((last, path))
            else:
                streams.append((daemon, FileResult()))
            stream = streams[-1][1]
            pair_file(itertools.chain((first,), rows), short_s, stream)
            write_sessions(stream.sessions, names, table, f"{daemon}-{os.path.basename(path)}-{offset}", Tally())
            stream.sessions.clear()
            assert stats.max_seq is not None
            high = stats.max_seq if high is None else max(high, stats.max_seq)
            last = path
        del data
        per_file[path] = (daemon, offset, dropped[0], *stats.as_tuple())
    return per_file, joins, streams


def _pair_work(names: Sequence[str], short_s: float, table: str, runs: Iterator[list[Work]]) -> Iterator[TaskResult]:
    with _gc_paused():
        for run in runs:
            yield _pair_tails(names, short_s, table, run)


@dataclass
class Pass1:
    per_file: dict[str, tuple]  # path -> (daemon, offset, dropped, *FileStats.as_tuple())
    in_seq_order: bool
    streams: list[tuple[int, FileResult]]


def _in_processes(runs: list[list[Work]], names: Sequence[str], short_s: float, table: str) -> list[TaskResult]:
    """The tasks in a pool of this machine's processes instead of Spark's (`local_batch`, `pool`)."""
    return run_tasks(functools.partial(_pair_work, names, short_s, table), runs, os.cpu_count() or 1,
                     preload=["idled.pipeline.incpaired"])


def decode_tails(spark: SparkSession | None, work: Sequence[Work], names: Sequence[str], short_s: float, table: str) -> Pass1:
    """Step 1: every run of pending files decoded and paired in a Spark task -- or, without `spark`, in a
    process pool; in-stream sessions into `table`."""
    if spark is None:
        runs = runs_of_work(work, os.cpu_count() or 1)
        results = _in_processes(runs, names, short_s, table) if runs else []
    else:
        sc = spark.sparkContext
        runs = runs_of_work(work, 2 * sc.defaultParallelism)
        rdd = sc.parallelize(runs, max(1, len(runs))).mapPartitions(functools.partial(_pair_work, names, short_s, table))
        results = rdd.collect()
    per_file: dict[str, tuple] = {}
    joins: list[tuple[str, str]] = []
    streams: list[tuple[int, FileResult]] = []
    for run_files, run_joins, run_streams in results:
        per_file.update(run_files)
        joins.extend(run_joins)
        streams.extend(run_streams)
    in_order = joins_in_seq_order({path: (v[0], *v[3:]) for path, v in per_file.items()}, joins)
    return Pass1(per_file, in_order, streams)


def carried_streams(carried: Any, short_s: float) -> list[tuple[int, FileResult]]:
    """The open sessions carried from the last run (a pyarrow table: daemon, uid_key, seq, ts, device) as one
    stream per daemon of online records in seq order (each below every new seq of its daemon)."""
    rows: list[Row] = [(daemon, seq, True, key, ts, None, None, None, device, None)
                       for daemon, key, seq, ts, device in zip(*(carried[name].to_pylist() for name, _ in _OPEN_SCHEMA))]
    rows.sort(key=lambda row: (row[0], row[1]))
    return [(daemon, pair_file(group, short_s)) for daemon, group in itertools.groupby(rows, key=lambda row: row[0])]


def second_pass(streams: Sequence[tuple[int, FileResult]], data_end: Mapping[int, float],
                flap: FlapParams) -> tuple[list[Session], Tally, dict[tuple[str, int], list[float]]]:
    """Step 3: every user's carries joined (sessions across stream edges, open ones); the tallies of every
    stream and of this pass merged; every lateness value by (detector, hour)."""
    users: dict[str, list[tuple[int, Any]]] = {}
    tally = Tally()
    lateness: dict[tuple[str, int], list[float]] = {}
    for daemon, stream in streams:
        tally.merge(stream.tally)
        for key, carry in stream.carries.items():
            users.setdefault(key, []).append((daemon, carry))
        for detector, hours in stream.lateness.items():
            for hour, values in hours.items():
                lateness.setdefault((detector, hour), []).extend(values)
    result = PartitionResult()
    sessions: list[Session] = []
    with _gc_paused():
        for key, chain in users.items():
            finish_user(key, chain, data_end, flap, result, sessions)
    tally.merge(result.tally)
    return sessions, tally, lateness


def _read_dir(path: str, columns: Sequence[str] | None = None) -> Any:
    """A directory of Parquet files (Spark's or ours; hidden and ``_`` files skipped) as one pyarrow table."""
    import pyarrow.dataset as ds

    return ds.dataset(path, format="parquet", partitioning=None).to_table(columns=list(columns) if columns else None)


def _batch(staged: str, sessions: list[Session], names: Sequence[str], carried: set[tuple[int, int]],
           data_end: Mapping[int, float], old_end: Mapping[int, float],
           lateness: dict[tuple[str, int], list[float]]) -> tuple[Batch, Any]:
    """B as columns, and B's rows of the sessions table (a pyarrow table with ``date``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    if os.path.isdir(staged):
        parts.append(_read_dir(staged))
    if sessions:
        parts.append(session_columns(sessions, names)[0])
    if parts:
        table = pa.concat_tables([p.select(parts[-1].column_names) for p in parts])
    else:
        table = session_columns([(0, "s:", 0, 0.0, None, None, None, None, None, None)], names or ["-"])[0].slice(0, 0)
    in_stream = table.num_rows - len(sessions)
    is_carried = np.r_[np.zeros(in_stream, bool), np.array([(s[0], s[2]) in carried for s in sessions], bool)]
    daemon = pc.index_in(table["daemon"], value_set=pa.array(list(names), pa.string())).to_numpy(zero_copy_only=False)
    start = table["online_ts"].to_numpy()
    offline = table["offline_ts"].to_numpy(zero_copy_only=False).astype(np.float64)
    is_open = table["open"].to_numpy(zero_copy_only=False).astype(bool)
    ends = np.array([data_end.get(i, np.nan) for i in range(len(names))] or [np.nan])
    olds = np.array([old_end.get(i, np.nan) for i in range(len(names))] or [np.nan])
    index = np.nan_to_num(daemon, nan=0).astype(np.int64) if len(daemon) else np.empty(0, np.int64)
    end = np.maximum(np.where(is_open, ends[index], offline), start)
    kinds = table["uid_type"].to_pylist()
    keys = [("i:" if kind == "int" else "s:") + uid for uid, kind in zip(table["uid"].to_pylist(), kinds)]
    batch = Batch(keys=keys, start=start, end=end, duration=offline - start, is_open=is_open, carried=is_carried,
                  user_end=user_ended(table["end_reason"].to_pylist()),
                  old_end=np.where(is_carried, np.maximum(olds[index], start), np.nan), lateness=lateness)
    dates = pc.cast(pc.floor(pc.divide(table["online_ts"], 86400.0)), pa.int32()).cast(pa.date32())
    return batch, table.append_column("date", dates)


@dataclass
class PairedBatch:
    """What the paired path computed before its commit."""

    state: dict[str, Any]  # the new state.json (``open_files`` set by the commit)
    rows: dict[str, Any]  # replaced tables' rows (`incrtables.table_rows`)
    dates: dict[str, list[str]]
    sessions: Any  # B's rows of the sessions table, with date (pyarrow)
    batch: Batch
    spanning: Any  # the stored midnight-crossing sessions (pyarrow: uid_key, online_ts, end), or None
    flap: FlapParams


def _fold_daemons(data: dict[str, Any], pass1: Pass1, streams: Sequence[tuple[int, FileResult]]) -> None:
    """The daemons' largest seq and data end, with this batch's."""
    for daemon, _offset, _dropped, *stats in pass1.per_file.values():
        high = stats[7]
        entry = data["daemons"][str(daemon)]
        if high is not None:
            entry["max_seq"] = high if entry["max_seq"] is None else max(entry["max_seq"], high)
    for daemon, stream in streams:
        entry = data["daemons"][str(daemon)]
        if stream.data_end is not None:
            entry["data_end"] = stream.data_end if entry["data_end"] is None else max(entry["data_end"], stream.data_end)


def local_batch(master: str | None, work: Sequence[Work], limit: int | None) -> bool:
    """Whether a batch is paired in a process pool without starting Spark: a local master and at most `limit`
    new bytes (None: any size; 0: never). Spark's start alone is ~4-7 s, and on this path it would only
    schedule the same Python tasks."""
    if master is None or not master.startswith("local") or limit == 0:
        return False
    if limit is None:
        return True
    return sum(max(0, os.path.getsize(path) - offset) for _, path, offset, _ in work) <= limit


def plan_paired(spark: SparkSession | None, state: State, out: str, names: Sequence[str], flap: FlapParams,
                work: Sequence[Work], laps: Laps,
                release: Callable[[SparkSession | None], None] | None = None) -> PairedBatch | None:
    """Steps 1-4 up to the commit; None if the premise fails (the record path must run instead). `release`
    is called with `spark` once the premise holds: nothing after step 1 needs Spark."""
    from idled.pipeline.incremental import _count_files

    staging = os.path.join(state.path, "staging")
    shutil.rmtree(staging, ignore_errors=True)
    pass1 = decode_tails(spark, work, names, flap.short_s, os.path.join(staging, "instream"))
    laps.mark("decode_pair")
    data = json.loads(json.dumps(state.data))  # the new state, a deep copy
    if _count_files(data, pass1.per_file) or not pass1.in_seq_order:
        shutil.rmtree(staging, ignore_errors=True)
        return None
    if release is not None:
        release(spark)
    open_dir = os.path.join(state.gen_dir(), "open")
    carried_table = _read_dir(open_dir) if os.path.isdir(open_dir) else None
    carried = carried_streams(carried_table, flap.short_s) if carried_table is not None else []
    streams = carried + pass1.streams
    _fold_daemons(data, pass1, pass1.streams)
    data_end = {int(k): v["data_end"] for k, v in data["daemons"].items() if v["data_end"] is not None}
    old_end = {int(k): v["data_end"] for k, v in state.data["daemons"].items() if v["data_end"] is not None}
    sessions, tally, lateness = second_pass(streams, data_end, flap)
    carried_keys = {(d, s) for d, s in zip(carried_table["daemon"].to_pylist(), carried_table["seq"].to_pylist())} \
        if carried_table is not None else set()
    batch, table = _batch(os.path.join(staging, "instream"), sessions, names, carried_keys, data_end, old_end, lateness)
    laps.mark("second_pass")
    counts = data["counts"]
    counts["sessions"] += tally.sessions - len(carried_keys)
    counts["open_sessions"] = tally.open_sessions
    counts["superseded"] += tally.superseded
    counts["orphans"] += tally.orphans
    change = change_of(batch, flap, data)
    data.update(first_minute=change.first_minute, closed_last_minute=change.closed_last_minute, last_minute=change.last_minute)
    spanning_dir = os.path.join(state.gen_dir(), "spanning")
    spanning_old = _read_dir(spanning_dir, ["uid_key", "online_ts", "end"]) if os.path.isdir(spanning_dir) else None
    rows, dates = table_rows(batch, change, out, state.path, spanning_old, flap)
    laps.mark("tables")
    data["generation"] = state.generation + 1
    return PairedBatch(data, rows, dates, table, batch, spanning_old, flap)


def _state_tables(pb: PairedBatch, names: Sequence[str]) -> tuple[Any, Any, Any, Any]:
    """The open sessions carried to the next run, the midnight-crossing sessions, and the rows B adds to the
    state's lateness values and short sessions (pyarrow tables)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from idled.pipeline.incrtables import _short

    batch, table = pb.batch, pb.sessions
    keys = pa.array(batch.keys, pa.string())
    is_open = pa.array(batch.is_open)
    daemon = pc.index_in(table["daemon"], value_set=pa.array(list(names), pa.string())).cast(pa.int32())
    carried = pa.table({"daemon": daemon, "uid_key": keys, "seq": table["online_seq"], "ts": table["online_ts"],
                        "device": table["device"]}).filter(is_open)
    crossing = pa.array(~batch.is_open & (batch.d1 > batch.d0))
    spanning = pa.table({"uid_key": keys, "online_ts": table["online_ts"], "end": pa.array(batch.end)}).filter(crossing)
    if pb.spanning is not None:
        spanning = pa.concat_tables([pb.spanning.cast(spanning.schema), spanning])
    flat = [(detector, float(hour), value) for (detector, hour), values in batch.lateness.items() for value in values]
    detector, hour, value = (list(column) for column in zip(*flat)) if flat else ([], [], [])
    hours = pa.array(hour, pa.float64())
    values = pa.table({"detector": pa.array(detector, pa.string()), "hour_start": hours, "lateness": pa.array(value, pa.float64()),
                       "date": pc.cast(pc.floor(pc.divide(hours, 86400.0)), pa.int32()).cast(pa.date32())})
    short = pa.array(_short(batch, pb.flap))
    shorts = pa.table({"uid_key": keys, "uid_hash": pa.nulls(len(keys), pa.int64()), "online_ts": table["online_ts"],
                       "duration_s": table["duration_s"], "end_reason": table["end_reason"], "open": table["open"],
                       "date": table["date"]}).filter(short)
    return carried, spanning, values, shorts


def commit_paired(state: State, pb: PairedBatch, out: str, names: Sequence[str], laps: Laps) -> None:
    """Stage B's sessions, the changed partitions, the added state files and the new state; journal the moves
    and apply them (`statedir`): the same layout and journal as the record path's commit."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from idled.pipeline.arrowwrite import write_rows
    from idled.pipeline.incremental import SESSION_TABLES
    from idled.pipeline.refresh import LATENESS_VALUES, SHORT_SESSIONS, STATE_TABLES
    from idled.pipeline.schemas import SMALL_SCHEMAS
    from idled.pipeline.statedir import added_moves, commit_journal, date_moves, session_moves

    staging = os.path.join(state.path, "staging")
    generation = pb.state["generation"]
    new_gen = state.gen_dir(generation)
    shutil.rmtree(new_gen, ignore_errors=True)
    carried, spanning, values, shorts = _state_tables(pb, names)
    for name, frame in (("open", carried), ("spanning", spanning)):
        os.makedirs(os.path.join(new_gen, name))
        pq.write_table(frame, os.path.join(new_gen, name, "part-0.parquet"))
    closed_root, open_root = os.path.join(staging, "sessions"), os.path.join(staging, "sessions_open")
    table = pb.sessions.sort_by([("offline_ts", "ascending")])
    for root, rows in ((closed_root, table.filter(pc.invert(table["open"]))), (open_root, table.filter(table["open"]))):
        write_by_date(rows.drop_columns(["date"]), rows["date"], root, "0", SESSION_ROW_GROUP)
    moves, pb.state["open_files"] = session_moves(state, generation, closed_root, open_root, out)
    laps.mark("write_sessions")
    for name, frame in ((LATENESS_VALUES, values), (SHORT_SESSIONS, shorts)):
        root = os.path.join(staging, name)
        write_by_date(frame.drop_columns(["date"]), frame["date"], root, "0")
        moves += added_moves(root, os.path.join(state.path, name), f"g{generation}-")
    for name, rows in pb.rows.items():
        if name in SMALL_SCHEMAS:
            write_rows(rows, SMALL_SCHEMAS[name], os.path.join(staging, name))
        else:  # the state's active users: a pyarrow table already
            write_by_date(rows.drop_columns(["date"]), rows["date"], os.path.join(staging, name), "0")
    for name, dates in pb.dates.items():
        target_root = os.path.join(state.path if name in STATE_TABLES else out, name)
        moves += date_moves(os.path.join(staging, name), target_root, dates)
    for name in SESSION_TABLES:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    commit_journal(state.path, moves, pb.state)
    laps.mark("commit")
