"""The paired path's Parquet written from Python (`arrowwrite`): layout, idempotent re-runs, counts."""

from __future__ import annotations

import datetime as dt
import math
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from idled.pipeline.arrowwrite import SESSIONS_SCHEMA, write_rows, write_sessions
from idled.pipeline.filepass import Session
from idled.pipeline.rules import bucket_index
from idled.pipeline.tally import Tally

DAY = 86400.0
MIDNIGHT = 1777593600.0  # 2026-05-01T00:00:00Z

SESSIONS: list[Session] = [
    (0, "i:7", 1, MIDNIGHT - 10.0, 2, MIDNIGHT + 20.0, "idle", None, None, None),  # starts the day before, crosses midnight
    (1, "s:x", 5, MIDNIGHT + 5.0, 6, MIDNIGHT + 4000.0, "logout", "phone", "laptop", None),
    (1, "s:x", 7, MIDNIGHT + 4001.0, None, None, None, "phone", None, None),  # open
]


def read(table: Path) -> list[dict]:
    rows = []
    for path in sorted(table.rglob("*.parquet")):
        date = path.parent.name.removeprefix("date=")
        rows += [{**row, "date": date} for row in pq.read_table(path).to_pylist()]
    return rows


def test_sessions_land_in_the_date_of_their_start_with_the_tables_columns(tmp_path: Path) -> None:
    tally = Tally()
    assert write_sessions(SESSIONS, ["d0", "d1"], str(tmp_path), "0-a.seg", tally) == 3
    rows = read(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["date=2026-04-30", "date=2026-05-01"]
    assert rows[0] == {"daemon": "d0", "uid": "7", "uid_type": "int", "online_seq": 1, "online_ts": MIDNIGHT - 10.0,
                       "offline_seq": 2, "offline_ts": MIDNIGHT + 20.0, "duration_s": 30.0, "end_reason": "idle",
                       "open": False, "device": None, "end_device": None, "date": "2026-04-30"}
    assert [(r["uid"], r["uid_type"], r["open"], r["duration_s"], r["device"], r["end_device"]) for r in rows[1:]] == [
        ("x", "str", False, 3995.0, "phone", "laptop"), ("x", "str", True, None, "phone", None)]
    day = int(MIDNIGHT // DAY)
    assert tally.started == {day - 1: 1, day: 2}  # open sessions started too
    assert sum(tally.lengths.values()) == 2 and {d for d, _ in tally.lengths} == {day - 1, day}


def test_a_rerun_task_replaces_its_files_and_leaves_no_temporary_ones(tmp_path: Path) -> None:
    write_sessions(SESSIONS, ["d0", "d1"], str(tmp_path), "0-a.seg", Tally())
    write_sessions(SESSIONS, ["d0", "d1"], str(tmp_path), "0-a.seg", Tally())  # Spark ran the task again
    write_sessions(SESSIONS[:1], ["d0", "d1"], str(tmp_path), "users-0", Tally())
    assert len(read(tmp_path)) == 4
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]


def test_counts_match_the_reference_rules_at_bucket_and_day_edges() -> None:
    tally = Tally()
    starts = [MIDNIGHT - 1e-6, MIDNIGHT, MIDNIGHT + 1.0, MIDNIGHT + 2.0]
    ends = [MIDNIGHT + 59.0, MIDNIGHT + 60.0, MIDNIGHT - 5.0, math.nan]  # a clock step back; one still open
    tally.count_written(np.array(starts), np.array(ends))
    day = int(MIDNIGHT // DAY)
    assert tally.started == {day - 1: 1, day: 3}
    # bucket 0 holds [0, first edge) and negative durations; (day of start by Python's //, bucket index)
    expected: dict[tuple[int, int], int] = {}
    for start, end in zip(starts[:3], ends[:3]):
        key = (int(start // DAY), bucket_index(end - start))
        expected[key] = expected.get(key, 0) + 1
    assert tally.lengths == expected


def test_small_tables_take_their_schema_and_an_empty_one_is_an_empty_directory(tmp_path: Path) -> None:
    schema = "date DATE, bucket INT, label STRING, lo_s DOUBLE, hi_s DOUBLE, sessions BIGINT"
    rows = [{"date": dt.date(2026, 5, 1), "bucket": 0, "label": "<1m", "lo_s": 0.0, "hi_s": 60.0, "sessions": 3}]
    write_rows(rows, schema, str(tmp_path / "t"))
    table = pq.read_table(next((tmp_path / "t").rglob("*.parquet")))
    assert [(f.name, str(f.type)) for f in table.schema] == [
        ("bucket", "int32"), ("label", "string"), ("lo_s", "double"), ("hi_s", "double"), ("sessions", "int64")]
    write_rows([], schema, str(tmp_path / "t"))  # overwrites
    assert os.listdir(tmp_path / "t") == []


def test_sessions_files_have_the_schema_spark_writes_the_table_with(tmp_path: Path) -> None:
    write_sessions(SESSIONS, ["d0", "d1"], str(tmp_path), "0-a.seg", Tally())
    arrow_of = {"STRING": "string", "BIGINT": "int64", "DOUBLE": "double", "BOOLEAN": "bool"}
    expected = [(name, arrow_of[kind]) for name, kind in (part.split() for part in SESSIONS_SCHEMA.split(", "))
                if name != "date"]  # the partition column: in the path
    for path in tmp_path.rglob("*.parquet"):
        assert [(f.name, str(f.type)) for f in pq.read_schema(path)] == expected
