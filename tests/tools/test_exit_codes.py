"""Exit statuses and one-line errors of `idled bench` and `idled loadtest`, through real subprocesses.

0 ok; 1 runtime failure (e.g. the target is not reachable); 2 usage or configuration error, found before
any long work; 3 the run completed but a target FAILED. Every error is one line on stderr, no traceback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idled.cli import bench as bench_cli
from idled.cli import main as cli
from idled.ops.fatal import EXIT_FAILURE, EXIT_OK, EXIT_TARGET_FAILED, EXIT_USAGE
from idled.tools.bench.detectors import RunResult, SizeReport
from idled.tools.bench.table import TARGET_SIZE, failed, format_table, target_checks


def idled(args: list[str], cwd: Path, env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idled.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------- loadtest


def test_loadtest_target_not_running_is_one_line_and_exit_1(tmp_path: Path) -> None:
    port = unused_port()
    proc = idled(["loadtest", "--target", f"127.0.0.1:{port}", "--keepalive", "1", "--duration", "10",
                  "--quiet"], tmp_path)
    assert proc.returncode == EXIT_FAILURE
    assert one_line(proc.stderr) == f"idled loadtest: cannot connect to 127.0.0.1:{port}: Connection refused"
    proc = idled(["loadtest", "--event-rate", "100", "--target", f"127.0.0.1:{port}"], tmp_path)
    assert proc.returncode == EXIT_FAILURE
    assert one_line(proc.stderr) == f"idled loadtest: cannot connect to 127.0.0.1:{port}: Connection refused"


def test_loadtest_too_short_says_which_flags_to_change(tmp_path: Path) -> None:
    proc = idled(["loadtest", "--spawn", "--connections", "2000", "--duration", "40"], tmp_path)
    assert proc.returncode == EXIT_USAGE
    line = one_line(proc.stderr)
    assert "--duration must exceed 50.5 s" in line
    assert "--keepalive 20" in line and "--silent-fraction 0" in line
    # the suggested keepalive does fit
    args = cli.build_parser("loadtest").parse_args(["loadtest", "--spawn", "--connections", "2000", "--duration",
                                                     "40", "--keepalive", "20"])
    assert cli.importlib.import_module("idled.cli.loadtest").scenario_from_args(args).keepalive == 20


def test_loadtest_checks_outputs_before_the_run(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = idled(["loadtest", "--spawn", "--keepalive", "1", "--duration", "30", "--json",
                  str(tmp_path / "missing" / "r.json")], tmp_path)
    assert proc.returncode == EXIT_USAGE
    assert "--json" in one_line(proc.stderr) and "cannot write there" in proc.stderr
    # matplotlib that cannot be imported: refused up front, not after the run
    fake = tmp_path / "fake"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    proc = idled(["loadtest", "--spawn", "--keepalive", "1", "--duration", "30", "--plot", "p.png"], tmp_path,
                 env=env)
    assert proc.returncode == EXIT_USAGE
    assert "--plot needs matplotlib" in one_line(proc.stderr)
    assert time.monotonic() - start < 20  # neither ran the 30 s measurement
    assert not (tmp_path / "p.png").exists()


def test_loadtest_help_documents_the_exit_statuses(tmp_path: Path) -> None:
    for command in ("loadtest", "bench"):
        proc = idled([command, "--help"], tmp_path)
        assert proc.returncode == 0
        # The one exit-status table of every command (idled.cli.main.EXIT_STATUS_HELP).
        assert "exit status (the same table for every idled command):" in proc.stdout
        assert "3    ran, but a target FAILED (idled bench, idled loadtest)" in proc.stdout


def test_loadtest_with_a_failed_target_says_failed_and_exits_3(tmp_path: Path) -> None:
    # The server caps every timeout at 1 s while sessions ping every 0.9..1.1 s: pingers go offline. Their own
    # send times show the generator did not send within the timeout, so these are not false offlines but
    # "generator late" -- the server was right, the run's figures are not to be trusted. The run completes;
    # its verdict must be FAILED and the exit status 3.
    out = tmp_path / "r.json"
    proc = idled(["loadtest", "--spawn", "--connections", "60", "--keepalive", "1", "--tick", "0.25",
                  "--duration", "6", "--quiet", "--json", str(out), "--", "--max-timeout", "1", "--timeout", "1"],
                 tmp_path)
    result = json.loads(out.read_text())
    assert proc.returncode == EXIT_TARGET_FAILED, proc.stderr
    assert result["aborted"] is None
    # (a session whose offline came later than its tick allows, after a newer keepalive had arrived, is still
    # the server's fault: on a loaded host a few may be, so false offlines are not asserted either way)
    assert result["ok"] is False and result["verdict"]["generator_late"] > 0
    assert "generator_late == 0" in result["targets_failed"]
    assert "generator_late == 0: FAIL" in proc.stdout
    assert "generator was the bottleneck: figures not trustworthy" in proc.stdout
    assert "verdict       FAILED" in proc.stdout and "verdict       OK" not in proc.stdout


# ---------------------------------------------------------------------------------------------- bench


def test_bench_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, words in (
        (["--sizes", "100", "--seconds", "20"], "timeout + 2"),
        (["--writer", "--sizes", "100"], "drop --sizes"),
        (["--sizes", "100", "--json", str(tmp_path / "no" / "x.json")], "cannot write there"),
    ):
        proc = idled(["bench", *args], tmp_path)
        assert proc.returncode == EXIT_USAGE, args
        assert words in one_line(proc.stderr)


def test_bench_writer_runs_as_a_subcommand(tmp_path: Path) -> None:
    proc = idled(["bench", "--writer", "--seconds", "0.1", "--dir", str(tmp_path)], tmp_path)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "run_writer: 0.1 s per run" in proc.stdout
    assert "burst always" in proc.stdout and "events/s durable" in proc.stdout


def _result(early: int = 0, tick_max_ms: float = 1.0, call_max_ms: float = 0.1) -> RunResult:
    return RunResult(touch_ns=100.0, tick_mean_ms=0.1, tick_max_ms=tick_max_ms, call_max_ms=call_max_ms,
                     cpu_ms_per_s=1.0, bytes_per_key=100.0, lateness_max_ticks=0.5, early=early, missed=0,
                     prunes=0)


def _report(size: int, **eager: float) -> SizeReport:
    results = {"ring-eager": _result(**eager), "heap": _result(tick_max_ms=10.0)}  # type: ignore[arg-type]
    return SizeReport(size, 1.0, 1000, 10, _result(), results, _result())


def test_bench_targets_judged_at_the_target_size_and_exactness_always() -> None:
    # heap/eager = 10x misses the 50x target: not judged below the target size, FAIL at it
    small = target_checks([_report(2000)])
    assert not failed(small)
    assert any(c.passed is None and "heap/50" in c.label for c in small)
    big = target_checks([_report(2000), _report(TARGET_SIZE)])
    assert [c.label for c in failed(big)] == ["ring-eager tick_max <= heap/50"]
    table = format_table([_report(TARGET_SIZE)], "header")
    assert "FAIL  ring-eager tick_max <= heap/50" in table and "verdict: FAILED (1 of" in table
    # an early expiry at any size fails exactness, whatever the size
    inexact = target_checks([_report(500, early=1), _report(2000)])
    assert [c.label for c in failed(inexact)] == ["ring-eager exact"]


def test_bench_exit_status_follows_the_printed_verdict(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # the command's mapping from the verdict it prints to its exit status (the reports themselves are
    # stand-ins: a real FAIL needs a million keys or a broken detector)
    monkeypatch.setattr(bench_cli, "bench_size", lambda size, **_: _report(size, early=1))
    assert cli.main(["bench", "--sizes", "500", "--quiet"]) == EXIT_TARGET_FAILED
    captured = capsys.readouterr()
    assert "FAIL  ring-eager exact" in captured.out and "verdict: FAILED" in captured.out
    assert "idled bench: FAILED: ring-eager exact" in captured.err
    monkeypatch.setattr(bench_cli, "bench_size", lambda size, **_: _report(size))
    assert cli.main(["bench", "--sizes", "500", "--quiet"]) == EXIT_OK
    assert "verdict: OK" in capsys.readouterr().out
