"""Incremental runs (`--incremental --state DIR`) against one full computation over everything.

A generated two-daemon log (crashes with restart offlines, a graceful restart, flappers) is replayed as it
grew: hourly snapshots made from byte prefixes of its final segments (the active segment cut at a record
boundary, once in the middle of a record, as a reader sees a write in progress or a crash's torn tail),
retention deleting the oldest segments half way, once only one daemon writing. After every snapshot an
incremental run updates ``--out``; at the end its tables must equal the reference over the complete log,
row for row, and the sessions table must have grown by files, never rewriting one. The runs take the
paired path (`incpaired`) but one, forced onto the record path (`incremental`): each continues the other's
state.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from idled.log.eventlog import decode_buffer, encode_record, list_segments
from idled.pipeline.generate import DEFAULT_START, GenConfig, generate
from idled.pipeline.reference import compute, load_dirs
from idled.pipeline.rules import FlapParams
from tests.pipeline.test_pipeline import KEYS, assert_tables_equal

HOURS = 4
START = DEFAULT_START + 22 * 3600  # 22:00 UTC: the log crosses midnight, so runs rewrite a day they wrote before


def record_offsets(data: bytes) -> list[tuple[int, float]]:
    """(start offset, ts) of every record of a clean segment."""
    out = []
    offset = 0
    for record in decode_buffer(data).records:
        frame = encode_record(record)
        assert data.startswith(frame, offset), "records re-encode byte for byte"
        out.append((offset, record["ts"]))
        offset += len(frame)
    assert offset == len(data)
    return out


class GrowingLog:
    """A daemon directory replayed from a final one: `advance(t)` makes it hold what was written by time t."""

    def __init__(self, final: str, live: Path) -> None:
        self.segments = [(Path(path), record_offsets(Path(path).read_bytes())) for _, path in list_segments(final)]
        self.live = live
        live.mkdir(parents=True)
        self.deleted: set[str] = set()

    def advance(self, until: float, torn: int = 0) -> None:
        for path, offsets in self.segments:
            if path.name in self.deleted:
                continue
            data = path.read_bytes()
            cut = next((offset for offset, ts in offsets if ts > until), None)
            if cut is None:
                content = data
            else:
                content = data[: cut + torn]  # `torn` bytes of the next record: a write in progress
            if cut == 0 and not torn:
                break
            target = self.live / path.name
            if not target.exists() or target.read_bytes() != content:
                target.write_bytes(content)
            if cut is not None:
                break

    def retention(self, keep: int) -> None:
        """Delete all but the newest `keep` segments, as the daemon's retention does."""
        present = sorted(p.name for p in self.live.iterdir())
        for name in present[:-keep]:
            (self.live / name).unlink()
            self.deleted.add(name)


def snapshot(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


def session_files(out: Path) -> dict[str, tuple[int, int, int]]:
    """The sessions table's data files: path relative to `out` -> (size, mtime, inode)."""
    return {str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino)
            for p in (out / "sessions").rglob("*.parquet") if not p.name.startswith(".")}


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> dict[str, Any]:
    from idled.pipeline.job import JobConfig, run_job

    root = tmp_path_factory.mktemp("incremental")
    # devices: the carried open sessions keep their device; grace: offlines written after later events
    config = GenConfig(out=str(root / "final"), users=150, hours=HOURS, daemons=2, seed=5, segment_bytes=60_000,
                       flappers=0.05, start=START, devices=3, grace=20.0)
    generate(config, processes=1)
    finals = [config.daemon_dir(0), config.daemon_dir(1)]
    logs = [GrowingLog(final, root / "live" / f"daemon-{i}") for i, final in enumerate(finals)]
    live = [str(log.live) for log in logs]
    out, state = root / "out", root / "state"
    job = JobConfig(events=tuple(live), out=str(out), state=str(state), chart=False, flap=FlapParams())
    runs: list[dict[str, Any]] = []
    files: list[tuple[dict[str, tuple[int, int, int]], list[str]]] = []  # per run: sessions files, open files

    def run(session: Any = spark) -> dict[str, Any]:
        summary = run_job(job, spark=session).summary
        runs.append(summary)
        files.append((session_files(out), json.loads((state / "state.json").read_text())["open_files"]))
        return summary

    again = {}
    compacted: dict[str, Any] = {}
    for hours in (1, 2, 2.5, 3, 3.5, HOURS + 1):
        if hours == HOURS + 1:  # the first day's files compacted into one before the last run adds to it
            from idled.pipeline.compact import compact

            compacted.update(compact(str(out), 0, now=0.0), run=len(runs))
        # at 3.5 only daemon-0 wrote: daemon-1's open sessions are carried with their end unchanged
        for log in logs[:1] if hours == 3.5 else logs:
            log.advance(START + hours * 3600, torn=7 if hours == 2.5 else 0)
        if hours == 3:
            for log in logs:
                log.retention(keep=2)
        if hours == 2.5:  # the record path, as when new files overlap in seq; the paired path goes on from its state
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr("idled.pipeline.incpaired.plan_paired", lambda *args, **kwargs: None)
                run()
        else:
            run(None if hours == 3 else spark)  # at 3, no session: a small batch is paired in a process pool
        if hours == 2:  # the same input again: nothing is decoded, nothing rewritten
            before = snapshot(out)
            again = run()
            again["unchanged"] = snapshot(out) == before
    rows, _ = load_dirs(finals)
    reference = compute(rows, [os.path.abspath(p) for p in live])
    return {"out": out, "state": state, "runs": runs, "again": again, "reference": reference, "logs": logs,
            "files": files, "compacted": compacted}


def test_incremental_runs_equal_one_full_run(spark: Any, grown: dict[str, Any]) -> None:
    assert any(log.deleted for log in grown["logs"])  # retention deleted segments the first runs read
    sessions = grown["reference"].tables["sessions"]
    assert any(s["open"] and s["device"] for s in sessions) and any(s["end_device"] for s in sessions)
    for table in KEYS:
        rows = [r.asDict() for r in spark.read.parquet(str(grown["out"] / table)).collect()]
        assert rows, table
        if table != "flappers":
            assert len({r["date"] for r in rows}) == 2, table  # both days, the first rewritten after midnight
        assert_tables_equal(rows, grown["reference"].tables[table], table)


def test_incremental_counts_equal_one_full_run(grown: dict[str, Any]) -> None:
    counts = grown["runs"][-1]["counts"]
    ref = grown["reference"].counts
    assert counts["events"] == ref["events"] and counts["duplicates"] == 0
    assert counts["sessions"] == ref["sessions"] and counts["open_sessions"] == ref["open_sessions"]
    assert counts["orphan_offlines"] == ref["orphans"] and counts["superseded_sessions"] == ref["superseded"]
    reasons = {s["end_reason"] for s in grown["reference"].tables["sessions"]}
    last = grown["runs"][-1]  # freshness: the slowest daemon's data end; the files present, read
    assert last["watermark"] == min(last["data_end"].values()) > 0
    assert all(set(files) == {p.name for p in Path(d).iterdir()} for d, files in last["log_read"].items())
    assert {"restart", "shutdown"} <= reasons  # a crash and a graceful restart happened in between


def test_running_twice_on_the_same_input_changes_nothing(grown: dict[str, Any]) -> None:
    again = grown["again"]
    assert again["incremental"]["nothing_new"] and again["unchanged"]
    decoded = [r["incremental"]["files_decoded"] for r in grown["runs"]]
    assert decoded[2] == 0 and all(n > 0 for i, n in enumerate(decoded) if i != 2)
    paths = [r.get("pairing") for r in grown["runs"]]
    assert paths == ["paired", "paired", "paired", "records", "paired", "paired", "paired"], paths
    assert "no Spark" in grown["runs"][4]["master"] and "no Spark" not in grown["runs"][5]["master"]


def test_the_sessions_table_grows_by_files(spark: Any, grown: dict[str, Any]) -> None:
    from pyspark.sql import functions as F

    files = grown["files"]
    assert grown["compacted"]["partitions"] == 1 and grown["compacted"]["files_before"] > 1
    for index, ((before, opened), (after, _)) in enumerate(zip(files, files[1:])):
        assert opened and all(name in before for name in opened)
        if after == before or index + 1 == grown["compacted"]["run"]:  # nothing new; a compaction before the run
            continue  # the run with nothing new
        for name, stat in before.items():
            if name in opened:
                assert name not in after  # B held every open session: their files are replaced
            else:
                assert after.get(name) == stat, name  # a closed session's file is never rewritten
        if after != before:
            assert set(after) - set(before)  # new sessions: new files
    rows = spark.read.parquet(str(grown["out"] / "sessions")).select(F.input_file_name().alias("file"), "open").collect()
    last_open = {os.path.basename(name) for name in files[-1][1]}
    assert {os.path.basename(r["file"]) for r in rows if r["open"]} == last_open
    assert all(not r["open"] for r in rows if os.path.basename(r["file"]) not in last_open)


def test_state_is_small_and_refuses_other_inputs(grown: dict[str, Any], tmp_path: Path) -> None:
    from idled.pipeline.incremental import StateError, load_state

    data = json.loads((grown["state"] / "state.json").read_text())
    assert not (grown["state"] / "journal.json").exists() and not (grown["state"] / "staging").exists()
    assert [n for n in os.listdir(grown["state"]) if n.startswith("gen-")] == [f"gen-{data['generation']}"]
    with pytest.raises(StateError):
        load_state(str(grown["state"]), ["/elsewhere"], str(grown["out"]), FlapParams())
    with pytest.raises(StateError):
        load_state(str(grown["state"]), data["inputs"], str(grown["out"]), FlapParams(k=2))
    old = tmp_path / "v1"
    old.mkdir()
    (old / "state.json").write_text(json.dumps({**data, "version": 1}))  # its --out mixes open rows into files
    with pytest.raises(StateError, match="version 1"):
        load_state(str(old), data["inputs"], str(grown["out"]), FlapParams())
    (old / "state.json").write_text(json.dumps({**data, "version": 2}))  # its sessions have no device columns
    with pytest.raises(StateError, match=r"state version 2, expected 3 .*no device columns.*use a new --state and --out"):
        load_state(str(old), data["inputs"], str(grown["out"]), FlapParams())


def test_an_interrupted_commit_is_finished_by_the_next_run(tmp_path: Path) -> None:
    from idled.pipeline.incremental import apply_journal

    state, out = tmp_path / "state", tmp_path / "out"
    (state / "staging" / "dau" / "date=2026-05-01").mkdir(parents=True)
    (state / "staging" / "dau" / "date=2026-05-01" / "part.parquet").write_text("new")
    (out / "dau" / "date=2026-05-01").mkdir(parents=True)
    (out / "dau" / "date=2026-05-01" / "part.parquet").write_text("old")
    (out / "dau" / "date=2026-04-30").mkdir(parents=True)
    moves = [[str(state / "staging" / "dau" / "date=2026-05-01"), str(out / "dau" / "date=2026-05-01")],
             [None, str(out / "dau" / "date=2026-04-30")]]
    (state / "journal.json").write_text(json.dumps({"moves": moves, "state": {"generation": 3}}))
    (state / "gen-2").mkdir()
    apply_journal(str(state))
    apply_journal(str(state))  # idempotent
    assert (out / "dau" / "date=2026-05-01" / "part.parquet").read_text() == "new"
    assert not (out / "dau" / "date=2026-04-30").exists()
    assert json.loads((state / "state.json").read_text()) == {"generation": 3}
    assert sorted(os.listdir(state)) == ["state.json"]
    shutil.rmtree(tmp_path)


def test_an_interrupted_commit_of_added_files_is_finished_once(tmp_path: Path) -> None:
    from idled.pipeline.incremental import apply_journal

    state, out = tmp_path / "state", tmp_path / "out"
    staged = state / "staging" / "sessions" / "date=2026-05-02"
    staged.mkdir(parents=True)
    partition = out / "sessions" / "date=2026-05-02"
    partition.mkdir(parents=True)
    (partition / "g1-part-a.parquet").write_text("closed, run 1")
    (partition / "open-g1-part-b.parquet").write_text("open, run 1")
    for name in ("part-c.parquet", "part-d.parquet", "part-e.parquet"):
        (staged / name).write_text(name)
    moves = [[None, str(partition / "open-g1-part-b.parquet")],
             [str(staged / "part-c.parquet"), str(partition / "g2-part-c.parquet")],
             [str(staged / "part-d.parquet"), str(partition / "open-g2-part-d.parquet")],
             [str(staged / "part-e.parquet"), str(out / "sessions" / "date=2026-05-03" / "g2-part-e.parquet")]]
    (state / "journal.json").write_text(json.dumps({"moves": moves, "state": {"generation": 2}}))
    # interrupted after the first two moves
    (partition / "open-g1-part-b.parquet").unlink()
    (staged / "part-c.parquet").rename(partition / "g2-part-c.parquet")
    apply_journal(str(state))
    apply_journal(str(state))  # nothing left to do
    assert sorted(os.listdir(partition)) == ["g1-part-a.parquet", "g2-part-c.parquet", "open-g2-part-d.parquet"]
    assert (partition / "g2-part-c.parquet").read_text() == "part-c.parquet"
    assert os.listdir(out / "sessions" / "date=2026-05-03") == ["g2-part-e.parquet"]
    assert sorted(os.listdir(state)) == ["state.json"]
