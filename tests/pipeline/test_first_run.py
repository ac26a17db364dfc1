"""docs/pipeline.md's first run, run as written: its shell block (all but the pip line) under bash, with the
installed `idled` on PATH and TMPDIR pointed into the test's own directory (so ``mktemp -d`` lands there).
It must work on a fresh machine -- no /data, no earlier run -- and say what the page shows it saying.
Spark starts once for the run: ~15 s, slow."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "pipeline.md"



def first_run_block() -> list[str]:
    """The commands of the first ```sh block under "## A first run", the install line left out."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## A first run", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block, "no ```sh block under ## A first run"
    return [line for line in block.group(1).splitlines() if line.strip() and "pip install" not in line]


def test_the_first_run_writes_into_a_new_temporary_directory() -> None:
    commands = "\n".join(first_run_block())
    assert "mktemp -d" in commands and "/data" not in commands
    assert "idled pipeline generate" in commands and "idled pipeline run" in commands


@pytest.mark.slow
def test_the_first_run_works_as_written(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "idled").exists(), "the idled entry point is not installed beside this interpreter"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "TMPDIR": str(tmp_path),
           "PYSPARK_PYTHON": sys.executable}
    script = "set -euo pipefail\n" + "\n".join(first_run_block()) + '\necho "DIR=$dir"\n'
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    counted = re.search(r"idled pipeline: ([\d,]+) events from 1 daemon", out)
    assert counted, out
    assert 10_000 <= int(counted.group(1).replace(",", "")) <= 14_000, out  # "about 12,000 events"
    assert "0 corrupt, 0 malformed, 0 duplicate records" in out and "ring-lazy" in out, out
    made = Path(out.rsplit("DIR=", 1)[1].strip())
    assert made.parent == tmp_path
    report = made / "report"
    assert (report / "summary.json").is_file() and (report / "concurrency.png").is_file()
    assert {p.name for p in report.iterdir()} >= {"sessions", "concurrency", "lateness", "flappers", "dau", "session_lengths"}
