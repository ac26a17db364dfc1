"""The start-up summary, plurals and the rate-limited peer log (synchronous, an injected clock)."""

from __future__ import annotations

import logging

import pytest

from idled.ops.config import Config
from idled.ops.logs import PeerLog, summary_line, plural


def test_plural() -> None:
    assert plural(1, "session") == "1 session"
    assert plural(0, "session") == "0 sessions"
    assert plural(2, "user") == "2 users"


def test_summary_line_names_what_an_operator_checks_first() -> None:
    line = summary_line(Config(secret_file="/etc/idled/secret", fsync="always"), version="9.9", data_dir="/d")
    for part in ("idled 9.9", "listen 127.0.0.1:7878", "metrics 127.0.0.1:9878", "data dir /d", "detector ring-lazy",
                 "timeout 30s", "tick 1s", "auth on (secret /etc/idled/secret)", "fsync always",
                 "100000 connections", "frame 4 KiB"):
        assert part in line, part
    assert "auth off" in summary_line(Config(), data_dir="/d")


def test_peer_log_limits_each_kind_per_second_and_summarises(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    peers = PeerLog(logging.getLogger("test.peers"), per_second=3, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, "test.peers")
    for i in range(10):
        peers.debug("reject", "reject %d", i)
    peers.debug("login", "login x")  # another kind has its own budget
    assert [r.getMessage() for r in caplog.records] == ["reject 0", "reject 1", "reject 2", "login x"]
    assert peers.suppressed("reject") == 7
    now[0] += 1.5
    peers.debug("reject", "reject again")
    assert [r.getMessage() for r in caplog.records][-2:] == ["suppressed 7 reject lines in the last 2 s", "reject again"]


def test_peer_log_costs_nothing_below_debug(caplog: pytest.LogCaptureFixture) -> None:
    calls = []
    peers = PeerLog(logging.getLogger("test.quiet"), clock=lambda: calls.append(1) or 0.0)
    caplog.set_level(logging.INFO, "test.quiet")
    peers.debug("reject", "never")
    assert not calls and not caplog.records
