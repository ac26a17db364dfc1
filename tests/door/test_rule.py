"""The door's rule, for every process kind and every listener: none beyond loopback with auth off.

Every process kind idled has -- the core, the ``--workers`` root, a standby, an elected node, an edge,
``idled hook`` -- is started with each of its listeners on 0.0.0.0 and no secret: each must refuse with one
line naming the listener (exit 2), before it touches its data directory (so no seq is reserved, no log
recovered, nothing created). ``idled check-config`` with the same flags says the same. With a secret, the core
and an edge start on 0.0.0.0 with every listener there, reached here only through 127.0.0.1 (nothing leaves
the machine).
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from idled.ops.fatal import EXIT_USAGE
from idled.protocol import Login, Welcome, tokens
from tests.faults.test_fatal import one_line
from tests.peers import Client, Daemon, free_port, serve_command

pytestmark = pytest.mark.slow

IDLED = [sys.executable, "-m", "idled.cli.main"]

# (process kind, listener, the command's options after `idled`, with DATA for the data directory)
KINDS = {
    "core": ["serve", "--data-dir", "DATA"],
    "root": ["serve", "--workers", "2", "--data-dir", "DATA"],
    "standby": ["serve", "--standby-of", "127.0.0.1:9", "--data-dir", "DATA"],
    "elected": ["serve", "--election", "etcd://127.0.0.1:9/idled", "--advertise", "127.0.0.1:7878", "--data-dir", "DATA"],
    "edge": ["edge", "--core", "127.0.0.1:9"],
    "hook": ["hook", "--url", "http://127.0.0.1:9/hook", "--state", "DATA", "--insecure-unsigned"],
}
LISTENERS = {
    "client port": ["--host", "0.0.0.0", "--port", "0"],
    "metrics endpoint": ["--metrics-host", "0.0.0.0", "--metrics-port", "PORT"],
    "HTTP API": ["--api-host", "0.0.0.0", "--api-port", "PORT"],
}
# What each kind listens on: a standby and an edge serve no API; the hook only its metrics.
CASES = [(kind, listener) for kind in KINDS for listener in LISTENERS
         if not (listener == "HTTP API" and kind in ("standby", "edge", "hook"))
         and not (kind == "hook" and listener != "metrics endpoint")]


def command(kind: str, listener: str, data: Path) -> list[str]:
    port = str(free_port())
    options = [part.replace("DATA", str(data)) for part in KINDS[kind]]
    if kind != "hook" and listener != "metrics endpoint":
        options += ["--metrics-port", "0"]
    return [*IDLED, *options, *(part.replace("PORT", port) for part in LISTENERS[listener])]


@pytest.mark.parametrize(("kind", "listener"), CASES)
def test_every_listener_of_every_process_refuses_a_wildcard_with_auth_off(kind: str, listener: str,
                                                                          tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = subprocess.run(command(kind, listener, data), capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    line = one_line(result.stderr.replace("idled hook: fatal: ", "idled: fatal: "))
    assert result.returncode == EXIT_USAGE, result.stderr
    assert f"refusing to listen with auth off ({listener} 0.0.0.0:" in line and "--insecure" in line, line
    assert "IDLED_LISTENING" not in result.stderr
    assert not data.exists()  # refused before the data directory (log, seqs, state) was touched


@pytest.mark.parametrize("listener", list(LISTENERS))
def test_check_config_refuses_what_serve_refuses(listener: str, tmp_path: Path) -> None:
    serve = command("core", listener, tmp_path / "data")
    result = subprocess.run([*IDLED, "check-config", *serve[len(IDLED) + 1:]], capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert f"refusing to listen with auth off ({listener} 0.0.0.0:" in result.stderr
    assert not (tmp_path / "data").exists()


async def test_with_a_secret_every_listener_may_face_the_network(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    metrics, api = free_port(), free_port()
    serve = serve_command(tmp_path / "data", "--host", "0.0.0.0", "--metrics-host", "0.0.0.0", "--metrics-port",
                          str(metrics), "--api-host", "0.0.0.0", "--api-port", str(api), "--secret-file", str(secret))
    async with Daemon(serve, tmp_path / "serve.stderr") as core:
        token = tokens.mint(secret.read_bytes(), "uid", "alice", 2e9)
        client = await Client.login(core.port, "uid", "alice", token=token)  # through 127.0.0.1 only
        await client.stream.aclose()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=10) as response:
            assert response.status == 200
        edge = [*IDLED, "edge", "--core", f"127.0.0.1:{core.port}", "--host", "0.0.0.0", "--port", "0",
                "--secret-file", str(secret)]
        async with Daemon(edge, tmp_path / "edge.stderr") as front:
            user = await Client.connect(front.port)
            await user.send(Login("uid", "bob", tokens.mint(secret.read_bytes(), "uid", "bob", 2e9)))
            assert isinstance(await user.recv(), Welcome)
            await user.stream.aclose()
