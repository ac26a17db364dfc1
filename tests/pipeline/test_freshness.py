"""`freshness`: the watermark a run records and `idled pipeline status` (plain Python, no Spark: the summaries
of real runs are checked in test_pipeline and test_incremental)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from idled.cli.main import main
from idled.pipeline.freshness import backlog_of, log_read_of, status, watermark_of


def test_the_watermark_is_the_slowest_daemons_data_end() -> None:
    assert watermark_of(["/a", "/b", "/c"], {0: 100.0, 1: 40.0}) == {"watermark": 40.0,
                                                                     "data_end": {"/a": 100.0, "/b": 40.0, "/c": None}}
    assert watermark_of(["/a"], {})["watermark"] is None


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "d0"
    log.mkdir()
    (log / "00001.seg").write_bytes(b"x" * 100)  # read whole
    (log / "00002.seg").write_bytes(b"x" * 70)  # read 50 bytes (a torn tail then), grown since
    (log / "00003.seg").write_bytes(b"x" * 30)  # new
    (log / ".00004.seg").write_bytes(b"x" * 30)  # hidden: not a segment
    return log


def test_backlog_counts_new_files_whole_and_grown_ones_from_where_the_run_stopped(tmp_path: Path) -> None:
    log = _log(tmp_path)
    assert backlog_of(str(log), {"00001.seg": 100, "00002.seg": 50, "00000.seg": 9}) == (50, 2)
    assert backlog_of(str(log), {"00001.seg": 100, "00002.seg": 90, "00003.seg": 30}) == (70, 1)  # rewritten shorter
    per_file = {str(log / "00001.seg"): (0, 100, 0), str(log / "00002.seg"): (0, 57, 7), str(log / "gone.seg"): (0, 5, 0)}
    assert log_read_of([str(log)], per_file) == {str(log): {"00001.seg": 100, "00002.seg": 50}}


def _summary(out: Path, log: Path, watermark: float) -> None:
    out.mkdir()
    summary = {"out": str(out), "inputs": [str(log)], "watermark": watermark, "data_end": {str(log): watermark},
               "log_read": {str(log): {"00001.seg": 100, "00002.seg": 50}}}
    (out / "summary.json").write_text(json.dumps(summary))


def test_status_reports_age_and_backlog_per_log(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _summary(tmp_path / "out", log, 1000.0)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    report = status(summary, None, now=1600.0)
    assert report["age_s"] == 600.0 and report["backlog_bytes"] == 50
    assert report["daemons"] == [{"log": str(log), "data_end": 1000.0, "backlog_bytes": 50, "backlog_files": 2, "missing": False}]
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "00002.seg").write_bytes(b"x" * 60)
    assert status(summary, [str(copy)], now=1600.0)["backlog_bytes"] == 10  # matched by position


def test_status_command_exit_status_alerts_on_age_and_backlog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(tmp_path)
    out = tmp_path / "out"
    _summary(out, log, time.time() - 3600)
    assert main(["pipeline", "status", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "watermark: " in printed and "(age 1h00m" in printed and "backlog 50 bytes in 2 file(s)" in printed
    assert main(["pipeline", "status", "--out", str(out), "--max-age", "7200"]) == 0
    assert main(["pipeline", "status", "--out", str(out), "--max-age", "600"]) == 1
    capsys.readouterr()
    assert main(["pipeline", "status", "--out", str(out), "--max-backlog", "49", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["backlog_bytes"] == 50
    assert main(["pipeline", "status", "--out", str(tmp_path / "none")]) == 2
    assert "summary.json" in capsys.readouterr().err
