"""`idled loadtest --peer mqtt`, small: idled and a Mosquitto of its own under the same load, one after the other,
and both rows printed. Real processes: `idled serve`, Debian's mosquitto, the load test's workers.

300 connections, keepalive 2 s (both timeouts 3 s), 1 % silenced at recorded moments: each peer must close or
report offline every silent session -- never before its timeout, idled within its bound (2 ticks), the broker
within timeout + grace (7 s: Mosquitto 2.0 sweeps its clients every 5 s, in whole seconds) -- and no pinger.
Nothing here asserts a CPU, memory or lateness figure, which a shared CI machine cannot promise (docs/peer.md
has the measured ones).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from idled.tools.loadtest.mosquitto import find_mosquitto

pytestmark = pytest.mark.slow

CONNECTIONS = 300


def test_idled_and_mosquitto_side_by_side(tmp_path: Path) -> None:
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed (Debian: apt-get install mosquitto; see .ci/system-deps)")
    out = tmp_path / "peer.json"
    proc = subprocess.run(
        [sys.executable, "-m", "idled.cli.main", "loadtest", "--peer", "mqtt", "--quiet", "--json", str(out),
         "--connections", str(CONNECTIONS), "--ramp", "3000", "--keepalive", "2", "--peer-grace", "7",
         "--duration", "14"],
        capture_output=True, text=True, timeout=90, cwd=tmp_path)
    print(proc.stdout)
    print(proc.stderr[-3000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # both rows and the ratios, printed
    assert "peer comparison: 300 connections, keepalive 2 s" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("idled serve --workers 0", "mosquitto 2."))]
    assert len(rows) == 2, proc.stdout
    assert any(line.startswith("idled / mosquitto") for line in proc.stdout.splitlines())
    document = json.loads(out.read_text())
    assert [run["wire"] for run in document["runs"]] == ["idled", "mqtt"]
    for row, run in zip(document["rows"], document["runs"]):
        v = run["verdict"]
        assert (row["false"], row["missed"], row["early"]) == (0, 0, 0), (row["name"], v)
        assert run["aborted"] is None and run["ok"], row["name"]
        assert run["connections"]["logged_in"] == CONNECTIONS, run["errors"]
        assert v["planned"]["silent"] == 3 and v["unjudged_silent"] == 0 and v["generator_late"] == 0
        assert row["closes"] == 3  # every silent session timed
        assert run["steady"] is not None and run["steady"]["events_per_s"] > 0  # a steady window was measured
