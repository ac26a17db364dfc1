"""`idled bench --last-seen`: the table it prints, and the flags it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from idled.cli import main as cli


def test_prints_a_row_per_uid_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--last-seen", "--sizes", "2000", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [row[:2] for row in rows] == [["2,000", "str"], ["2,000", "int"]]
    for row in rows:
        snapshot_bytes_per_user = float(row[7])
        assert 8 < snapshot_bytes_per_user < 40  # a double and a msgpack uid each
    assert list(tmp_path.iterdir()) == []  # its temporary snapshots are gone


def test_takes_only_sizes_and_dir(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--last-seen", "--seconds", "3"]) == 2
    assert "drop --seconds" in capsys.readouterr().err
