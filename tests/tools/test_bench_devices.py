"""`idled bench --devices`: plain uid keys against (uid, device) keys, one run."""

from __future__ import annotations

import pytest

from idled.cli import main as cli
from idled.tools.bench import devices


def run_bench(argv: list[str]) -> int:
    return cli.main(["bench", *argv])


def test_devices_mode_prints_both_kinds_and_the_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(["--devices", "--sizes", "2000", "--rounds", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("idled bench --devices:")
    rows = {line.split()[1]: line.split() for line in out[2:4]}
    assert set(rows) == {"plain", "device"}
    assert all(float(value) > 0 for row in rows.values() for value in row[2:])
    assert "device/plain" in out[4] and "touch" in out[4] and "bytes/session" in out[4]


def test_device_sessions_cost_more_memory_than_plain_ones_and_are_all_online() -> None:
    plain, device = devices.bytes_per_session(3000, "plain"), devices.bytes_per_session(3000, "device")
    assert 0 < plain < device


def test_devices_refuses_flags_it_does_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(["--devices", "--seed", "3"]) == 2
    assert "--devices takes only" in capsys.readouterr().err
    assert run_bench(["--rounds", "3"]) == 2
    assert "--rounds is for --devices" in capsys.readouterr().err
