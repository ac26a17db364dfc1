"""`idled pipeline compact`: a date partition's many small sessions files rewritten as a few large ones.

Theory of operation
-------------------
An incremental run adds one file to each sessions partition it touches (`incremental`): 24 a day from an
hourly cron, so a month's table is ~720 small files, and every query opens them all. Once a day is old
enough that few sessions still arrive for it (``--older-than``, default 2 days, measured against the
output's watermark -- the data's clock, `freshness` -- or, without one, this machine's), its files hold
what they will ever hold, save the odd late one; `compact` reads a partition's data files, sorts the rows
by ``offline_ts`` (the order the incremental runs' concurrency scan filters on) and writes them as files of
at most `FILE_ROWS` rows in row groups of `ROW_GROUP_ROWS`. The open sessions' files (``open-*``) are left
alone: the next incremental run deletes them by name (`statedir`'s ``open_files``).

**Atomic.** The new files are staged under ``<out>/_compact/staging`` and a journal
(``<out>/_compact/journal.json``: the new files moved in, the old ones deleted) is written before anything in
the table changes; `finish_compaction` applies it (`statedir.apply_moves`, idempotent) -- at the end of a
compaction, and at the start of the next compaction or incremental run if one was interrupted.

**Safe beside an incremental run.** Both hold an exclusive lock on ``<out>/.idled-pipeline.lock``
(`output_lock`, ``flock``) for their whole duration, so a compaction never rewrites a partition a run is
adding to or reading, and waits for the run (an hourly run: seconds). **Idempotent**: a partition with one
data file is left as it is; one that got a late file since is compacted again.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any, Final

from idled.pipeline.statedir import Move, apply_moves, replace_json

__all__ = ["output_lock", "finish_compaction", "compact", "parse_age", "add_compact_arguments", "run_compact"]

LOCK_NAME: Final = ".idled-pipeline.lock"
WORK_DIR: Final = "_compact"  # a leading "_": Spark and pyarrow skip it when reading --out's tables
FILE_ROWS: Final = 8 << 20  # rows per compacted file (~0.4 GB of columns)
ROW_GROUP_ROWS: Final = 1 << 20  # rows per row group (~50 MB of columns, ~20-25 MB written)
_DAY: Final = 86400


@contextlib.contextmanager
def output_lock(out: str, blocking: bool = True) -> Iterator[None]:
    """The exclusive lock of an output directory (created if missing), held by incremental runs and `compact`;
    `blocking` false raises BlockingIOError if another process holds it."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, LOCK_NAME), "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def finish_compaction(out: str) -> None:
    """Apply a compaction's journal if one is there (an interrupted compaction), then drop its staging."""
    work = os.path.join(out, WORK_DIR)
    journal = os.path.join(work, "journal.json")
    if os.path.exists(journal):
        with open(journal) as file:
            apply_moves([(source, target) for source, target in json.load(file)["moves"]])
        os.remove(journal)
    shutil.rmtree(work, ignore_errors=True)


def parse_age(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``12h`` or ``2d``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not an age like 2d, 12h, 30m or 90s: {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": _DAY}[match.group(2)]


def _data_files(partition: str) -> list[str]:
    """The closed sessions' files of a partition (not the open sessions' ``open-*``, not hidden ones)."""
    return sorted(os.path.join(partition, name) for name in os.listdir(partition)
                  if name.endswith(".parquet") and not name.startswith(("open-", ".", "_")))


def _rewrite(files: list[str], staging: str, tag: str) -> tuple[list[str], int]:
    """`files` read, sorted by offline_ts, written under `staging` as ``<tag>-N.parquet``; (paths, rows)."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    table = ds.dataset(files, format="parquet").to_table().sort_by([("offline_ts", "ascending")])
    os.makedirs(staging, exist_ok=True)
    written = []
    for index, first in enumerate(range(0, max(table.num_rows, 1), FILE_ROWS)):
        path = os.path.join(staging, f"{tag}-{index}.parquet")
        pq.write_table(table.slice(first, FILE_ROWS), path, row_group_size=ROW_GROUP_ROWS,
                       use_dictionary=["daemon", "uid_type", "end_reason", "device", "end_device"])
        written.append(path)
    return written, table.num_rows


def _reference_time(out: str, now: float) -> float:
    """The output's watermark (`freshness`), else `now`."""
    try:
        with open(os.path.join(out, "summary.json")) as file:
            watermark = json.load(file).get("watermark")
    except (OSError, ValueError):
        watermark = None
    return float(watermark) if watermark is not None else now


def compact(out: str, older_than: float, now: float) -> dict[str, Any]:
    """Compact every sessions partition of `out` whose day ended at least `older_than` seconds before the
    output's watermark (or `now`); returns what was done. Takes the output's lock."""
    table = os.path.join(out, "sessions")
    with output_lock(out):
        finish_compaction(out)
        cutoff = _reference_time(out, now) - older_than
        staging = os.path.join(out, WORK_DIR, "staging")
        moves: list[Move] = []
        report: dict[str, Any] = {"partitions": 0, "files_before": 0, "files_after": 0, "rows": 0}
        tag = f"compact-{time.time_ns()}"
        for name in sorted(os.listdir(table)) if os.path.isdir(table) else []:
            day = _day_of(name)
            files = _data_files(os.path.join(table, name)) if day is not None and (day + 1) * _DAY <= cutoff else []
            if len(files) < 2:
                continue
            written, rows = _rewrite(files, os.path.join(staging, name), tag)
            moves += [(path, os.path.join(table, name, os.path.basename(path))) for path in written]
            moves += [(None, path) for path in files]
            report.update(partitions=report["partitions"] + 1, files_before=report["files_before"] + len(files),
                          files_after=report["files_after"] + len(written), rows=report["rows"] + rows)
        if moves:
            replace_json(os.path.join(out, WORK_DIR, "journal.json"), {"moves": moves})
        finish_compaction(out)
    return report


def _day_of(partition: str) -> int | None:
    import datetime as dt

    if not partition.startswith("date="):
        return None
    try:
        return (dt.date.fromisoformat(partition[5:]) - dt.date(1970, 1, 1)).days
    except ValueError:
        return None


def add_compact_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="the output directory of `idled pipeline run`")
    parser.add_argument("--older-than", type=parse_age, default=2 * _DAY, metavar="AGE",
                        help="compact the days that ended at least this long before the output's watermark "
                             "(e.g. 2d, 12h; default 2d)")


def run_compact(args: argparse.Namespace) -> int:
    if not os.path.isdir(os.path.join(args.out, "sessions")):
        print(f"idled pipeline compact: {args.out}: no sessions table", file=sys.stderr)
        return 2
    started = time.perf_counter()
    report = compact(args.out, args.older_than, time.time())
    print(f"idled pipeline compact: {report['partitions']} partition(s), {report['files_before']} files -> "
          f"{report['files_after']} ({report['rows']:,} rows) in {time.perf_counter() - started:.1f} s")
    return 0
