"""`idled check-config` judges the data directory the way `idled serve` will use it: by trying. As root,
``os.access`` says yes to everything, so a check built on it passed ``--data-dir /proc/forbidden`` while
`serve` then exited 5. In-process ``main(argv)``; the `serve` half is a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from idled.cli import main as cli

FORBIDDEN = "/proc/forbidden"  # /proc takes no new entries, for root or anyone


def test_a_directory_serve_cannot_create_fails_the_check_as_serve_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["check-config", "--data-dir", FORBIDDEN]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"data_dir {FORBIDDEN} cannot be created: No such file or directory" in err, err
    serve = subprocess.run(
        [sys.executable, "-m", "idled.cli.main", "serve", "--data-dir", FORBIDDEN, "--port", "0", "--metrics-port", "0"],
        capture_output=True, text=True, check=False, timeout=60, cwd=tmp_path,
    )
    assert serve.returncode == 5, serve.stderr  # what the check now predicts


def test_an_existing_directory_that_takes_no_files_fails_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config", "--data-dir", "/proc"]) == 2
    assert "data_dir /proc is not writable: " in capsys.readouterr().err


def test_a_missing_directory_that_can_be_made_passes_and_is_not_left_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "new" / "deeper" / "data"
    assert cli.main(["check-config", "--data-dir", str(target)]) == 0
    assert "configuration OK" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # the probe's directories and file are gone again


def test_an_existing_directory_keeps_its_files_and_gets_no_probe_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lock").write_text("")
    assert cli.main(["check-config", "--data-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock"]
    assert "configuration OK" in capsys.readouterr().err
