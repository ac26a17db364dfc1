"""What an incremental run's summary needs of the tables, read back with pyarrow (no Spark job).

The summary of an incremental run describes everything the runs have seen, so it is read from ``--out``
and the state once the commit is done: the whole concurrency timeline (a row a minute: 43,200 rows a
month), the dau rows, the flappers' count, and per detector the lateness over every stored value (exact
percentiles: each detector's values sorted with numpy -- the one part that grows with the history).
"""

from __future__ import annotations

import datetime as dt
import math
import os
from typing import Any

import numpy as np

from idled.pipeline.output import SmallTables

__all__ = ["small_tables", "lateness_by_detector"]


def _partitions(table: str) -> list[tuple[str, str]]:
    """(date, directory) of each date partition of `table`, in date order."""
    if not os.path.isdir(table):
        return []
    return sorted((name[5:], os.path.join(table, name)) for name in os.listdir(table) if name.startswith("date="))


def _read(directory: str, columns: list[str]) -> Any:
    import pyarrow.dataset as ds

    return ds.dataset(directory, format="parquet", partitioning=None).to_table(columns=columns)


def small_tables(out: str) -> SmallTables:
    concurrency: list[tuple[int, int]] = []
    for _, directory in _partitions(os.path.join(out, "concurrency")):
        rows = _read(directory, ["minute_start", "users_online"])
        concurrency += zip(rows["minute_start"].to_pylist(), rows["users_online"].to_pylist())
    concurrency.sort()
    dau = []
    for date, directory in _partitions(os.path.join(out, "dau")):
        dau += [{"date": dt.date.fromisoformat(date), **row} for row in _read(directory, ["active_users", "sessions_started"]).to_pylist()]
    flappers: set[tuple[str, str]] = set()
    user_days = 0
    for _, directory in _partitions(os.path.join(out, "flappers")):
        rows = _read(directory, ["uid", "uid_type"])
        user_days += rows.num_rows
        flappers.update(zip(rows["uid"].to_pylist(), rows["uid_type"].to_pylist()))
    return SmallTables(concurrency, dau, user_days, len(flappers))


def lateness_by_detector(values_table: str) -> list[dict[str, Any]]:
    """offlines, early, p50_s, p99_s, max_s per detector over every stored lateness value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = [_read(directory, ["detector", "lateness"]) for _, directory in _partitions(values_table)]
    if not parts:
        return []
    table = pa.concat_tables(parts)
    rows = []
    for detector in sorted(pc.unique(table["detector"]).to_pylist()):
        values = np.sort(table.filter(pc.equal(table["detector"], detector))["lateness"].to_numpy())
        rows.append({"detector": detector, "offlines": len(values), "early": int((values < 0).sum()),
                     "p50_s": _percentile(values, 0.5), "p99_s": _percentile(values, 0.99), "max_s": float(values[-1])})
    return rows


def _percentile(values: Any, p: float) -> float:
    """`rules.percentile` on a sorted numpy array: the two values around rank (n - 1) * p, interpolated."""
    position = (len(values) - 1) * p
    lower, higher = math.floor(position), math.ceil(position)
    low, high = float(values[lower]), float(values[higher])
    if higher == lower or high == low:
        return low
    return (higher - position) * low + (position - lower) * high
