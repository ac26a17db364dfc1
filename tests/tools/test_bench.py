"""`idled bench` end to end at small sizes, plus its schedule and its expiry checks.

No timing is asserted (shared, noisy machine): only that the command runs every detector through the same
load, that every detector expires exactly (never early, at most one tick late, none missed), and that the
JSON rows have exactly the documented keys.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from idled.tools.bench import detectors as bench
from idled.tools.bench import schedule as bench_schedule
from idled.tools.bench import table as bench_table

from idled.cli import main as cli
from idled.core.detector import Entry
from idled.core.factory import DETECTOR_KINDS, make_detector

EXPECTED_KEYS = {
    "detector",
    "size",
    "pings_per_timeout",
    "touch_ns",
    "tick_mean_ms",
    "tick_max_ms",
    "call_max_ms",
    "cpu_ms_per_s",
    "bytes_per_key",
    "lateness_max_ticks",
    "early",
}


def run_bench(argv: list[str]) -> int:
    """`idled bench ARGV`, through the real command line entry point."""
    return cli.main(["bench", *argv])


def table_rows(out: str) -> dict[tuple[int, str], list[str]]:
    """(size, detector) -> the table row's fields, parsed from stdout."""
    rows: dict[tuple[int, str], list[str]] = {}
    size = 0
    for line in out.splitlines():
        if line.startswith("size "):
            size = int(line.split()[1].rstrip(":").replace(",", ""))
        fields = line.split()
        if fields and fields[0] in DETECTOR_KINDS and not line.startswith(" "):  # not the indented ratio lines
            rows[(size, fields[0])] = fields
    return rows


def test_bench_is_registered_in_the_cli() -> None:
    assert cli.COMMANDS["bench"][0] == "idled.cli.bench"


def test_bench_runs_every_detector_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    code = run_bench(
        ["--sizes", "500,2000", "--seconds", "40", "--json", str(out_json), "--plot", str(out_png), "--quiet"]
    )
    out = capsys.readouterr().out
    assert code == 0, out

    rows = json.loads(out_json.read_text())
    assert len(rows) == 2 * len(DETECTOR_KINDS)
    for row in rows:
        assert set(row) == EXPECTED_KEYS
        assert row["detector"] in DETECTOR_KINDS
        assert row["pings_per_timeout"] == 1
        assert row["early"] == 0
        assert 0 <= row["lateness_max_ticks"] <= 1
        assert row["lateness_max_ticks"] > 0  # silent keys did expire, so lateness was measured
        assert row["bytes_per_key"] > 0
        for key in ("touch_ns", "tick_mean_ms", "tick_max_ms", "call_max_ms", "cpu_ms_per_s"):
            assert row[key] >= 0 and math.isfinite(row[key])
        assert row["tick_max_ms"] >= row["tick_mean_ms"]
    assert {(row["size"], row["detector"]) for row in rows} == {
        (size, kind) for size in (500, 2000) for kind in DETECTOR_KINDS
    }

    # The table: the two floors, one row per detector, and missed == 0 (last column) for each.
    assert out.count("\ndict floor ") == out.count("\nrecord floor ") == 2  # one of each per size
    parsed = table_rows(out)
    assert set(parsed) == {(size, kind) for size in (500, 2000) for kind in DETECTOR_KINDS}
    assert all(fields[-1] == "0" and fields[-2] == "0" for fields in parsed.values())  # missed, early
    assert "ring-lazy touch / dict floor" in out and "ring-lazy touch / record floor" in out
    assert "n/a   ring-lazy touch <= 1.5x record floor" in out and "targets at 2,000 keys" in out

    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chatty_clients_make_the_heap_prune(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Five pings per timeout leave ~5 stale heap entries per key: past 2 * live + 1000 the heap rebuilds.
    out_json = tmp_path / "bench.json"
    code = run_bench(
        ["--sizes", "2000", "--seconds", "40", "--pings-per-timeout", "5", "--no-memory", "--json", str(out_json)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    rows = json.loads(out_json.read_text())
    assert {row["pings_per_timeout"] for row in rows} == {5}
    assert all(row["early"] == 0 and row["lateness_max_ticks"] <= 1 for row in rows)
    prunes = int(out.split("heap prunes in the measured window:")[1].split()[0])
    assert prunes > 0


def test_unchunked_and_wake_on_due_are_exact_too(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_bench(
        ["--sizes", "1500", "--seconds", "35", "--chunk", "0", "--wake", "due", "--no-memory", "--timeout", "20"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert all(fields[-2:] == ["0", "0"] for fields in table_rows(out).values())


@pytest.mark.parametrize(
    "argv",
    [
        ["--pings-per-timeout", "0.5"],  # live keys would expire
        ["--seconds", "20"],  # shorter than a timeout: silent keys could not expire inside the window
        ["--silent-fraction", "1.5"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(["--sizes", "100", *argv]) == 2
    assert "idled bench:" in capsys.readouterr().err


def test_bad_sizes_and_detectors_are_usage_errors() -> None:
    with pytest.raises(SystemExit):
        run_bench(["--sizes", "10,abc"])
    with pytest.raises(SystemExit):
        run_bench(["--detectors", "ring-eager,btree"])


def test_growth_times_every_login_and_loses_no_session(capsys: pytest.CaptureFixture[str]) -> None:
    # 3,000 attaches over 6 simulated seconds with a 3 s timeout: keepalives and ticks run during the ramp,
    # and every session must still be there at the end (all expire only when time runs out).
    argv = ["--growth", "--sizes", "3000", "--detectors", "ring-lazy,heap", "--timeout", "3", "--login-rate", "500"]
    assert run_bench(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[1:2] in (["ring-lazy"], ["heap"])]
    assert [row[:2] for row in rows] == [["3,000", "ring-lazy"], ["3,000", "heap"]]
    for row in rows:
        assert row[-1] == "3,000"  # expired at the end: none lost, none expired early during the ramp
        assert float(row[3]) >= float(row[4]) > 0  # login_max_ms >= login_p999_ms
        assert float(row[-2]) > 0  # bytes per session
    assert out.count("slowest logins") == 2


def test_growth_refuses_flags_it_does_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(["--growth", "--pings-per-timeout", "5"]) == 2
    err = capsys.readouterr().err
    assert "--growth takes only --sizes, --detectors" in err and "drop --pings-per-timeout" in err
    assert run_bench(["--sizes", "100", "--keepalive", "10"]) == 2


# -- the schedule ------------------------------------------------------------------------------------------


def make_schedule(size: int = 3000, k: float = 2) -> bench_schedule.Schedule:
    return bench_schedule.build_schedule(size, timeout=30, pings_per_timeout=k, seconds=50, silent_fraction=0.02, seed=7)


@pytest.mark.parametrize(("login_spread", "last_login_tick"), [(None, 30), (6.0, 6), (45.0, 45)])
def test_schedule_logs_everyone_in_once_spread_over_the_login_window(
    login_spread: float | None, last_login_tick: int
) -> None:
    schedule = bench_schedule.build_schedule(
        3000, timeout=30, pings_per_timeout=2, seconds=50, silent_fraction=0.02, seed=7, login_spread=login_spread
    )
    logged_in = [(s, key) for s, batch in enumerate(schedule.logins) for key in batch]
    assert sorted(key for _, key in logged_in) == sorted(f"u{i}" for i in range(3000))
    assert schedule.login_end == last_login_tick == max(s for s, _ in logged_in)
    # Staggered, not one burst: every tick of the window has logins; the warm-up covers them all.
    assert all(schedule.logins[s] for s in range(1, last_login_tick + 1))
    assert schedule.warmup == max(30, last_login_tick)
    assert schedule.end == schedule.warmup + 50


def test_schedule_live_keys_ping_before_their_deadline_and_silent_ones_expire_in_the_window() -> None:
    schedule = make_schedule()
    ticks: dict[str, list[int]] = {}
    for s, batch in enumerate(schedule.logins):
        for key in batch:
            ticks.setdefault(key, []).append(s)
    for s, batch in enumerate(schedule.touches):
        for key in batch:
            ticks[key].append(s)
    assert len(schedule.silent_last) == 60
    for key, seen in ticks.items():
        assert seen == sorted(seen)
        assert all(b - a <= schedule.timeout for a, b in zip(seen, seen[1:]))  # never idle a full timeout
        if key in schedule.silent_last:
            last = schedule.silent_last[key]
            assert seen[-1] == math.ceil(last)
            assert schedule.warmup - schedule.timeout < last  # silent only once the warm-up is over
            assert math.ceil(last) + schedule.timeout <= schedule.end  # due inside the measured window
        else:
            assert seen[-1] + schedule.timeout > schedule.end  # still live at the end


def test_schedule_is_deterministic_per_seed() -> None:
    assert make_schedule().touches == make_schedule().touches
    other = bench_schedule.build_schedule(3000, timeout=30, pings_per_timeout=2, seconds=50, silent_fraction=0.02, seed=8)
    assert other.touches != make_schedule().touches


def test_pings_per_timeout_scales_the_touch_rate() -> None:
    one, five = make_schedule(k=1), make_schedule(k=5)
    ratio = five.measured_touches() / one.measured_touches()
    assert 4.5 < ratio < 5.5


# -- the expiry checks ----------------------------------------------------------------------------------------


def test_check_expiries_counts_early_missed_and_lateness() -> None:
    schedule = make_schedule(size=200)
    silent = sorted(schedule.silent_last, key=schedule.silent_last.__getitem__)
    first, second, third = silent[:3]
    live = next(f"u{i}" for i in range(200) if f"u{i}" not in schedule.silent_last)
    due = {key: math.ceil(schedule.silent_last[key]) + schedule.timeout for key in silent}

    # Exactly on time: every silent key at its deadline tick.
    on_time = [(due[key], [key]) for key in silent]
    early, missed, lateness = bench.check_expiries(schedule, on_time)
    assert (early, missed) == (0, 0)
    assert 0 <= lateness < 1
    assert lateness == pytest.approx(
        max(due[key] - (schedule.silent_last[key] + schedule.timeout) for key in silent)
    )

    # A live key expired, a silent key one tick early, another expired twice, one never expired, one late.
    bad = [(50, [live]), (due[first] - 1, [first]), (due[second], [second]), (due[second] + 1, [second])]
    bad += [(due[key] + 2, [key]) for key in silent[3:]]
    early, missed, lateness = bench.check_expiries(schedule, bad)
    assert early == 3
    assert missed == 1  # `third` never expired
    assert third not in {key for _, keys in bad for key in keys}
    assert lateness > 2


# -- best of two ----------------------------------------------------------------------------------------------


def run_result(touch_ns: float, tick_max_ms: float) -> bench.RunResult:
    return bench.RunResult(touch_ns=touch_ns, tick_mean_ms=1.0, tick_max_ms=tick_max_ms, call_max_ms=0.0,
                           cpu_ms_per_s=10.0, bytes_per_key=0.0, lateness_max_ticks=0.0, early=0, missed=0, prunes=0)


def test_best_of_keeps_a_stall_both_runs_make_and_drops_one_that_hit_a_single_run() -> None:
    quiet = [100_000] * 200
    first, second = list(quiet), list(quiet)
    first[50] = 5_000_000  # a neighbour's burst: one run, one call
    first[120] = second[120] = 1_500_000  # the detector's own stall: the same call in both runs
    best = bench.best_of([(run_result(700.0, 9.0), first), (run_result(650.0, 8.0), second)])
    assert best.call_max_ms == pytest.approx(1.5)
    assert best.touch_ns == 650.0 and best.tick_max_ms == 8.0
    # Runs that did not make the same calls (not expected): the run whose worst call was the least bad.
    best = bench.best_of([(run_result(700.0, 9.0), first), (run_result(650.0, 8.0), second[:-1])])
    assert best.call_max_ms == pytest.approx(1.5)


# -- the floors and the touch target ----------------------------------------------------------------------------


def test_the_record_floor_holds_the_wheels_record_and_stores_the_tick_in_it() -> None:
    records = bench.RecordFloor()
    records.add("u1", 3)
    records.touch("u1", 7)
    entry = records.entries["u1"]
    wheel = make_detector("ring-lazy", timeout=30, slots=30)
    wheel.add("u1", 3)
    assert type(entry) is type(wheel.entries["u1"]) is Entry  # the same record, so the same size
    assert (entry.key, entry.tick) == ("u1", 7)
    schedule = make_schedule(size=300)
    for kind in bench.FLOORS:
        floor = bench.run_floor(schedule, kind=kind)
        assert floor.touch_ns > 0 and floor.cpu_ms_per_s > 0
    with pytest.raises(ValueError):
        bench.run_floor(schedule, kind="list floor")


def test_the_lazy_touch_is_judged_against_the_record_floor_not_the_dict_floor() -> None:
    def report(lazy_ns: float, record_ns: float) -> bench.SizeReport:
        results = {"ring-lazy": run_result(lazy_ns, 1.0)}
        return bench.SizeReport(bench_table.TARGET_SIZE, 1.0, 1000, 10, run_result(400.0, 0.0), results,
                                run_result(record_ns, 0.0))

    label = "ring-lazy touch <= 1.5x record floor"
    # 1.75x the dict floor, 1.17x the record floor: passes.
    passing = {c.label: c for c in bench_table.target_checks([report(700.0, 600.0)])}
    assert passing[label].passed is True and passing[label].detail == "700.0 / 600.0 ns = 1.17x"
    failing = {c.label: c for c in bench_table.target_checks([report(1000.0, 600.0)])}
    assert failing[label].passed is False
    lines = bench_table.ratio_lines(report(700.0, 600.0))
    assert "ring-lazy touch / dict floor: 1.75x" in lines and "ring-lazy touch / record floor: 1.17x" in lines
