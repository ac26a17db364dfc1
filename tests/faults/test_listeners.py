"""One rule for every listener: auth off (no secret) is refused on any address that is not loopback, however
the socket was obtained -- `--host`, or a socket systemd bound and passed in (LISTEN_FDS). Real `idled serve`
subprocesses; the socket-activated ones through the same exec shim as tests/deploy (LISTEN_PID = its pid).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.ops.fatal import EXIT_USAGE
from idled.protocol import PING, PONG
from tests.deploy.test_service import ACTIVATE
from tests.faults.test_fatal import one_line
from tests.peers import Client, Daemon, serve_command

pytestmark = pytest.mark.slow


@pytest.fixture
def wildcard() -> Iterator[socket.socket]:
    """A listening socket on 0.0.0.0, as a systemd .socket unit with ListenStream=7878 makes (nothing connects
    to it but this test, over loopback)."""
    with socket.create_server(("0.0.0.0", 0)) as sock:
        yield sock


def activated(sock: socket.socket, data_dir: Path, *options: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that start `idled serve` with ``sock`` passed as systemd passes it."""
    command = [sys.executable, "-c", ACTIVATE, str(sock.fileno()), *serve_command(data_dir, *options)[1:]]
    return command, {key: value for key, value in os.environ.items() if not key.startswith("LISTEN_")}


def test_socket_activation_on_a_wildcard_without_a_secret_is_refused(tmp_path: Path, wildcard: socket.socket) -> None:
    command, env = activated(wildcard, tmp_path / "data", "--metrics-port", "0")
    result = subprocess.run(command, env=env, pass_fds=(wildcard.fileno(),), capture_output=True, text=True,
                            timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == EXIT_USAGE
    port = wildcard.getsockname()[1]
    line = one_line(result.stderr)
    assert f"refusing to listen with auth off (client port 0.0.0.0:{port})" in line and "--insecure" in line, line
    assert "IDLED_LISTENING" not in result.stderr and "127.0.0.1" not in result.stderr
    assert not (tmp_path / "data").exists()  # refused before the event log was touched


def test_host_wildcard_without_a_secret_is_refused_before_listening(tmp_path: Path) -> None:
    result = subprocess.run([*serve_command(tmp_path / "data", "--host", "0.0.0.0", "--metrics-port", "0")],
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == EXIT_USAGE
    assert "refusing to listen with auth off (client port 0.0.0.0:0)" in one_line(result.stderr)


async def test_socket_activation_on_a_wildcard_with_insecure_serves_and_says_where(
    tmp_path: Path, wildcard: socket.socket
) -> None:
    command, env = activated(wildcard, tmp_path / "data", "--metrics-port", "0", "--insecure")
    daemon = Daemon(command, tmp_path / "stderr", env=env, pass_fds=(wildcard.fileno(),))
    port = wildcard.getsockname()[1]
    wildcard.close()  # the daemon holds it now
    try:
        assert await daemon.started() == port
        user = await Client.login(port, "uid", "anyone")
        await user.send(PING)
        assert await user.recv() is PONG
        await user.stream.aclose()
        stderr = daemon.stderr()
        # The address really bound, not --host's default.
        assert f"IDLED_LISTENING host=0.0.0.0 port={port}" in stderr
        assert f"listening on 0.0.0.0:{port}" in stderr and "127.0.0.1" not in stderr
        assert await daemon.stop() == 0
    finally:
        daemon.kill()


async def test_socket_activation_on_loopback_needs_no_secret(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.2", 0)) as sock:
        port = sock.getsockname()[1]
        command, env = activated(sock, tmp_path / "data", "--metrics-port", "0")
        daemon = Daemon(command, tmp_path / "stderr", env=env, pass_fds=(sock.fileno(),))
    try:
        assert await daemon.started() == port
        assert f"IDLED_LISTENING host=127.0.0.2 port={port}" in daemon.stderr()
        assert await daemon.stop() == 0
    finally:
        daemon.kill()
