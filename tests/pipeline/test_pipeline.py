"""Tests for idled.pipeline: decode, rules (reference), generator, and the Spark job against the reference.

One session-scoped local[2] SparkSession; the data is small (a few thousand events) so the Spark tests run
in seconds once the JVM is up. Every Spark output table is compared row by row with `reference.compute` on
the same segments: two generated daemons (crashes with restart offlines, a graceful shutdown, flappers, a
corrupt record and a torn tail each) plus a hand-written daemon holding the edge cases (duplicates,
superseded, orphan, malformed, int/str uid twins, a broken segment, files named out of seq order).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from idled.cli.main import main
from idled.cli.pipeline import add_arguments
from idled.log.eventlog import EventLog, decode_buffer, encode_record, list_segments
from idled.pipeline import records as records_module
from idled.pipeline.generate import DEFAULT_START, GenConfig, generate, uid_for
from idled.pipeline.records import FileStats, iter_rows, to_row, uid_key
from idled.pipeline.reference import Result, compute, load_dirs, run_reference
from idled.pipeline.rules import FlapParams, bucket_index, bucket_label, minute_range, percentile
from idled.pipeline.runflags import main_submit

# Key columns per table: they identify a row, everything else is compared as a value.
KEYS = {
    "sessions": ("daemon", "uid", "uid_type", "online_seq"),
    "concurrency": ("minute_start",),
    "lateness": ("detector", "hour_start"),
    "flappers": ("date", "uid", "uid_type"),
    "dau": ("date",),
    "session_lengths": ("date", "bucket"),
}

T0 = DEFAULT_START + 86400 - 300  # five minutes before midnight of the first day


# ---------------------------------------------------------------------------------------------- data


def event(seq: int, kind: str, uid: Any, ts: float, reason: Any = None, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"seq": seq, "kind": kind, "uid": uid, "ts": ts}
    record["reason"] = reason if reason is not None else ("login" if kind == "online" else "closed")
    record.update({"last_seen": ts, "deadline": ts + 45.0, "timeout": 45.0, "detector": "ring-lazy"})
    record.update(extra)
    return {k: v for k, v in record.items() if v is not DROP}


DROP = object()


def crafted_events() -> list[dict[str, Any]]:
    """Every edge case of the rules, in seq order (ts is not monotonic on purpose in one place)."""
    evs: list[dict[str, Any]] = []

    def add(kind: str, uid: Any, ts: float, reason: Any = None, **extra: Any) -> None:
        evs.append(event(len(evs) + 1, kind, uid, ts, reason, **extra))

    add("online", 42, T0)  # int 42 and str "42" are two users
    add("online", "42", T0 + 10)
    add("offline", 42, T0 + 100, "logout")
    add("offline", "42", T0 + 700.0, "idle", deadline=T0 + 699.5)  # crosses midnight; lateness 0.5
    add("online", "dup", T0 + 5)
    add("online", "dup", T0 + 50)  # no offline before: the first session is superseded
    add("offline", "dup", T0 + 60, "closed")
    add("offline", "ghost", T0 + 20, "idle", deadline=T0 + 19.0)  # orphan, still a lateness sample
    add("online", 3.5, T0 + 30)  # malformed: float uid
    add("bounce", "x", T0 + 31)  # malformed: unknown kind
    add("online", True, T0 + 32)  # malformed: bool uid
    add("online", "nots", float("nan"))  # malformed: NaN ts
    for i in range(6):  # a flapper: six 10 s sessions, 30 s apart
        add("online", "flap", T0 + 1000 + 30 * i)
        add("offline", "flap", T0 + 1010 + 30 * i, "closed")
    for i in range(5):  # five short sessions, but spread over more than the 1 h window
        add("online", "slow", T0 + 1000 + 1000 * i)
        add("offline", "slow", T0 + 1005 + 1000 * i, "gateway_lost")
    for i in range(6):  # short, but ended by the daemon: not flapping
        add("online", "victim", T0 + 1100 + 20 * i)
        add("offline", "victim", T0 + 1105 + 20 * i, "restart" if i % 2 else "shutdown")
    add("online", "r1", T0 + 2000)
    add("offline", "r1", T0 + 2100, "restart")
    add("online", "z", T0 + 4000)
    add("offline", "z", T0 + 4000, "closed")  # zero length
    add("online", "neg", T0 + 5000)
    add("offline", "neg", T0 + 4990, "closed")  # the wall clock stepped back: -10 s
    add("online", "nr", T0 + 5100)
    add("offline", "nr", T0 + 5200, DROP)  # no reason at all
    add("online", "nd", T0 + 5300)
    add("offline", "nd", T0 + 5400, "idle", deadline=DROP, detector=DROP)  # idle without deadline
    add("online", "ndet", T0 + 5500)
    add("offline", "ndet", T0 + 5600, "idle", deadline=T0 + 5599.0, detector=DROP)  # detector "unknown"
    add("online", uid_for(0), DEFAULT_START + 600)  # the same uid as a user of generated daemon 0
    add("offline", uid_for(0), DEFAULT_START + 4000, "logout")
    add("online", "stay", T0 + 6000)  # still open at the end of the data
    add("online", "late", T0 + 7000)
    add("offline", "late", T0 + 7200.5, "idle", deadline=T0 + 7200.0)
    return evs


def write_crafted(directory: Path) -> dict[str, int]:
    """The crafted daemon: written with EventLog, then damaged and shuffled. Returns what was done."""
    staging = directory.parent / (directory.name + "-staging")
    log = EventLog(staging, segment_bytes=600)
    log.recover()
    evs = crafted_events()
    log.append(evs[:20])
    log.append(evs[20:])
    log.sync()
    log.close()
    segments = [path for _, path in list_segments(staging)]
    assert len(segments) >= 5
    directory.mkdir()
    # Files named out of seq order: the segment holding the first records gets the last name, etc.
    names = [os.path.basename(p) for p in segments]
    for path, name in zip(segments, reversed(names)):
        shutil.copyfile(path, directory / name)
    # A second copy of the first segment: all of its records are duplicates.
    shutil.copyfile(segments[0], directory / "copy-of-first.seg")
    duplicates = len(decode_buffer(Path(segments[0]).read_bytes()).records)
    # A CRC failure: flip a body byte of the "late" online record.
    late_online = encode_record(next(e for e in evs if e["uid"] == "late" and e["kind"] == "online"))
    for path in directory.iterdir():
        data = path.read_bytes()
        at = data.find(late_online)
        if at >= 0:
            path.write_bytes(data[: at + 20] + bytes([data[at + 20] ^ 0x55]) + data[at + 21 :])
            break
    else:
        raise AssertionError("record to corrupt not found")
    # A torn tail on the file holding the newest record, and a segment that is garbage from its first header.
    newest = directory / names[0]
    torn = encode_record(event(len(evs) + 1, "online", "torn", T0 + 8000))[:-7]
    with open(newest, "ab") as file:
        file.write(torn)
    (directory / "broken.seg").write_bytes(b"\xff\xff\xff\xff\x00\x00\x00\x00" + b"garbage")
    shutil.rmtree(staging)
    return {"duplicates": duplicates, "torn_bytes": len(torn) + 15}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pipeline")
    config = GenConfig(out=str(root / "gen"), users=300, hours=3, daemons=2, seed=7, segment_bytes=150_000, flappers=0.05,
                       damage=True)
    stats = generate(config, processes=1)
    crafted = root / "crafted"
    damage = write_crafted(crafted)
    dirs = [config.daemon_dir(0), config.daemon_dir(1), str(crafted)]
    # The crafted daemon without its copied segment: every edge case, but no seq overlap, so the job pairs
    # in the decode stage (`paired`) instead of falling back to record-by-record pairing.
    clean = root / "crafted-clean"
    shutil.copytree(crafted, clean)
    (clean / "copy-of-first.seg").unlink()
    return {"root": root, "dirs": dirs, "stats": stats, "damage": damage, "clean_crafted": str(clean)}


@pytest.fixture(scope="module")
def reference(dataset: dict[str, Any]) -> tuple[Result, dict[str, FileStats]]:
    return run_reference(dataset["dirs"])


# The job over all three daemons takes the record-by-record, duplicate-dropping path (the crafted daemon has
# a copied segment, so seq ranges overlap); over the generated daemons alone, and with the crafted daemon
# minus its copy (superseded, orphans, malformed, twins, a uid shared with daemon 0, files out of name
# order, tiny segments: many file edges), it pairs in the decode stage.
VARIANTS = {"all": "records", "generated": "paired", "edge-cases": "paired"}


def variant_dirs(dataset: dict[str, Any], name: str) -> list[str]:
    dirs = dataset["dirs"]
    return {"all": dirs, "generated": dirs[:2], "edge-cases": [*dirs[:2], dataset["clean_crafted"]]}[name]


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, dataset: dict[str, Any]) -> dict[str, Any]:
    dirs = variant_dirs(dataset, request.param)
    return {"name": request.param, "dirs": dirs, "reference": run_reference(dirs)}


# ---------------------------------------------------------------------------------------------- decode


def test_uid_key_keeps_type() -> None:
    assert uid_key(42) == "i:42"
    assert uid_key("42") == "s:42"
    assert uid_key(True) is None and uid_key(4.2) is None and uid_key(None) is None


def test_to_row_keeps_deadline_only_for_idle_offlines() -> None:
    online = to_row(event(1, "online", 7, 100.0), daemon=3)
    assert online == (3, 1, True, "i:7", 100.0, "login", None, None, None, None)
    idle = to_row(event(2, "offline", "u", 200.0, "idle", deadline=199.0), daemon=0)
    assert idle == (0, 2, False, "s:u", 200.0, "idle", 199.0, "ring-lazy", None, None)
    assert to_row(event(3, "offline", "u", 200.0, "logout"), daemon=0)[6:8] == (None, None)
    assert to_row(event(4, "online", "u", float("inf")), daemon=0) is None


def test_chunked_decode_equals_whole_buffer_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    evs = [event(i, "online" if i % 2 else "offline", f"u{i % 5}", 1000.0 + i) for i in range(1, 400)]
    frames = [encode_record(e) for e in evs]
    frames[100] = frames[100][:-1] + bytes([frames[100][-1] ^ 1])  # CRC failure
    data = b"".join(frames) + frames[0][:9]  # torn tail
    whole = decode_buffer(data)
    monkeypatch.setattr(records_module, "CHUNK_BYTES", 1000)  # windows cut records everywhere
    stats = FileStats()
    rows = list(iter_rows(data, 0, stats))
    assert [r[1] for r in rows] == [r["seq"] for r in whole.records]
    assert (stats.records, stats.corrupt, stats.torn_bytes, stats.bytes) == (len(whole.records), 1, 9, len(data))


def test_a_damaged_length_is_skipped_and_the_records_after_it_kept() -> None:
    first, second = encode_record(event(1, "online", "a", 1.0)), encode_record(event(2, "online", "b", 2.0))
    stats = FileStats()
    assert [r[1] for r in iter_rows(first + b"\x00\x00\x00\x00" + second, 0, stats)] == [1, 2]
    assert (stats.broken, stats.corrupt, stats.torn_bytes) == (False, 1, 0)


def test_damage_with_nothing_good_after_it_marks_the_file_broken() -> None:
    first = encode_record(event(1, "online", "a", 1.0))
    stats = FileStats()
    assert [r[1] for r in iter_rows(first + b"\xff" * 64, 0, stats)] == [1]
    assert stats.broken and stats.corrupt == 1


# ---------------------------------------------------------------------------------------------- rules


def test_rule_helpers() -> None:
    assert minute_range(60.0, 120.0) == (1, 1)  # [60, 120) is minute 1 only
    assert minute_range(59.5, 120.5) == (0, 2)
    assert minute_range(90.0, 90.0) == (1, 1)
    assert [bucket_index(d) for d in (-5.0, 0.0, 9.99, 10.0, 59.0, 86400.0, 1e9)] == [0, 0, 0, 1, 2, 12, 12]
    assert bucket_label(0) == "0s-10s" and bucket_label(3) == "1m-2m" and bucket_label(12) == "1d+"
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.99) == 5.0
    assert percentile([0.0, 10.0], 0.99) == pytest.approx(9.9)


def by_key(rows: list[dict[str, Any]], table: str) -> dict[tuple, dict[str, Any]]:
    out = {tuple(row[k] for k in KEYS[table]): row for row in rows}
    assert len(out) == len(rows), f"{table}: key columns do not identify rows"
    return out


def test_reference_applies_the_rules_to_the_crafted_daemon(tmp_path: Path) -> None:
    evs = crafted_events()
    rows = [r for r in (to_row(e, 0) for e in evs) if r is not None]
    assert len(rows) == len(evs) - 4  # four malformed
    result = compute(rows, ["d"], FlapParams())
    sessions = {(s["uid"], s["uid_type"], s["online_seq"]): s for s in result.tables["sessions"]}
    assert sessions[("42", "int", 1)]["end_reason"] == "logout" and sessions[("42", "int", 1)]["duration_s"] == 100
    assert sessions[("42", "str", 2)]["end_reason"] == "idle"
    dup = sorted((s for s in result.tables["sessions"] if s["uid"] == "dup"), key=lambda s: s["online_seq"])
    assert [(s["end_reason"], s["duration_s"]) for s in dup] == [("superseded", 45.0), ("closed", 10.0)]
    assert result.counts["orphans"] == 1 and result.counts["superseded"] == 1
    stay = next(s for s in result.tables["sessions"] if s["uid"] == "stay")
    assert stay["open"] and stay["offline_ts"] is None and stay["end_reason"] is None
    assert next(s for s in result.tables["sessions"] if s["uid"] == "neg")["duration_s"] == -10.0
    assert next(s for s in result.tables["sessions"] if s["uid"] == "nr")["end_reason"] is None
    assert sessions[("42", "str", 2)]["date"] == dt.date(2026, 5, 1)

    flappers = {(f["uid"], f["date"]): f for f in result.tables["flappers"]}
    assert set(u for u, _ in flappers) == {"flap"}  # not "slow" (spread out), not "victim" (daemon-ended)
    flap = flappers[("flap", dt.date(2026, 5, 2))]
    assert flap["short_sessions"] == 6 and flap["max_in_window"] == 6
    assert flap["first_flagged_ts"] == T0 + 1000 + 30 * 4  # the fifth start is the first with k=5 in the window

    lateness = {(r["detector"], r["hour_start"]): r for r in result.tables["lateness"]}
    # "ghost" (orphan), "42" and "late" idle offlines; "nd" has no deadline; "ndet" has no detector.
    assert sorted((d, r["offlines"]) for (d, _), r in lateness.items()) == [("ring-lazy", 1), ("ring-lazy", 1), ("ring-lazy", 1), ("unknown", 1)]
    assert lateness[("ring-lazy", int(T0 // 3600) * 3600)]["max_s"] == pytest.approx(1.0)  # ghost: 1 s late
    assert result.counts["duplicates"] == 0

    # concurrency: in the minute of T0 (23:55) users 42, "42", dup are online; "ghost" never was.
    minutes = {r["minute_start"]: r["users_online"] for r in result.tables["concurrency"]}
    assert minutes[int(T0 // 60) * 60] == 3
    dau = {r["date"]: r for r in result.tables["dau"]}
    # the uid_for(0) session is on 05-01; "42" (str) spans midnight and counts on both days.
    assert dau[dt.date(2026, 5, 1)]["active_users"] == 4
    assert dau[dt.date(2026, 5, 1)]["sessions_started"] == 5  # 42, "42", dup twice, uid_for(0)


# ---------------------------------------------------------------------------------------------- generator


def test_generated_logs_are_realistic(dataset: dict[str, Any], reference: tuple[Result, dict[str, FileStats]]) -> None:
    result, files = reference
    stats = dataset["stats"]
    assert [s.detector for s in stats] == ["ring-lazy", "heap"]
    for s in stats:
        assert s.segments >= 2 and s.truncated_bytes > 0  # rotated, and crashes left torn records behind
        assert s.restart_offlines > 0 and s.shutdown_offlines > 0 and s.corrupted_seq is not None
    generated = [st for path, st in files.items() if not path.startswith(dataset["dirs"][2])]
    assert sum(st.corrupt for st in generated) == 2  # one flipped record per daemon
    assert sum(st.torn_bytes for st in generated) == sum(s.torn_tail_bytes for s in stats)
    assert sum(st.records for st in generated) == sum(s.events for s in stats) - 2
    sessions = result.tables["sessions"]
    reasons = {s["end_reason"] for s in sessions}
    assert {"idle", "closed", "logout", "restart", "shutdown", "gateway_lost", "detach"} <= reasons
    uids = {(s["uid"], s["uid_type"]) for s in sessions}
    assert ("1000100", "int") in uids and ("1000100", "str") in uids
    assert any(f["uid"] != "flap" for f in result.tables["flappers"])  # generated flappers are found
    heap = [r for r in result.tables["lateness"] if r["detector"] == "heap"]
    assert heap and all(0.0 <= r["p50_s"] <= 1.2 and r["early"] == 0 for r in heap)


def test_generator_is_deterministic(tmp_path: Path) -> None:
    def digest(out: Path) -> list[bytes]:
        generate(GenConfig(out=str(out), users=50, hours=1, seed=3))
        return [Path(p).read_bytes() for _, p in list_segments(out)]

    assert digest(tmp_path / "a") == digest(tmp_path / "b")


# ---------------------------------------------------------------------------------------------- Spark


def assert_tables_equal(spark_rows: list[dict[str, Any]], ref_rows: list[dict[str, Any]], table: str) -> None:
    got, want = by_key(spark_rows, table), by_key(ref_rows, table)
    assert set(got) == set(want), f"{table}: rows differ: extra {sorted(set(got) - set(want))[:5]}, missing {sorted(set(want) - set(got))[:5]}"
    for key, row in want.items():
        other = got[key]
        assert set(other) == set(row), f"{table}: columns {sorted(other)} != {sorted(row)}"
        for column, expected in row.items():
            actual = other[column]
            if isinstance(expected, float) and actual is not None:
                assert math.isclose(actual, expected, rel_tol=1e-12, abs_tol=1e-9), (table, key, column, actual, expected)
            else:
                assert actual == expected, (table, key, column, actual, expected)


@pytest.fixture(scope="module")
def job_result(spark: Any, dataset: dict[str, Any], variant: dict[str, Any]) -> dict[str, Any]:
    from idled.pipeline.job import JobConfig, run_job

    out = dataset["root"] / f"out-{variant['name']}"
    result = run_job(JobConfig(events=tuple(variant["dirs"]), out=str(out), min_partitions=5, chart=False), spark=spark)
    return {"out": out, "summary": result.summary}


@pytest.mark.parametrize("table", list(KEYS))
def test_spark_table_equals_reference(spark: Any, job_result: dict[str, Any], variant: dict[str, Any], table: str) -> None:
    rows = [row.asDict() for row in spark.read.parquet(str(job_result["out"] / table)).collect()]
    assert rows, f"{table} is empty"
    assert_tables_equal(rows, variant["reference"][0].tables[table], table)


@pytest.mark.parametrize("name", ["edge-cases", "all"])
def test_a_local_run_without_spark_gives_the_same_tables(spark: Any, dataset: dict[str, Any], tmp_path: Path,
                                                          name: str) -> None:
    """No session given and a local master: the paired path runs in a process pool (`pool`), no JVM; when its
    premise fails (the crafted daemon's copied segment) Spark starts for the record path."""
    from idled.pipeline.job import JobConfig, run_job

    dirs = variant_dirs(dataset, name)
    config = JobConfig(events=tuple(dirs), out=str(tmp_path / "out"), master="local[2]", min_partitions=5, chart=False)
    summary = run_job(config).summary
    assert summary["pairing"] == VARIANTS[name]
    assert ("no Spark: a pool of 2 processes" in summary["master"]) == (VARIANTS[name] == "paired")
    reference = run_reference(dirs)[0]
    for table in KEYS:
        rows = [row.asDict() for row in spark.read.parquet(str(tmp_path / "out" / table)).collect()]
        assert_tables_equal(rows, reference.tables[table], table)
    assert summary["counts"]["sessions"] == reference.counts["sessions"]


def test_spark_counts_equal_reference(job_result: dict[str, Any], variant: dict[str, Any], dataset: dict[str, Any]) -> None:
    counts = job_result["summary"]["counts"]
    result, files = variant["reference"]
    crafted = variant["name"] == "all"
    assert job_result["summary"]["pairing"] == VARIANTS[variant["name"]]
    assert counts["events"] == result.counts["events"]
    assert counts["duplicates"] == result.counts["duplicates"] == (dataset["damage"]["duplicates"] if crafted else 0)
    assert counts["daemons_with_overlapping_files"] == int(crafted)
    assert counts["sessions"] == result.counts["sessions"]
    assert counts["open_sessions"] == result.counts["open_sessions"]
    assert counts["orphan_offlines"] == result.counts["orphans"]
    assert counts["superseded_sessions"] == result.counts["superseded"]
    assert counts["files"] == len(files)
    for name in ("corrupt", "malformed", "torn_bytes", "records", "bytes"):
        assert counts[name] == sum(getattr(st, name) for st in files.values()), name
    if variant["name"] != "generated":  # 2 generated daemons x 1 flipped record, 1 in the crafted daemon, 1 broken.seg
        assert counts["corrupt"] == 4 and counts["broken_files"] == 1 and counts["malformed"] == 4
        assert counts["superseded_sessions"] == 1 and counts["orphan_offlines"] >= 1
    else:
        assert counts["corrupt"] == 2 and counts["broken_files"] == 0 and counts["malformed"] == 0
    timings = job_result["summary"]["timings_s"]
    assert {"spark_start", "decode", "aggregate", "total"} <= set(timings)
    # freshness: the slowest daemon's data end, every file read up to its torn tail
    summary = job_result["summary"]
    assert summary["watermark"] == min(summary["data_end"].values()) and summary["watermark"] > 0
    read = summary["log_read"]
    assert sum(len(files) for files in read.values()) == counts["files"]
    assert sum(n for files in read.values() for n in files.values()) == counts["bytes"] - counts["torn_bytes"]


def test_run_command_end_to_end(spark: Any, dataset: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli-out"
    argv = ["pipeline", "run", "--master", "local[2]", "--out", str(out), "--flap-k", "3"]
    for directory in dataset["dirs"][:2]:
        argv += ["--events", directory]
    assert main(argv) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "events from 2 daemon(s)" in printed and "idle-offline lateness" in printed
    assert "done in" not in captured.err and "[Stage" not in captured.err  # not a terminal: no progress
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["corrupt"] == 2 and summary["flap_params"]["k"] == 3
    assert summary["counts"]["events"] == sum(s.events for s in dataset["stats"]) - 2
    assert summary["events_per_s"]["end_to_end"] > 0
    for table in KEYS:
        partitions = sorted(p.name for p in (out / table).iterdir() if p.name.startswith("date="))
        assert partitions and partitions[0] == "date=2026-05-01", table
    assert (out / "concurrency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert spark.range(3).count() == 3  # the command left the caller's session running


def test_directories_given_as_uris_are_read_through_spark_into_the_same_tables(spark: Any, dataset: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    """A URI is not listed by the driver (`paired.runs_of_files`): binaryFiles reads it, one file per task."""
    from pyspark.sql import functions as F

    from idled.pipeline.job import JobConfig, run_job

    dirs = [os.path.abspath(d) for d in variant_dirs(dataset, "generated")]
    runs = {}
    for name, events in (("paths", tuple(dirs)), ("uris", tuple(f"file://{d}" for d in dirs))):
        summary = run_job(JobConfig(events=events, out=str(tmp_path / name), chart=False), spark=spark).summary
        assert summary["pairing"] == "paired" and summary["inputs"] == list(events)
        runs[name] = summary
    assert runs["uris"]["counts"] == runs["paths"]["counts"]
    for table in KEYS:
        expected = spark.read.parquet(str(tmp_path / "paths" / table))
        got = spark.read.parquet(str(tmp_path / "uris" / table)).select(*expected.columns)
        if "daemon" in expected.columns:  # named by its URI
            got = got.withColumn("daemon", F.regexp_replace("daemon", "^file://", ""))
        assert expected.exceptAll(got).count() == 0 and got.exceptAll(expected).count() == 0, table


def test_run_over_nothing_but_garbage(spark: Any, tmp_path: Path) -> None:
    from idled.pipeline.job import JobConfig, run_job

    events = tmp_path / "events"
    events.mkdir()
    (events / "00000000000000000001.seg").write_bytes(b"\xff\xff\xff\xff\x00\x00\x00\x00garbage")
    summary = run_job(JobConfig(events=(str(events),), out=str(tmp_path / "out")), spark=spark).summary
    # One damaged region (the resync decides the first 5 bytes are damage); from offset 5 on, the bytes read
    # as a plausible old-format header whose body would run past the end: undecidable, left as the torn tail.
    assert summary["counts"]["events"] == 0 and summary["counts"]["corrupt"] == 1 and summary["counts"]["torn_bytes"] == 10
    assert summary["peak_concurrency"]["users_online"] == 0 and summary["dau"] == [] and "chart" in summary


def test_conf_flag_parses_key_value_pairs() -> None:
    parser = argparse.ArgumentParser(prog="idled pipeline")
    add_arguments(parser)
    args = parser.parse_args(["run", "--events", "d", "--out", "o", "--conf", "spark.a=1", "--conf", "spark.b=x=y"])
    assert args.conf == [("spark.a", "1"), ("spark.b", "x=y")]
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--events", "d", "--out", "o", "--conf", "novalue"])


def test_run_command_rejects_missing_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    for events in (tmp_path / "nope", tmp_path / "empty"):
        assert main(["pipeline", "run", "--events", str(events), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "nope: no such directory" in err and "empty: no *.seg files" in err
    # The spark-submit entry takes the same flags and checks the same way (before starting Spark).
    assert main_submit(["--events", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "no such directory" in capsys.readouterr().err


GENERATE = ["pipeline", "generate", "--users", "40", "--hours", "0.5", "--daemons", "2", "--crashes", "1"]


def test_generate_command_writes_clean_logs_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, extra in (("default", []), ("no-damage", ["--no-damage"])):  # --no-damage: deprecated, the default
        assert main([*GENERATE, "--out", str(tmp_path / name), *extra]) == 0
        printed = capsys.readouterr().out
        assert "events/s" in printed and "damaged" not in printed
        rows, files = load_dirs([str(tmp_path / name / "daemon-0"), str(tmp_path / name / "daemon-1")])
        assert rows and len(files) == 2
        assert sum(f.corrupt for f in files.values()) == 0 and sum(f.torn_bytes for f in files.values()) == 0
    segments = [[Path(p).read_bytes() for _, p in list_segments(tmp_path / name / "daemon-0")] for name in ("default", "no-damage")]
    assert segments[0] == segments[1]


def test_generate_command_damages_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*GENERATE, "--out", str(tmp_path), "--damage"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("damaged: corrupted seq ") == 2
    rows, files = load_dirs([str(tmp_path / "daemon-0"), str(tmp_path / "daemon-1")])
    assert rows and len(files) == 2 and sum(f.corrupt for f in files.values()) == 2
    assert sum(f.torn_bytes for f in files.values()) > 0


def test_every_pipeline_flag_has_help() -> None:
    parser = argparse.ArgumentParser(prog="idled pipeline")
    add_arguments(parser)
    actions = {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
               for name, sub in action.choices.items()}
    assert set(actions) == {"run", "generate", "cluster", "status", "compact"}
    for name, sub in actions.items():
        for action in sub._actions:
            assert action.help, f"pipeline {name} {action.option_strings}: no help"
    help_text = {a.dest: a.help for a in actions["run"]._actions}
    # both meanings: the paired path's runs of files, and binaryFiles' hint for URIs and the record path
    assert "runs of consecutive segment files" in help_text["min_partitions"] and "32 MiB" in help_text["min_partitions"]


def test_importing_the_package_imports_neither_pyspark_nor_the_cli() -> None:
    pipeline = sorted(f"idled.pipeline.{p.stem}" for p in Path(records_module.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert "idled.pipeline.job" in pipeline and "idled.pipeline.submit" in pipeline
    code = (
        f"import sys, importlib\nfor name in {pipeline!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in ('pyspark', 'matplotlib', 'idled.cli') if m in sys.modules))\n"
        "import idled.cli.pipeline, idled.cli.main\n"
        "print(sorted(m for m in ('pyspark', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # The package never imports the cli layer above it; neither layer imports pyspark or matplotlib.
    assert out.split() == ["[]", "[]"]


@pytest.mark.slow
def test_run_shows_progress_on_a_terminal(dataset: dict[str, Any], tmp_path: Path) -> None:
    """stderr a pty: a line per finished step (and Spark's progress bar for stages longer than 0.5 s)."""
    import pty
    import select

    pytest.importorskip("pyspark")
    controller, terminal = pty.openpty()
    argv = [sys.executable, "-m", "idled.cli.main", "pipeline", "run", "--master", "local[2]", "--no-chart",
            "--driver-memory", "1g", "--out", str(tmp_path / "out"), "--events", dataset["dirs"][0]]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 300)
        if not ready:
            break
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    stdout = proc.stdout.read() if proc.stdout else b""
    assert proc.wait(60) == 0
    os.close(controller)
    text = shown.decode(errors="replace")
    # the paired path: sessions are written while decoding, then the second pass and the small tables
    assert "idled pipeline: decoded" in text and "user pass done in" in text and "write small tables done in" in text
    assert b"events from 1 daemon(s)" in stdout and b"done in" not in stdout
