"""Every limit shown is the one in force, and `idled check-config` says what `idled serve` says.

A real `idled serve --max-connections 10000000` (more than any open-file limit allows: the daemon caps it to
its descriptor budget and logs the arithmetic) and `idled check-config` with the same flags, both subprocesses:

* ``/status``'s ``config``, `idled status` and the summary line show the capped value, the configured one
  beside it, and why -- not ``10,000,000`` where the daemon refuses at 19,9xx;
* check-config prints the start-up line `idled serve` logs, word for word (one function), and its TOML names
  the data directory that line names, not ``# data_dir is unset`` beside a summary naming ``idled-data``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_operator import IDLED, LiveDaemon

pytestmark = pytest.mark.slow

HUGE = 10_000_000
CAPPED = re.compile(r"max_connections 10000000 is more than the descriptors allow \((.*)\): capped to (\d+)")


def _summary(stderr: str) -> str:
    """The start-up line `idled serve` logged (without the logging prefix)."""
    line = next(line for line in stderr.splitlines() if "idled.server: idled " in line)
    return line.split("idled.server: ", 1)[1]


def test_the_capped_limit_is_shown_everywhere_with_the_configured_one_and_why(tmp_path: Path) -> None:
    daemon = LiveDaemon(tmp_path, "--max-connections", str(HUGE))
    try:
        found = CAPPED.search(daemon.stderr())
        assert found is not None, daemon.stderr()
        why, limit = found.group(1), int(found.group(2))
        code, body = daemon.get("/status")
        assert code == 200
        config = json.loads(body)["config"]
        assert config["max_connections"] == limit, config
        assert config["max_connections_configured"] == HUGE and config["max_connections_why"] == why, config
        text = subprocess.run([*IDLED, "status", "--metrics", f"127.0.0.1:{daemon.metrics_port}"],
                              capture_output=True, text=True, timeout=30).stdout
        assert f"max connections  {limit:,} ({HUGE:,} configured; capped: {why})" in text.splitlines(), text
        summary = _summary(daemon.stderr())
        assert f"limits: {limit} connections ({HUGE} configured; capped: " in summary, summary
    finally:
        daemon.stop()


def test_check_config_prints_the_summary_serve_logs_and_the_data_dir_it_names(tmp_path: Path) -> None:
    flags = ["--port", "0", "--metrics-port", "0", "--max-connections", str(HUGE)]
    env = {key: value for key, value in os.environ.items() if key not in ("STATE_DIRECTORY", "IDLED_DATA_DIR")}
    check = subprocess.run([*IDLED, "check-config", *flags], capture_output=True, text=True, timeout=30,
                           cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stderr
    first, *toml = check.stdout.splitlines()
    serve = subprocess.Popen([*IDLED, "serve", *flags], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        assert serve.stderr is not None
        logged = ""
        while "idled.server: idled " not in logged:
            logged = serve.stderr.readline()
            assert logged, "serve exited before its start-up line"
    finally:
        serve.terminate()
        serve.communicate(timeout=20)
    assert first == f"# {_summary(logged)}"
    assert "data dir idled-data," in first and "connections (10000000 configured; capped: " in first, first
    data_dir = [line for line in toml if "data_dir" in line]
    assert data_dir == ['# data_dir is unset: serve would use "idled-data" ($STATE_DIRECTORY, else ./idled-data)'], data_dir
