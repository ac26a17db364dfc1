"""Every expected fatal start-up failure of `idled serve` ends with one line and its own exit status.

Real subprocesses: what an operator sees in the journal is exactly stderr, and the status is what systemd acts
on (RestartPreventExitStatus=2).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.ops.fatal import EXIT_LISTEN, EXIT_LOG, EXIT_USAGE
from tests.peers import free_port

pytestmark = pytest.mark.slow


def serve(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idled.cli.main", "serve", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def one_line(stderr: str) -> str:
    """The fatal line: the only line that is not an ordinary log line, and no traceback anywhere."""
    assert "Traceback" not in stderr, stderr
    fatal = [line for line in stderr.splitlines() if line.startswith("idled: fatal: ")]
    assert len(fatal) == 1, stderr
    return fatal[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_client_port_in_use(tmp_path: Path, busy_port: int) -> None:
    result = serve("--port", str(busy_port), "--metrics-port", "0", "--data-dir", str(tmp_path))
    assert result.returncode == EXIT_LISTEN
    line = one_line(result.stderr)
    assert f"cannot listen (client port 127.0.0.1:{busy_port})" in line and "in use" in line


def test_metrics_port_in_use(tmp_path: Path, busy_port: int) -> None:
    result = serve("--port", "0", "--metrics-port", str(busy_port), "--data-dir", str(tmp_path))
    assert result.returncode == EXIT_LISTEN
    line = one_line(result.stderr)
    assert f"cannot listen (metrics endpoint 127.0.0.1:{busy_port})" in line and "in use" in line


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    data = tmp_path / "not-a-dir"
    data.write_text("x")
    result = serve("--port", "0", "--metrics-port", "0", "--data-dir", str(data))
    assert result.returncode == EXIT_LOG
    line = one_line(result.stderr)
    assert "event log" in line and str(data) in line


def test_bad_configuration(tmp_path: Path) -> None:
    result = serve("--tick", "5", "--timeout", "1", "--data-dir", str(tmp_path))
    assert result.returncode == EXIT_USAGE
    assert "tick <= timeout" in one_line(result.stderr)


def test_missing_secret_file(tmp_path: Path) -> None:
    result = serve("--secret-file", str(tmp_path / "nope"), "--port", str(free_port()), "--data-dir", str(tmp_path))
    assert result.returncode == EXIT_USAGE
    line = one_line(result.stderr)
    assert "secret" in line and str(tmp_path / "nope") in line


def test_bad_config_file(tmp_path: Path) -> None:
    config = tmp_path / "idled.toml"
    config.write_text("no_such_setting = 1\n")
    result = serve("--config", str(config), "--data-dir", str(tmp_path))
    assert result.returncode == EXIT_USAGE
    assert "no_such_setting" in one_line(result.stderr)


def test_data_dir_locked_by_a_running_daemon_names_its_pid_and_ports(tmp_path: Path) -> None:
    """The refusal says whom to stop: the holder's pid (from the lock file), its command and its listeners."""
    data = tmp_path / "data"
    first = subprocess.Popen([sys.executable, "-m", "idled.cli.main", "serve", "--port", "0", "--metrics-port", "0",
                              "--data-dir", str(data)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stderr is not None
        port = None
        for line in first.stderr:  # the first daemon is up once it says where it listens
            if line.startswith("IDLED_LISTENING"):
                port = int(line.rsplit("port=", 1)[1])
                break
        assert port is not None, "the first daemon never listened"
        result = serve("--port", "0", "--metrics-port", "0", "--data-dir", str(data))
    finally:
        first.terminate()
        first.wait(30)
    assert result.returncode == EXIT_LOG
    line = one_line(result.stderr)
    assert f"locked by another writer, pid {first.pid} (" in line and "idled.cli.main serve --port 0" in line, line
    assert f"listening on 127.0.0.1:{port}" in line and "another data_dir" in line, line
