"""`idled status`'s text (idled.cli.status.format_status): the new lines appear only when the daemon sends them."""

from __future__ import annotations

from typing import Any

from idled.cli.status import format_status

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
