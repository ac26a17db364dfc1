"""Tests for `idled events`: run(args) in-process for one-shot output, a real subprocess for --follow."""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from idled.cli import events as events_cmd
from idled.log.eventlog import EventLog, encode_record, list_segments


def ev(seq: int, **extra: Any) -> dict[str, Any]:
    ts = 1_700_000_000.5 + seq
    event = {
        "seq": seq, "kind": "online" if seq % 2 else "offline", "uid": seq % 3 if seq % 4 == 0 else f"u{seq}",
        "ts": ts, "reason": "login" if seq % 2 else "idle", "last_seen": ts - 1.0, "deadline": ts + 44.0,
        "timeout": 45.0, "detector": "wheel",
    }
    event.update(extra)
    return event


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    events_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


def write(directory: Path, first: int, last: int, **kwargs: Any) -> None:
    with EventLog(directory, **kwargs) as log:
        log.recover()
        log.append([ev(seq) for seq in range(first, last + 1)])


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_prints_every_record_as_one_json_line_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, 1, 25, segment_bytes=800)
    assert len(list_segments(tmp_path)) > 3
    assert events_cmd.run(parse("--data-dir", str(tmp_path))) == 0
    out = capsys.readouterr().out
    assert lines(out) == [ev(seq) for seq in range(1, 26)]
    first = out.splitlines()[0]
    assert list(json.loads(first)) == list(ev(1))  # keys in record order


def test_from_starts_mid_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, 1, 25, segment_bytes=800)
    assert events_cmd.run(parse("--data-dir", str(tmp_path), "--from", "17")) == 0
    assert [r["seq"] for r in lines(capsys.readouterr().out)] == list(range(17, 26))
    assert events_cmd.run(parse("--data-dir", str(tmp_path), "--from", "99")) == 0
    assert capsys.readouterr().out == ""


def test_corrupt_records_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, 1, 3)
    path = Path(list_segments(tmp_path)[0][1])
    data = bytearray(path.read_bytes())
    data[len(encode_record(ev(1))) + 12] ^= 0x20  # inside record 2's body
    path.write_bytes(bytes(data))
    assert events_cmd.run(parse("--data-dir", str(tmp_path))) == 0
    assert [r["seq"] for r in lines(capsys.readouterr().out)] == [1, 3]


def test_empty_log_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert events_cmd.run(parse("--data-dir", str(tmp_path))) == 0
    assert capsys.readouterr().out == ""


def test_missing_directory_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert events_cmd.run(parse("--data-dir", str(tmp_path / "nope"))) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "no such directory" in captured.err


def test_bytes_values_stay_printable() -> None:
    assert json.loads(events_cmd.format_record({"seq": 1, "blob": b"\x00\xff"})) == {"seq": 1, "blob": "00ff"}


def test_follow_prints_new_records_and_segments_until_ctrl_c(tmp_path: Path) -> None:
    write(tmp_path, 1, 3, segment_bytes=600)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        [sys.executable, "-m", "idled.cli.events", "--data-dir", str(tmp_path), "--follow", "--poll-interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # an inherited SIG_IGN would hide Ctrl-C
    ) as child:
        got: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert child.stdout is not None
            for line in child.stdout:
                got.put(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()

        def take(n: int) -> list[int]:
            return [json.loads(got.get(timeout=20))["seq"] for _ in range(n)]

        try:
            assert take(3) == [1, 2, 3]
            with EventLog(tmp_path, segment_bytes=600) as log:  # a live writer: appends, then rotations
                log.recover()
                log.append([ev(4)])
                assert take(1) == [4]
                for seq in range(5, 21):
                    log.append([ev(seq)])
                assert take(16) == list(range(5, 21))
            assert len(list_segments(tmp_path)) > 3
            child.send_signal(signal.SIGINT)
            assert child.wait(timeout=20) == 0
            reader.join(timeout=20)
            assert child.stderr is not None and "Traceback" not in child.stderr.read()
            assert got.empty()
        finally:
            child.kill()
            child.wait()
