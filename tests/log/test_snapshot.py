"""Retention never forgets who is online: open-session snapshots, in-process and across a real SIGKILL."""

from __future__ import annotations

from pathlib import Path

import trio

from idled.log.eventlog import EventLog, iter_records
from idled.log.snapshot import OpenSessions, list_snapshots, read_snapshot
from idled.protocol import BYE, PING

from tests import peers
from tests.log.records import churn, ev, filled


def test_retention_keeps_sessions_whose_online_record_it_deleted(tmp_path: Path) -> None:
    with EventLog(tmp_path, segment_bytes=1000, retention_bytes=2500) as log:
        log.recover()
        log.append([ev(1, "online", "steady", 123.25, 7.5), ev(2, "online", 42), ev(3, "online", "gone")])
        seq = churn(log, 4, 2)
        log.append([ev(seq, "offline", "gone")])
        seq = churn(log, seq + 1, 60)
        assert log.snapshots >= 1 and log.open_sessions == 2
    remaining = list(iter_records(tmp_path))
    assert remaining[0]["seq"] > seq // 2  # retention deleted most of the log, steady's login with it
    assert not [r for r in remaining if r["uid"] in ("steady", 42)]
    with EventLog(tmp_path, segment_bytes=1000, retention_bytes=2500) as log:
        recovery = log.recover()
    assert set(recovery.online) == {"steady", 42}
    assert recovery.online["steady"]["last_seen"] == 123.25 and recovery.online["steady"]["timeout"] == 7.5
    assert type(next(uid for uid in recovery.online if uid != "steady")) is int  # the uid keeps its type
    assert recovery.snapshot_seq > 1 and recovery.next_seq == seq


def test_records_after_the_snapshot_override_it(tmp_path: Path) -> None:
    with EventLog(tmp_path, segment_bytes=1000, retention_bytes=2500) as log:
        log.recover()
        log.append([ev(1, "online", "a"), ev(2, "online", "b")])
        seq = churn(log, 3, 40)
        assert log.snapshots >= 1
        log.append([ev(seq, "offline", "a"), ev(seq + 1, "online", "c")])
    with EventLog(tmp_path) as log:
        recovery = log.recover()
    assert set(recovery.online) == {"b", "c"}
    assert recovery.online["c"]["seq"] == seq + 1  # replayed: its own seq, not the snapshot's


def test_a_damaged_newest_snapshot_is_reported_and_the_previous_one_used(tmp_path: Path) -> None:
    with EventLog(tmp_path, segment_bytes=1000, retention_bytes=2500) as log:
        log.recover()
        log.append([ev(1, "online", "a")])
        churn(log, 2, 80)
    snapshots = list_snapshots(tmp_path)
    assert len(snapshots) == 2  # the newest two are kept
    newest = Path(snapshots[-1][1])
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF
    newest.write_bytes(bytes(data))
    with EventLog(tmp_path) as log:
        recovery = log.recover()
    assert recovery.damaged_snapshots == (str(newest),) and recovery.snapshot_seq == snapshots[0][0]
    assert "damaged snapshots" in recovery.summary()
    assert "a" in recovery.online


def test_snapshot_round_trips_exact_values_and_uid_types(tmp_path: Path) -> None:
    sessions = OpenSessions()
    for seq, uid in enumerate(["x", 7, "7", -3, "é" * 40], 1):
        sessions.note(ev(seq, "online", uid, last_seen=0.1 * seq + 1e9, timeout=1.0 / 3))
    sessions.note(ev(9, "offline", "x"))
    from idled.log.snapshot import write_snapshot

    path = write_snapshot(str(tmp_path), 10, sessions.sessions)
    assert read_snapshot(path) == (10, sessions.sessions)
    assert list(read_snapshot(path)[1]) == [7, "7", -3, "é" * 40]


def test_open_sessions_cost_under_100_bytes_each() -> None:
    # The daemon holds 1M sessions. The uid objects already exist (the presence table's keys), so only what
    # the log adds is measured: the dict slot and the complex value.
    n = 200_000
    uids = [f"user-{i}" for i in range(n)]
    events = [{"kind": "online", "uid": uid, "last_seen": 1.7e9 + i, "timeout": 45.0} for i, uid in enumerate(uids)]
    sessions, size = filled(OpenSessions, events)
    per_session = size / n
    assert len(sessions) == n
    assert per_session < 100, per_session


async def test_sigkill_after_retention_still_closes_a_long_online_session(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    options = ("--tick", "0.05", "--timeout", "1", "--max-timeout", "600", "--fsync", "always",
               "--segment-bytes", "4096", "--retention-bytes", "4096")
    daemon = peers.Daemon(peers.serve_command(data_dir, *options), tmp_path / "run-0.stderr")
    try:
        port = await daemon.started()
        steady = await peers.Client.login(port, "uid", "steady", keepalive=300)
        for n in range(150):  # other users' logins and byes: rolls, and retention deletes steady's login
            client = await peers.Client.login(port, "uid", f"churn-{n}")
            await client.send(BYE)
            await client.stream.aclose()
        await steady.send(PING)
        # Every bye handled before the kill: sessions left open would be closed at restart too, and their records
        # could roll steady's closing record out of this 4 KiB retention before the test reads it.
        observer = await peers.Client.login(port, "observer", "obs")
        churned = [f"churn-{n}" for n in range(150)]
        with trio.fail_after(20):
            while any((await observer.status_of(churned)).online.values()):
                await trio.sleep(0.05)
            while not list_snapshots(data_dir) or any(r["uid"] == "steady" for r in iter_records(data_dir)):
                await trio.sleep(0.05)
        daemon.kill()  # SIGKILL: steady never logged out
    finally:
        daemon.kill()
    restarted = peers.Daemon(peers.serve_command(data_dir, *options), tmp_path / "run-1.stderr")
    try:
        await restarted.started()
        # The restart record is published before the daemon listens; the writer may put it on disk just after.
        with trio.fail_after(10):
            while not (closing := [r for r in iter_records(data_dir) if r["uid"] == "steady"]):
                await trio.sleep(0.05)
        assert [(r["kind"], r["reason"]) for r in closing] == [("offline", "restart")]
        assert closing[0]["timeout"] == 300 * 1.5  # from the snapshot: the session's own timeout
        assert await restarted.stop() == 0
    finally:
        restarted.kill()
