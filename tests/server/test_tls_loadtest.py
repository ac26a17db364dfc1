"""`idled loadtest --tls --proxy-protocol` against a spawned TLS + PROXY server, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tlscerts import need_openssl

pytestmark = pytest.mark.slow


def test_loadtest_over_tls_and_proxy(tmp_path: Path) -> None:
    need_openssl()  # the throw-away certificate of --spawn --tls
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "idled.cli.main", "loadtest", "--quiet", "--json", str(out), "--spawn", "--tls",
         "--proxy-protocol", "--connections", "200", "--keepalive", "2", "--duration", "10", "--tick", "0.25",
         "--server-log", str(tmp_path / "server.log"), "--", "--log-level", "debug"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )
    assert out.exists(), proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert result["scenario"]["tls"] and result["scenario"]["proxy_protocol"]
    assert result["connections"]["failed"] == 0 and result["connections"]["logged_in"] == 200
    assert "server RSS per TLS connection <= 32 KiB" in result["targets"]
    argv = result["server"]["argv"]
    assert "--tls-cert" in argv and "--proxy-protocol" in argv
    log = (tmp_path / "server.log").read_text()
    # The PROXY header named the sessions' own source addresses (127.0.0.2, ...), as the server logged them.
    assert "login user" in log and " from 127.0.0.2:" in log
