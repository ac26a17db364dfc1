"""The command line as a function: main(argv) -> int."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.protocol import tokens as auth

from idled.cli import main as cli


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """`idled serve` installs its stderr handler on the root logger; don't leave one pointing at pytest's
    captured (soon closed) stream for the rest of the session."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_every_command_builds_its_parser() -> None:
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit) as exit_info:
            cli.main([name, "--help"])
        assert exit_info.value.code == 0


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["frobnicate"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_token_round_trip_through_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123456789abcdef\n")
    assert cli.main(["token", "--secret-file", str(secret), "--uid", "alice", "--ttl", "60"]) == 0
    token = capsys.readouterr().out.strip()
    auth.verify(auth.load_secret(str(secret)), token, "uid", "alice", now=__import__("time").time())


def test_serve_refuses_a_bad_config_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--tick", "5", "--timeout", "1", "--data-dir", str(tmp_path)]) == 2
    assert "tick <= timeout" in capsys.readouterr().err


def test_serve_refuses_a_public_address_without_auth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path)]) == 2
    assert "--insecure" in capsys.readouterr().err


def test_serve_never_imports_pyspark_or_matplotlib() -> None:
    code = "import sys, idled.cli.main; idled.cli.main.build_parser('serve'); import idled.server.app; " \
           "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'matplotlib')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_edge_without_a_metrics_port_never_imports_prometheus_nor_the_engine() -> None:
    """Every edge is a whole interpreter (six at 100,000 connections): what it never uses is not loaded --
    prometheus_client with its http.server and email (~2.4 MiB), the core's engine (~1.4 MiB)."""
    code = "import sys, idled.cli.main; idled.cli.main.build_parser('edge'); import idled.cli.edge; " \
           "print(sorted(m for m in sys.modules if m.split('.')[0] in ('prometheus_client', 'email') " \
           "or m.startswith('idled.server.engine') or m == 'idled.ops.metrics'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
