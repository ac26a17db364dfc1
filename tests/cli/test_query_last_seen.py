"""`idled query --last-seen`: lines an operator reads, JSON a script reads, against a real daemon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from idled.cli import main as cli
from idled.cli.query import ago, describe
from idled.client import UserStatus
from idled.client.blocking import connect_session

from tests.client.support import HOST, Idled


@pytest.mark.parametrize(("seconds", "text"), [
    (-3.0, "just now"), (0.4, "just now"), (1.0, "1 s ago"), (59.9, "59 s ago"), (60.0, "1 min ago"),
    (300.0, "5 min ago"), (3599.0, "59 min ago"), (7200.0, "2 h ago"), (86400.0, "1 day ago"),
    (3 * 86400.0 + 5, "3 days ago"),
])
def test_ago(seconds: float, text: str) -> None:
    assert ago(seconds) == text


def test_describe() -> None:
    assert describe("bob", UserStatus(False, 1000.0), 1300.0) == "bob offline, last seen 5 min ago"
    assert describe("alice", UserStatus(True, 1000.0), 1000.5) == "alice online"
    assert describe(7, UserStatus(True, 1.0, ("phone", "laptop")), 2.0) == "7 online (phone, laptop)"
    assert describe("carol", UserStatus(False, None), 5.0) == "carol offline, last seen unknown"


@pytest.mark.slow
def test_query_last_seen_against_a_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    daemon = Idled(tmp_path).start()
    try:
        port = ["--port", str(daemon.port)]
        with connect_session(HOST, daemon.port, "bob", keepalive=30):
            pass
        with connect_session(HOST, daemon.port, "alice", keepalive=30):
            assert cli.main(["query", "bob", "alice", "carol", "--last-seen", *port]) == 0
            assert capsys.readouterr().out.splitlines() == [
                "bob offline, last seen just now", "alice online", "carol offline, last seen unknown",
            ]
            assert cli.main(["query", "bob", "alice", "--last-seen", "--json", *port]) == 0
            answer = json.loads(capsys.readouterr().out)
            assert answer["alice"]["online"] is True and answer["alice"]["devices"] == []
            assert answer["bob"]["online"] is False and isinstance(answer["bob"]["last_seen"], float)
            assert cli.main(["query", "bob", "alice", "--json", *port]) == 0  # without the flag: as before
            assert json.loads(capsys.readouterr().out) == {"bob": False, "alice": True}
    finally:
        daemon.kill()
