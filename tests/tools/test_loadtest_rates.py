"""`idled loadtest` throughput per server CPU-second: --ping-every, the two phases, --sweep-workers, and the
full GC walks read from the daemon's log. Figures of the real run are printed, never asserted."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from idled.cli import loadtest
from idled.tools.loadtest.rates import phase, reported_rate, sweep_rows, sweep_table
from idled.tools.loadtest.target import Sample, ServerProcess


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    return parser.parse_args(argv)


def test_ping_every_is_for_user_connections_and_at_most_the_keepalive() -> None:
    sc = loadtest.scenario_from_args(_parse(["--spawn", "--connections", "100", "--ping-every", "1",
                                             "--silent-fraction", "0", "--bye-fraction", "0", "--duration", "10"]))
    assert sc.ping_every == 1.0 and sc.settle == 2.0
    for argv in (["--gateways", "2", "--sessions", "10"], ["--keepalive", "2", "--ping-every", "3"],
                 ["--ping-every", "0"]):
        if "--ping-every" not in argv:
            argv += ["--ping-every", "1"]
        with pytest.raises(loadtest.UsageError, match="--ping-every"):
            loadtest.scenario_from_args(_parse(["--spawn", "--duration", "200", *argv]))


def test_sweep_workers_makes_one_spawned_run_per_value() -> None:
    args = _parse(["--sweep-workers", "0,2,4", "--connections", "100", "--duration", "200", "--",
                   "--workers", "8", "--tick", "0.5"])
    scenarios = loadtest._scenarios(args, loadtest.scenario_from_args(args))
    assert [sc.server_args for sc in scenarios] == [("--tick", "0.5", "--workers", str(w)) for w in (0, 2, 4)]
    assert all(sc.spawn for sc in scenarios)
    for bad, message in (("4", "at least two"), ("0,x", "numbers"), ("0,999", "at least two values in 0..")):
        args = _parse(["--sweep-workers", bad, "--duration", "200"])
        with pytest.raises(loadtest.UsageError, match=message):
            loadtest._scenarios(args, loadtest.scenario_from_args(args))
    args = _parse(["--sweep-workers", "0,1", "--compare", "ring,scan", "--duration", "200"])
    with pytest.raises(loadtest.UsageError, match="not both"):
        loadtest._scenarios(args, loadtest.scenario_from_args(args))


def test_a_phase_is_priced_in_server_cpu_seconds_core_and_edges_apart() -> None:
    start, end = Sample(100.0, 10.0, 0, 0.0, 4.0), Sample(110.0, 12.0, 0, 0.0, 4.5)  # 0.2 cores over 10 s
    ph = phase(start, end, per_s=1000.0)
    assert ph is not None
    assert ph["per_cpu_second"] == pytest.approx(5000.0)
    assert (ph["cpu_us_each"], ph["core_us_each"], ph["edge_us_each"]) == pytest.approx((200.0, 50.0, 150.0))
    counted = phase(start, end, events=500)
    assert counted is not None and counted["events_per_s"] == pytest.approx(50.0)
    assert phase(start, None, events=1) is None and phase(start, end) is None
    # each worker's count over its own report times, summed
    assert reported_rate([(0.0, 0), (0.5, 10)], [(10.0, 1000), (10.5, 2010)]) == pytest.approx(300.0)


def _run(workers: str | None, per_ping_us: float, core_us: float) -> dict[str, Any]:
    keepalive = {"per_cpu_second": 1e6 / per_ping_us, "cpu_us_each": per_ping_us, "core_us_each": core_us,
                 "edge_us_each": per_ping_us - core_us, "events_per_s": 10000.0, "cpu_percent": per_ping_us,
                 "core_cpu_seconds": 1.0, "edge_cpu_seconds": 2.0}
    login = {**keepalive, "per_cpu_second": 2000.0}
    return {"scenario": {"server_args": ["--workers", workers] if workers else []},
            "phases": {"login": login, "keepalive": keepalive}}


def test_the_sweep_prices_the_relay_against_the_first_run() -> None:
    broke_off = {"ok": False, "aborted": "the server did not report its port",
                 "scenario": {"server_args": ["--workers", "4"]}}
    rows = sweep_rows([_run(None, 100.0, 100.0), _run("2", 125.0, 15.0), broke_off])
    assert [row["workers"] for row in rows] == ["0", "2", "4"]
    assert rows[2]["keepalive"] is None and rows[2]["relay_us_per_keepalive"] is None
    assert rows[1]["keepalive_ratio"] == pytest.approx(0.8)
    assert rows[1]["relay_us_per_keepalive"] == pytest.approx(25.0)
    text = sweep_table(rows)
    print(text)
    assert "relay cost us per keepalive" in text and "0.80x" in text and "25.0" in text


def test_a_sweep_keeps_going_past_a_run_that_cannot_start() -> None:
    args = _parse(["--sweep-workers", "0,1", "--connections", "10", "--duration", "200", "--",
                   "--max-connections", "0"])
    scenario = loadtest._scenarios(args, loadtest.scenario_from_args(args))[0]
    result = loadtest._run_one(scenario, True, io.StringIO())  # the server refuses its flags
    assert result["ok"] is False and "did not report its port" in result["aborted"]
    with pytest.raises(RuntimeError, match="did not report its port"):
        loadtest._run_one(scenario, False, io.StringIO())  # a single run: the command's error


def test_full_gc_walks_are_read_from_every_process_of_the_daemon() -> None:
    server = ServerProcess("127.0.0.1", 1, None)
    for line in ("2026-11-23 15:07:01,476 INFO idled.ops.gcpolicy: gc full walk: 15.7 ms (9.5 ms CPU) over 29255 thawed",
                 "worker-1: 2026-11-23 15:07:01,489 INFO idled.ops.gcpolicy: gc full walk: 222.5 ms over 9 thawed",
                 "<6>idled.ops.gcpolicy: gc full walk: 3.0 ms over 1 thawed objects, 0 unreachable collected",
                 "worker-0: INFO idled.server.edge: edge listening on 127.0.0.1:7878"):
        server.take_line(line)
    assert [process for process, _, _ in server.gc_walks] == ["core", "worker-1", "core"]
    assert [seconds for _, seconds, _ in server.gc_walks] == pytest.approx([0.0157, 0.2225, 0.003])
    assert server.gc_walks[0][2] == pytest.approx(0.0095) and server.gc_walks[1][2] is None
    assert len(server.tail) == 4


def test_real_sweep_over_workers_with_fast_keepalives_and_gc_walks(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    proc = subprocess.run(
        [sys.executable, "-m", "idled.cli.main", "loadtest", "--quiet", "--json", str(out), "--sweep-workers", "0,1",
         "--connections", "200", "--ramp", "400", "--keepalive", "2", "--ping-every", "0.5", "--tick", "0.25",
         "--silent-fraction", "0", "--bye-fraction", "0", "--duration", "6", "--", "--gc-thaw-every", "1"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path)
    print(proc.stdout)
    print(proc.stderr[-3000:], file=sys.stderr)
    doc = json.loads(out.read_text())
    assert doc["sweep_workers"] == ["0", "1"] and "keepalives per server CPU-second" in proc.stdout
    for run, row in zip(doc["runs"], doc["rates"]):
        assert run["verdict"]["false_offlines"] == 0 and run["connections"]["logged_in"] == 200
        assert row["login"]["events"] > 0 and row["keepalive"]["per_cpu_second"] > 0
        assert 0.5 < run["ping_rate"]["ratio"] < 1.5  # the offered rate is 200 / 0.5 s
    one, edged = doc["runs"]
    assert one["phases"]["keepalive"]["edge_cpu_seconds"] == 0  # one process: all of it is the core's
    assert edged["phases"]["keepalive"]["edge_cpu_seconds"] > 0
    assert set(edged["gc_walks"]) == {"core", "worker-0"}  # every process walks, and says so
