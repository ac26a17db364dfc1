"""The blocking wrapper (a trio loop in a thread) against a real `idled serve`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from idled.client import AuthFailed
from idled.client.blocking import connect_observer, connect_session, watch
from tests.client.support import HOST, Idled

pytestmark = pytest.mark.slow  # real idled daemons


def test_blocking_session_and_watch(idled: Idled) -> None:
    with connect_session(HOST, idled.port, "dave", keepalive=1) as session:
        session.send({"from": "a script"})
        time.sleep(2.6)  # the background thread sends keepalives (every 1 s): dave stays online past his 1.5 s timeout
        assert session.session.pings + session.session.quiet_keepalives >= 2
    events = []
    for event in watch(HOST, idled.port, "script", after=0):
        events.append((event.seq, event.uid, event.kind, event.reason))
        if event.kind == "offline":
            break
    assert events == [(1, "dave", "online", "login"), (2, "dave", "offline", "logout")]


def test_blocking_watchlist_observer(idled: Idled) -> None:
    with connect_observer(HOST, idled.port, "script", uids=["erin"]) as observer:
        observer.watch(["frank"])  # in effect once it returns
        with connect_session(HOST, idled.port, "gina"), connect_session(HOST, idled.port, "frank"):
            pass
        assert observer.query(["frank"]) == {"frank": False}
        observer.unwatch(["frank", "erin"])
        assert observer.observer.watchlist == []
        events = iter(observer)
        assert [(e.uid, e.kind) for e in (next(events), next(events))] == [("frank", "online"), ("frank", "offline")]
    replay = watch(HOST, idled.port, "again", after=0, uids=["gina"])
    assert [(e.uid, e.kind) for e in (next(replay), next(replay))] == [("gina", "online"), ("gina", "offline")]
    replay.close()


def test_blocking_login_failure_is_raised(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"a test secret of at least 16 bytes")
    daemon = Idled(tmp_path, "--secret-file", str(tmp_path / "secret")).start()
    try:
        with pytest.raises(AuthFailed):
            connect_session(HOST, daemon.port, "dave", token="not-a-token")
    finally:
        daemon.kill()


def test_blocking_sessions_of_two_devices_are_one_user(idled: Idled) -> None:
    with connect_session(HOST, idled.port, "erin", keepalive=30, device="phone") as phone:
        assert phone.session.key == ("erin", "phone")
        with connect_session(HOST, idled.port, "erin", keepalive=30, device="laptop"):
            pass  # the laptop's bye: erin stays online through the phone
    events = []
    for event in watch(HOST, idled.port, "script", after=0):
        events.append((event.uid, event.kind, event.reason, (event.extra or {}).get("device")))
        if event.kind == "offline":
            break
    assert events == [("erin", "online", "login", "phone"), ("erin", "offline", "logout", "phone")]
