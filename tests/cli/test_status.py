"""`idled status`: its text (idled.cli.status.format_status: a line only for what the daemon sends), and against a
real daemon with auth on, the redacted status without a token and the whole one with --token or --secret-file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idled.cli.status import REDACTED_NOTE, format_status
from idled.protocol.tokens import API_ROLE, mint
from idled.tools.bench.daemon import Daemon
from tests import peers

IDLED = [sys.executable, "-m", "idled.cli.main"]
SECRET = b"status-cli-secret-0123456789"

OLD: dict[str, Any] = {"version": "0.1.0", "uptime_seconds": 75, "ready": True, "sessions_online": 2, "users_online": 2,
                       "connections": {"user": 2}, "next_seq": 5, "ports": [7878], "data_dir": "/d"}


def test_a_document_without_vitals_prints_as_before() -> None:
    text = format_status(OLD)
    assert text.splitlines()[0] == "idled 0.1.0, up 1m 15s, ready"
    assert text.splitlines()[-1] == "data dir         /d"


def test_rate_lateness_and_workers() -> None:
    doc = {**OLD, "events_per_second": 2.5,
           "lateness": {"count": 3, "mean": 0.05, "p50": 0.05, "p90": 0.1, "p99": 0.1, "p99_9": 0.1},
           "workers": [{"name": "worker-0", "pid": 42, "up": True, "restarts": 1, "sessions": 2, "connections": 2},
                       {"name": "worker-1", "pid": None, "up": False, "restarts": 4, "sessions": 0, "connections": 0}]}
    lines = format_status(doc).splitlines()
    assert "events/s         2.50 (last minute)" in lines
    assert "offline lateness p50 50 ms, p90 100 ms, p99 100 ms (at most; 3 idle offlines)" in lines
    assert "worker-0         up, pid 42, 1 restart, 2 sessions, 2 connections" in lines
    assert "worker-1         DOWN, 4 restarts, 0 sessions, 0 connections" in lines


def test_connections_by_every_role_standbys_included() -> None:
    doc = {**OLD, "connections": {"user": 2, "gateway": 1, "observer": 3, "standby": 1, "pending": 4}}
    lines = format_status(doc).splitlines()
    assert "connections      2 users, 1 gateway, 3 observers, 1 standby (4 logging in)" in lines
    assert "standbys         1" in lines


def test_a_redacted_document_prints_what_it_has_and_says_the_rest_needs_a_token() -> None:
    redacted = {key: value for key, value in OLD.items() if key != "data_dir"} | {"redacted": True}
    text = format_status(redacted)
    assert "None" not in text and "data dir" not in text
    assert text.splitlines()[-1] == REDACTED_NOTE and "--token" in REDACTED_NOTE and "--secret-file" in REDACTED_NOTE
    assert "sessions online  2 (2 users)" in text.splitlines()


def test_a_standby_document_prints_no_none() -> None:
    """A standby's /status has no sessions nor detector keys: no line for them, rather than a None."""
    standby = {"version": "0.1.0", "uptime_seconds": 3, "ready": True, "role": "standby", "connections": {"observer": 1},
               "next_seq": 42, "ports": [7879], "stopping": False, "redacted": True, "standby": {"state": "streaming"}}
    text = format_status(standby)
    assert "None" not in text and "sessions online" not in text and "detector keys" not in text
    assert "role             standby" in text.splitlines() and "next seq         42" in text.splitlines()


def test_an_edge_without_its_core_and_a_leader_before_any_ack_print_no_none() -> None:
    edge = {"version": "0.1.0", "uptime_seconds": 9, "ready": True, "role": "edge", "name": "edge-a", "leader": None,
            "edge": {"cores": "10.0.0.1:7878,10.0.0.2:7878", "core": None, "link": "down", "users": 3,
                     "attaching": 0, "last_error": "connection_lost: refused"},
            "connections": {"user": 3}, "config": {"max_connections": 19934}}
    lines = format_status(edge).splitlines()
    assert "None" not in "\n".join(lines)
    assert "role             edge edge-a" in lines
    assert ("leader           none (core link down; cores 10.0.0.1:7878,10.0.0.2:7878; last error: "
            "connection_lost: refused)") in lines
    assert "users            3 held here (0 attaching)" in lines and "max connections  19,934" in lines
    leader = {**OLD, "role": "leader", "role_seconds": 61, "leader": "10.0.0.1:7878", "election": {"lease_left": 1.25},
              "replication": {"sync_standby": True, "log_durable_seq": 7, "standbys": [{"name": "b", "acked": -1}]}}
    lines = format_status(leader).splitlines()
    assert "role             leader for 1m 1s (elected; lease 1.2 s left)" in lines
    assert "leader           10.0.0.1:7878 (this core)" in lines
    assert "replication      1 standby: b no ack yet (7 behind); sync on" in lines


# -- against a real daemon with auth on -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, int, Path]]:
    """`idled serve --secret-file` with a metrics port; (daemon, metrics port, secret file)."""
    directory = tmp_path_factory.mktemp("status-auth")
    secret = directory / "secret"
    secret.write_bytes(SECRET)
    os.chmod(secret, 0o600)
    metrics_port = peers.free_port()
    with Daemon(directory, "--secret-file", str(secret), "--metrics-port", str(metrics_port)) as serve:
        yield serve, metrics_port, secret


def status(metrics_port: int, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IDLED, "status", "--metrics", f"127.0.0.1:{metrics_port}", *flags],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.slow
def test_without_a_token_idled_status_prints_the_redacted_status(daemon: tuple[Daemon, int, Path]) -> None:
    serve, metrics_port, _ = daemon
    done = status(metrics_port)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("idled ") and lines[0].endswith(", ready")
    assert "sessions online  0 (0 users)" in lines and REDACTED_NOTE in lines
    assert "None" not in done.stdout and "data dir" not in done.stdout and str(serve.stderr_path.parent) not in done.stdout
    document = json.loads(status(metrics_port, "--json").stdout)
    assert document["redacted"] is True and "data_dir" not in document


@pytest.mark.slow
def test_with_a_token_or_the_secret_idled_status_prints_everything(daemon: tuple[Daemon, int, Path]) -> None:
    serve, metrics_port, secret = daemon
    token = mint(SECRET, API_ROLE, "ops", time.time() + 60)
    for flags in (("--token", token), ("--secret-file", str(secret))):
        done = status(metrics_port, *flags)
        assert done.returncode == 0, done.stderr
        assert f"data dir         {serve.stderr_path.parent / 'data'}" in done.stdout.splitlines(), done.stdout
        assert REDACTED_NOTE not in done.stdout and "None" not in done.stdout
        assert json.loads(status(metrics_port, "--json", *flags).stdout)["redacted"] is False


@pytest.mark.slow
def test_a_refused_token_is_an_error_not_a_redacted_status(daemon: tuple[Daemon, int, Path], tmp_path: Path) -> None:
    _, metrics_port, _ = daemon
    expired = mint(SECRET, API_ROLE, "ops", time.time() - 1)
    done = status(metrics_port, "--token", expired)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == f"idled status: 127.0.0.1:{metrics_port} refused the token: token expired"
    other = tmp_path / "other-secret"
    other.write_bytes(b"another-secret-0123456789abcdef")
    done = status(metrics_port, "--secret-file", str(other))
    assert done.returncode == 1 and "refused the token: token signature does not match" in done.stderr
    login = mint(SECRET, "uid", "alice", time.time() + 60)
    assert status(metrics_port, "--token", login).returncode == 1
    missing = status(metrics_port, "--secret-file", str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stderr.startswith("idled status: ") and "nope" in missing.stderr
    both = status(metrics_port, "--token", expired, "--secret-file", str(other))
    assert both.returncode == 2
