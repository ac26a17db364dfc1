"""The decode stage: segment files -> an events DataFrame, with per-file counters.

Each ``--events`` directory is one daemon, numbered by its position on the command line.
``sc.binaryFiles(DIR/*.seg, minPartitions)`` hands whole segment files to ``mapPartitions``, which runs
`records.iter_rows` -- i.e. the daemon's own ``eventlog.decode_buffer`` -- and yields flat tuples that become
a DataFrame with the explicit `EVENT_SCHEMA`. Per-file counters (bytes, records, corrupt, malformed, torn
bytes, seq range) go into an accumulator that maps file -> counters and merges by *replacing*, so a task that
Spark re-runs reports the same numbers again instead of adding them twice; `file_totals` sums them on the
driver. A corrupt record is skipped and counted, never fatal.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from idled.pipeline.records import FileStats, Row, iter_rows, seq_ranges_overlap

if TYPE_CHECKING:
    from pyspark.accumulators import AccumulatorParam
    from pyspark.sql import DataFrame, SparkSession

    _PerFileParam = AccumulatorParam[dict[str, tuple]]
else:
    _PerFileParam = object  # at run time the class is duck-typed: pyspark is not imported

__all__ = ["EVENT_SCHEMA", "PerFileStats", "daemon_names", "default_partitions", "read_events", "file_totals"]

EVENT_SCHEMA: Final = (
    "daemon INT, seq BIGINT, online BOOLEAN, uid_key STRING, ts DOUBLE, reason STRING, deadline DOUBLE, detector STRING, "
    "device STRING, grace DOUBLE"
)


class PerFileStats(_PerFileParam):
    """AccumulatorParam (duck-typed at run time, so this module need not import pyspark; a subclass for the
    type checker): path -> counters, last wins."""

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


def default_partitions(dirs: Sequence[str], parallelism: int) -> int:
    """The default ``minPartitions`` hint: one per 32 MiB of the local segments of all `dirs` together
    (directories on a cluster filesystem are not sized), at least two per core, so the last tasks of the
    decode stage are short and both cores stay busy. `read_events` gives the same hint to each directory's
    ``binaryFiles``, and Spark never splits a file (whole files are decoded), so it is a lower bound on the
    work units, not an exact partition count."""
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
    partitions = min_partitions or default_partitions(dirs, sc.defaultParallelism)
    rdds = []
    for daemon, directory in enumerate(daemon_names(dirs)):
        # One binaryFiles per daemon: its rows carry the daemon's number. Each gets the same hint.
        files = sc.binaryFiles(directory.rstrip("/") + "/*.seg", minPartitions=partitions)
        rdds.append(files.mapPartitions(functools.partial(_decode_files, daemon, accumulator)))
    rdd = rdds[0] if len(rdds) == 1 else sc.union(rdds)
    # Rows are built to the schema (`records.to_row`); Spark's per-row type check costs ~2.7 us a row in Python.
    return spark.createDataFrame(rdd, EVENT_SCHEMA, verifySchema=False), accumulator


def file_totals(per_file: dict[str, tuple]) -> dict[str, int]:
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
