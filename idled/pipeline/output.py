"""Writing the job's results: each table as Parquet partitioned by ``date``, then ``summary.json``.

Every table is written once; the driver then reads the small ones (concurrency, dau, flappers) back from
the files it just wrote rather than recomputing them, and assembles the summary that `summary.json`, the
stdout report and the chart are made from. pyspark is imported inside the functions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idled.pipeline.aggregate import TABLES, Laps, Tables
from idled.pipeline.rules import FlapParams
from idled.pipeline.spark import agg_row

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SmallTables", "write_tables", "read_small_tables", "summarize", "write_summary"]


def write_tables(frames: Mapping[str, DataFrame], out: str, laps: Laps) -> dict[str, str]:
    """Write every table under `out` (one lap each); returns table name -> path."""
    os.makedirs(out, exist_ok=True)
    written: dict[str, str] = {}
    for name in TABLES:
        frame = frames[name]
        if name != "sessions":
            frame = frame.coalesce(1)  # small tables: one file per date, not one per shuffle partition
        path = os.path.join(out, name)
        frame.write.mode("overwrite").partitionBy("date").parquet(path)
        written[name] = path
        laps.mark(f"write_{name}")
    return written


@dataclass(frozen=True, slots=True)
class SmallTables:
    """What the summary needs of the small tables, collected on the driver."""

    concurrency: list[tuple[int, int]]  # (minute_start, users_online), in minute order
    dau: list[dict[str, Any]]
    flapper_user_days: int
    flapper_users: int


def read_small_tables(spark: SparkSession, frames: Mapping[str, DataFrame], written: Mapping[str, str]) -> SmallTables:
    from pyspark.sql import functions as F

    def read_back(name: str) -> DataFrame:
        # The small tables are read back rather than recomputed; with their schema, so an empty table reads.
        return spark.read.schema(frames[name].schema).parquet(written[name])

    concurrency = [
        (row["minute_start"], row["users_online"])
        for row in read_back("concurrency").select("minute_start", "users_online").orderBy("minute_start").collect()
    ]
    dau = [row.asDict() for row in read_back("dau").orderBy("date").collect()]
    flapper_rows = agg_row(read_back("flappers").agg(F.count("*"), F.countDistinct("uid", "uid_type")))
    return SmallTables(concurrency, dau, flapper_rows[0], flapper_rows[1])


def summarize(
    *,
    names: Sequence[str],
    out: str,
    master: str,
    flap: FlapParams,
    files: Mapping[str, int],
    event_count: int,
    tables: Tables,
    small: SmallTables,
    written: Mapping[str, str],
    timings: dict[str, Any],
) -> dict[str, Any]:
    """The summary dict (`summary.json`); `timings` is stored as given, so the caller can still add to it."""
    counts = tables.counts
    peak = max(small.concurrency, key=lambda x: x[1], default=(None, 0))
    return {
        "inputs": list(names),
        "out": os.path.abspath(out),
        "master": master,
        "flap_params": {"k": flap.k, "short_s": flap.short_s, "window_s": flap.window_s},
        "counts": {
            **files,
            "events": event_count,
            "duplicates": event_count - counts["unique"],
            "sessions": counts["sessions"],
            "open_sessions": counts["open_sessions"],
            "superseded_sessions": counts["superseded"],
            "orphan_offlines": counts["orphans"],
            "flapper_user_days": small.flapper_user_days,
            "flapper_users": small.flapper_users,
        },
        "peak_concurrency": {"minute_start": peak[0], "users_online": peak[1]},
        "dau": [
            {"date": str(row["date"]), "active_users": row["active_users"], "sessions_started": row["sessions_started"]}
            for row in small.dau
        ],
        "lateness_by_detector": tables.lateness_by_detector,
        "tables": dict(written),
        "timings_s": timings,
    }


def write_summary(summary: Mapping[str, Any], out: str) -> None:
    with open(os.path.join(out, "summary.json"), "w") as file:
        json.dump(summary, file, indent=2, default=str)
        file.write("\n")
