"""`idled pipeline compact` on a sessions table laid out as incremental runs leave it (plain pyarrow, no
Spark; compaction between incremental runs is in test_incremental)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from idled.cli.main import main
from idled.pipeline.compact import compact, finish_compaction, output_lock, parse_age

DAY = 86400
START = 1777593600.0  # 2026-05-01


def _sessions(first: int, count: int, day: int, open_: bool = False) -> pa.Table:
    online = [START + day * DAY + (first + i) * 7.0 for i in range(count)]
    offline = [None if open_ else ts + 600 - (i % 5) * 100 for i, ts in enumerate(online)]
    return pa.table({"daemon": ["/d0"] * count, "uid": [str(first + i) for i in range(count)], "uid_type": ["int"] * count,
                     "online_seq": pa.array(range(first, first + count), pa.int64()), "online_ts": online,
                     "offline_seq": pa.array([None if open_ else s + 1 for s in range(first, first + count)], pa.int64()),
                     "offline_ts": pa.array(offline, pa.float64()), "open": [open_] * count})


def _table(tmp_path: Path) -> Path:
    """Day 0: three run files and an open one; day 9 (recent): two run files; watermark in day 10."""
    out = tmp_path / "out"
    old, recent = out / "sessions" / "date=2026-05-01", out / "sessions" / "date=2026-05-10"
    old.mkdir(parents=True)
    recent.mkdir(parents=True)
    for gen in range(3):
        pq.write_table(_sessions(gen * 100, 100, 0), old / f"g{gen + 1}-part-0.parquet")
    pq.write_table(_sessions(1000, 10, 0, open_=True), old / "open-g3-part-0.parquet")
    for gen in range(2):
        pq.write_table(_sessions(gen * 100, 50, 9), recent / f"g{gen + 1}-part-0.parquet")
    (out / "summary.json").write_text(json.dumps({"watermark": START + 9 * DAY + 3600}))
    return out


def _rows(partition: Path) -> list[tuple]:
    table = pq.ParquetDataset(str(partition)).read()
    return sorted(zip(*(table[c].to_pylist() for c in ("online_seq", "offline_ts", "open"))))


def test_compact_rewrites_old_partitions_sorted_and_is_idempotent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _table(tmp_path)
    old, recent = out / "sessions" / "date=2026-05-01", out / "sessions" / "date=2026-05-10"
    before_old, before_recent = _rows(old), sorted(os.listdir(recent))
    assert main(["pipeline", "compact", "--out", str(out), "--older-than", "2d"]) == 0
    assert "1 partition(s), 3 files -> 1 (300 rows)" in capsys.readouterr().out
    names = sorted(os.listdir(old))
    assert len(names) == 2 and names[1] == "open-g3-part-0.parquet" and names[0].startswith("compact-")
    assert _rows(old) == before_old and sorted(os.listdir(recent)) == before_recent
    offline = pq.read_table(old / names[0])["offline_ts"].to_pylist()
    assert offline == sorted(offline)
    assert not (out / "_compact").exists()
    stat = (old / names[0]).stat()
    assert compact(str(out), 2 * DAY, now=0.0)["partitions"] == 0  # idempotent: nothing to do
    assert (old / names[0]).stat().st_mtime_ns == stat.st_mtime_ns
    assert compact(str(out), 0, now=0.0)["partitions"] == 0  # day 9 is not over at the watermark


def test_an_interrupted_compaction_is_finished_once(tmp_path: Path) -> None:
    out = _table(tmp_path)
    old = out / "sessions" / "date=2026-05-01"
    staged = out / "_compact" / "staging" / "date=2026-05-01"
    staged.mkdir(parents=True)
    pq.write_table(pq.ParquetDataset([str(old / f"g{g}-part-0.parquet") for g in (1, 2, 3)]).read(), staged / "c-0.parquet")
    moves = [[str(staged / "c-0.parquet"), str(old / "c-0.parquet")], *[[None, str(old / f"g{g}-part-0.parquet")] for g in (1, 2, 3)]]
    (out / "_compact" / "journal.json").write_text(json.dumps({"moves": moves}))
    (staged / "c-0.parquet").rename(old / "c-0.parquet")  # interrupted after the first move
    finish_compaction(str(out))
    finish_compaction(str(out))
    assert sorted(os.listdir(old)) == ["c-0.parquet", "open-g3-part-0.parquet"] and not (out / "_compact").exists()
    assert len(_rows(old)) == 310


def test_compaction_waits_for_the_lock_an_incremental_run_holds(tmp_path: Path) -> None:
    out = _table(tmp_path)
    with output_lock(str(out)):
        worker = threading.Thread(target=compact, args=(str(out), 2 * DAY, 0.0))
        worker.start()
        worker.join(timeout=0.5)
        assert worker.is_alive()  # waiting: the partition is untouched
        assert len(os.listdir(out / "sessions" / "date=2026-05-01")) == 4
    worker.join()
    assert len(os.listdir(out / "sessions" / "date=2026-05-01")) == 2
    with output_lock(str(out)), pytest.raises(BlockingIOError):
        with output_lock(str(out), blocking=False):
            pass


def test_ages_parse() -> None:
    assert [parse_age(t) for t in ("90", "90s", "30m", "12h", "2d", "1.5d")] == [90, 90, 1800, 43200, 172800, 129600]
    assert main(["pipeline", "compact", "--out", "/nonexistent"]) == 2
