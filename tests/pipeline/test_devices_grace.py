"""Devices and grace in the pipeline (issue 25): the sessions table's device columns, user-level sessions, and
``--grace`` joining sessions for flappers and session_lengths.

A crafted daemon holds every case of the grace rule (`rules`, rule 6) with device fields on its records, in
tiny segments (many file edges: the devices cross them in the paired path's carries); two generated daemons
run with devices and the daemon's own grace (``GenConfig.devices`` / ``grace``: grace offlines written after
other users' later events). The Spark job is compared row by row with the reference on both paths: the paired
path and the record path (taken when a segment is copied), with and without ``--grace``.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from idled.cli.main import main
from idled.cli.pipeline import add_arguments
from idled.log.eventlog import EventLog, decode_buffer, list_segments
from idled.pipeline.generate import DEFAULT_START, GenConfig, generate
from idled.pipeline.records import FileStats, iter_rows, to_row
from idled.pipeline.reference import compute, load_dirs, run_reference
from idled.pipeline.rules import FlapParams
from tests.pipeline.test_pipeline import KEYS, assert_tables_equal, event

T = DEFAULT_START + 3600.0
GRACE = 30.0
FLAP = FlapParams(k=5, short_s=60.0, window_s=3600)


def crafted_events() -> list[dict[str, Any]]:
    """Every case of the grace rule, devices on most records; in seq order."""
    evs: list[dict[str, Any]] = []

    def add(kind: str, uid: Any, ts: float, reason: Any = None, **extra: Any) -> None:
        evs.append(event(len(evs) + 1, kind, uid, ts, reason, **extra))

    # joined twice: closed, a login 5 s later on another device, closed, a login 3 s later, logout
    add("online", "g1", T, device="phone")
    add("offline", "g1", T + 10, "closed", device="phone")
    add("online", "g1", T + 15, device="laptop")
    add("offline", "g1", T + 25, "closed", device="laptop")
    add("online", "g1", T + 28)
    add("offline", "g1", T + 40, "logout")
    # the daemon applied its own grace to this offline: never joined again
    add("online", "g2", T + 100, device="phone")
    add("offline", "g2", T + 110, "closed", device="phone", grace=30.0)
    add("online", "g2", T + 145, device="phone")
    add("offline", "g2", T + 150, "closed", device="phone")
    # a logout is not a break the grace covers
    add("online", "g3", T + 200)
    add("offline", "g3", T + 205, "logout")
    add("online", "g3", T + 206)
    add("offline", "g3", T + 210, "closed")
    # a gap of exactly the grace: not within it
    add("online", "g4", T + 300)
    add("offline", "g4", T + 310, "closed")
    add("online", "g4", T + 310 + GRACE)
    add("offline", "g4", T + 345, "closed")
    # superseded: not a closed offline
    add("online", "sup", T + 400, device="tv")
    add("online", "sup", T + 410, device="car")
    add("offline", "sup", T + 420, "closed", device="car")
    # a flapper without the grace (six 10 s sessions 15 s apart), one 85 s session with it
    for i in range(6):
        add("online", "flap", T + 1000 + 25 * i, device="phone" if i % 2 else "web")
        add("offline", "flap", T + 1010 + 25 * i, "closed", device="phone" if i % 2 else "web")
    # a flapper either way: its offlines are idle, which the grace does not cover
    for i in range(6):
        add("online", "idler", T + 1000 + 25 * i)
        add("offline", "idler", T + 1010 + 25 * i, "idle", deadline=T + 1009.5 + 25 * i)
    # a grace offline written after another user's later online (its seq assigned when the grace passed)
    add("online", "gx", T + 2000, device="phone")
    add("online", "other", T + 2040, device="laptop")
    add("offline", "gx", T + 2005, "closed", device="phone", grace=30.0)
    add("offline", "other", T + 2050, "logout", device="laptop")
    # joined into a session still open at the end of the data: no closed user session
    add("online", "g5", T + 3000)
    add("offline", "g5", T + 3005, "closed")
    add("online", "g5", T + 3007, device="watch")
    # odd fields: a device that is not a str, a grace that is not a number
    add("online", "odd", T + 3100, device=7)
    add("offline", "odd", T + 3110, "closed", device=["x"], grace="soon")
    return evs


def write_events(directory: Path, evs: list[dict[str, Any]], segment_bytes: int = 700) -> None:
    log = EventLog(directory, segment_bytes=segment_bytes)
    log.recover()
    log.append(evs)
    log.sync()
    log.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("devices")
    crafted = root / "crafted"
    write_events(crafted, crafted_events())
    # a daemon with its own grace (its closed offlines carry "grace": the job's --grace leaves them), and one
    # without (the job's --grace joins its quick re-logins: flappers' bursts are 3-30 s apart)
    graced = GenConfig(out=str(root / "graced"), users=200, hours=3, seed=11, segment_bytes=100_000, flappers=0.05,
                       devices=3, grace=20.0)
    plain = GenConfig(out=str(root / "plain"), users=200, hours=3, seed=12, segment_bytes=100_000, flappers=0.1,
                      devices=2)
    generate(graced)
    generate(plain)
    return {"root": root, "dirs": [graced.out, plain.out, str(crafted)], "crafted": str(crafted)}


# ---------------------------------------------------------------------------------------------- decode


def test_device_and_grace_fields_are_decoded_and_odd_ones_ignored() -> None:
    assert to_row(event(1, "online", 7, 100.0, device="phone"), 0) == (0, 1, True, "i:7", 100.0, "login", None, None, "phone", None)
    assert to_row(event(2, "offline", 7, 110.0, "closed", device="phone", grace=30), 0)[8:] == ("phone", 30.0)
    assert to_row(event(3, "offline", 7, 110.0, "idle", deadline=109.0, grace=5.0), 0)[6:] == (109.0, "ring-lazy", None, 5.0)
    assert to_row(event(4, "online", 7, 100.0, device=3, grace=5.0), 0)[8:] == (None, None)  # grace only on offlines
    assert to_row(event(5, "offline", 7, 100.0, device=None, grace=float("nan")), 0)[8:] == (None, None)
    # iter_rows' fast path and to_row agree on every record of the crafted daemon
    from idled.log.eventlog import encode_record

    evs = crafted_events()
    stats = FileStats()
    rows = list(iter_rows(b"".join(encode_record(e) for e in evs), 0, stats))
    assert rows == [to_row(e, 0) for e in evs] and stats.malformed == 0


# ---------------------------------------------------------------------------------------------- reference


def sessions_of(result: Any, uid: str) -> list[dict[str, Any]]:
    return sorted((s for s in result.tables["sessions"] if s["uid"] == uid), key=lambda s: s["online_seq"])


def lengths(result: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for row in result.tables["session_lengths"]:
        out[row["bucket"]] = out.get(row["bucket"], 0) + row["sessions"]
    return out


def test_sessions_carry_the_devices_of_the_records_that_start_and_end_them() -> None:
    rows = [r for r in (to_row(e, 0) for e in crafted_events()) if r is not None]
    result = compute(rows, ["d"], FLAP)
    g1 = sessions_of(result, "g1")
    assert [(s["device"], s["end_device"]) for s in g1] == [("phone", "phone"), ("laptop", "laptop"), (None, None)]
    sup = sessions_of(result, "sup")
    assert [(s["device"], s["end_device"], s["end_reason"]) for s in sup] == [("tv", "car", "superseded"), ("car", "car", "closed")]
    g5 = sessions_of(result, "g5")
    assert g5[-1]["open"] and (g5[-1]["device"], g5[-1]["end_device"]) == ("watch", None)
    assert [(s["device"], s["end_device"]) for s in sessions_of(result, "odd")] == [(None, None)]
    gx = sessions_of(result, "gx")
    assert [(s["online_ts"], s["offline_ts"], s["end_reason"]) for s in gx] == [(T + 2000, T + 2005, "closed")]


def test_the_grace_joins_sessions_for_flappers_and_session_lengths_only() -> None:
    rows = [r for r in (to_row(e, 0) for e in crafted_events()) if r is not None]
    plain = compute(rows, ["d"], FLAP)
    graced = compute(rows, ["d"], FLAP, grace=GRACE)
    # the logged sessions, concurrency, dau and lateness do not change
    for table in ("sessions", "concurrency", "dau", "lateness"):
        assert_tables_equal(graced.tables[table], plain.tables[table], table)
    assert graced.counts == plain.counts
    # flap: six short sessions -> one of 135 s; idler: idle offlines are not joined
    assert {f["uid"] for f in plain.tables["flappers"]} == {"flap", "idler"}
    assert {f["uid"] for f in graced.tables["flappers"]} == {"idler"}
    # closed sessions: 3 (g1) + 2 (g2) + 2 (g3) + 2 (g4) + 2 (sup) + 6 (flap) + 6 (idler) + 1 (gx) + 1 (other)
    # + 1 (g5, the first) + 1 (odd) = 27; with the grace g1 is one, flap one, and g5's joins its open one: 27 - 2 - 5 - 1
    assert sum(lengths(plain).values()) == 27 and sum(lengths(graced).values()) == 19
    assert lengths(graced)[2] == 1  # g1: one 40 s session (bucket 30-60 s)


def test_grace_joins_only_within_a_daemon() -> None:
    """The same uid logging in on another daemon within the grace: the first daemon would have logged its
    offline anyway, so the sessions stay apart."""
    evs = [event(1, "online", "u", T), event(2, "offline", "u", T + 10, "closed")]
    other = [event(1, "online", "u", T + 12), event(2, "offline", "u", T + 20, "closed")]
    rows = [r for r in (to_row(e, 0) for e in evs) if r] + [r for r in (to_row(e, 1) for e in other) if r]
    assert sum(lengths(compute(rows, ["a", "b"], FLAP, grace=GRACE)).values()) == 2


# ---------------------------------------------------------------------------------------------- generator


def test_generated_devices_leave_the_sessions_as_they_were(tmp_path: Path) -> None:
    base = dict(users=60, hours=1.0, seed=4, crashes=1, maintenance=1)
    generate(GenConfig(out=str(tmp_path / "plain"), **base))  # type: ignore[arg-type]
    generate(GenConfig(out=str(tmp_path / "devices"), devices=3, **base))  # type: ignore[arg-type]
    plain, _ = load_dirs([str(tmp_path / "plain")])
    with_devices, _ = load_dirs([str(tmp_path / "devices")])
    assert sorted(r[:8] for r in plain) == sorted(r[:8] for r in with_devices)
    devices = {r[8] for r in with_devices}
    assert {"phone", "laptop", "tablet"} <= devices and devices <= {"phone", "laptop", "tablet", None}
    assert all(r[8] is not None for r in with_devices if r[2])  # every login is on a device


def test_generated_grace_offlines_follow_later_events_and_pair_cleanly(data: dict[str, Any]) -> None:
    records = [rec for _, path in list_segments(data["dirs"][0]) for rec in decode_buffer(Path(path).read_bytes()).records]
    graced = [rec for rec in records if "grace" in rec]
    assert graced and all(rec["reason"] == "closed" and rec["grace"] == 20.0 and rec["kind"] == "offline" for rec in graced)
    assert not [rec for rec in records if rec.get("reason") == "closed" and "grace" not in rec]
    # grace offlines with a ts before the record written just before them (another user's later event)
    assert any("grace" in rec and rec["ts"] < before["ts"] for before, rec in zip(records, records[1:]))
    result, _ = run_reference(data["dirs"][:2])
    assert result.counts["superseded"] == 0 and result.counts["orphans"] == 0  # user-level events pair cleanly
    assert {s["device"] for s in result.tables["sessions"]} >= {"phone", "laptop", "tablet"}


def test_passes_join_user_sessions_across_every_file_edge(data: dict[str, Any]) -> None:
    """The paired path's passes without Spark, every segment file a run of its own (the most carries): the
    crafted cases and the generated daemons, devices and daemon-graced offlines at file edges."""
    from tests.pipeline.test_paired import assert_passes_equal_reference

    runs = []
    for daemon, directory in enumerate(data["dirs"]):
        for _, path in list_segments(directory):
            runs.append((daemon, [list(iter_rows(Path(path).read_bytes(), daemon, FileStats()))]))
    assert len(runs) > 20
    for grace in (0.0, GRACE, 600.0):
        assert_passes_equal_reference(runs, data["dirs"], FLAP, grace)


# ---------------------------------------------------------------------------------------------- Spark


# (path, --grace): the record path is taken when a daemon's files overlap in seq (a copied segment)
JOBS = {"paired": ("paired", 0.0), "paired-grace": ("paired", GRACE), "records-grace": ("records", GRACE)}


@pytest.fixture(scope="module", params=list(JOBS))
def job(request: pytest.FixtureRequest, spark: Any, data: dict[str, Any]) -> dict[str, Any]:
    from idled.pipeline.job import JobConfig, run_job

    path, grace = JOBS[request.param]
    dirs = list(data["dirs"])
    if path == "records":
        copied = data["root"] / "crafted-copied"
        if not copied.exists():
            shutil.copytree(data["crafted"], copied)
            first = list_segments(copied)[0][1]
            shutil.copyfile(first, copied / "copy-of-first.seg")
        dirs[2] = str(copied)
    out = data["root"] / f"out-{request.param}"
    summary = run_job(JobConfig(events=tuple(dirs), out=str(out), min_partitions=4, chart=False, flap=FLAP,
                                grace=grace), spark=spark).summary
    reference, _ = run_reference(dirs, FLAP, grace)
    return {"out": out, "summary": summary, "reference": reference, "grace": grace, "path": path}


@pytest.mark.parametrize("table", list(KEYS))
def test_spark_tables_with_devices_and_grace_equal_the_reference(spark: Any, job: dict[str, Any], table: str) -> None:
    rows = [row.asDict() for row in spark.read.parquet(str(job["out"] / table)).collect()]
    assert rows, table
    assert_tables_equal(rows, job["reference"].tables[table], table)


def test_the_grace_is_in_the_summary_and_joins_what_it_should(job: dict[str, Any], data: dict[str, Any]) -> None:
    summary = job["summary"]
    if job["grace"]:  # it joined sessions of the daemon without a grace of its own, not of the one with
        plain, _ = run_reference(data["dirs"], FLAP)
        joined = {d: sum(r["sessions"] for r in compute_lengths(data, d, job["grace"])) for d in (0, 1)}
        assert joined[0] == sum(r["sessions"] for r in compute_lengths(data, 0, 0.0))
        assert joined[1] < sum(r["sessions"] for r in compute_lengths(data, 1, 0.0))
        assert len(job["reference"].tables["flappers"]) < len(plain.tables["flappers"])
    assert summary["grace_s"] == job["grace"]
    assert summary["pairing"] == job["path"]
    if job["path"] == "records":
        assert summary["counts"]["duplicates"] > 0
    assert summary["counts"]["sessions"] == job["reference"].counts["sessions"]
    devices = {s["device"] for s in job["reference"].tables["sessions"]}
    assert {"phone", "laptop", "web", "watch", None} <= devices


def compute_lengths(data: dict[str, Any], daemon: int, grace: float) -> list[dict[str, Any]]:
    return run_reference([data["dirs"][daemon]], FLAP, grace)[0].tables["session_lengths"]


def test_grace_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="idled pipeline")
    add_arguments(parser)
    assert parser.parse_args(["run", "--events", "d", "--out", "o"]).grace == 0.0
    assert parser.parse_args(["run", "--events", "d", "--out", "o", "--grace", "7.5"]).grace == 7.5
    events = tmp_path / "events"
    write_events(events, crafted_events()[:2])
    out = str(tmp_path / "o")
    assert main(["pipeline", "run", "--events", str(events), "--out", out, "--grace", "-1"]) == 2
    assert main(["pipeline", "run", "--events", str(events), "--out", out, "--grace", "5", "--incremental",
                 "--state", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "--grace needs 0 <= seconds <= 3600" in err and "--grace is not supported with --incremental" in err
    from idled.pipeline.job import JobConfig

    with pytest.raises(ValueError):
        JobConfig(events=(str(events),), out=out, grace=5.0, state=str(tmp_path / "s"))
    assert not os.path.exists(out)


def test_generate_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["pipeline", "generate", "--users", "30", "--hours", "0.5", "--out", str(tmp_path / "g")]
    assert main([*argv, "--devices", "2", "--grace", "15"]) == 0
    rows, _ = load_dirs([str(tmp_path / "g")])
    assert {r[8] for r in rows if r[2]} <= {"phone", "laptop"} and any(r[9] == 15.0 for r in rows)
    assert main([*argv, "--devices", "99"]) == 2
    assert "devices" in capsys.readouterr().err
