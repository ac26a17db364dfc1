"""The last-seen map the event log keeps: appended records, snapshots (old and new), horizon, recovery."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idled.log.eventlog import EventLog, iter_records
from idled.log.lastseen import LastSeen
from idled.log.snapshot import (
    OpenSessions, encode_snapshot, list_snapshots, load_snapshot, read_snapshot, read_snapshot_state, snapshot_name,
    write_snapshot,
)

from tests.log.records import NOW, churn, ev, filled

DAY = 86400.0


def test_offline_stores_online_forgets() -> None:
    seen = LastSeen(horizon=DAY)
    seen.note(ev(1, "online", "a"))
    assert seen.get("a", NOW) is None  # online: the presence table's, not the store's
    seen.note(ev(2, "offline", "a", last_seen=NOW - 5))
    seen.note(ev(3, "offline", 7, last_seen=NOW - 6))
    assert seen.get("a", NOW) == NOW - 5 and seen.get(7, NOW) == NOW - 6 and seen.get("7", NOW) is None
    seen.note(ev(4, "online", "a"))
    assert seen.get("a", NOW) is None and len(seen) == 1


def test_horizon_hides_then_prunes() -> None:
    seen = LastSeen(horizon=DAY)
    seen.note(ev(1, "offline", "old", last_seen=NOW - 2 * DAY))
    seen.note(ev(2, "offline", "new", last_seen=NOW - DAY / 2))
    assert seen.get("old", NOW) is None  # lazily, on lookup
    assert seen.get("old", NOW - 1.5 * DAY) == NOW - 2 * DAY
    assert seen.prune(NOW) == 1
    assert dict(seen.seen) == {"new": NOW - DAY / 2}


def test_horizon_zero_disables_the_store() -> None:
    seen = LastSeen(horizon=0)
    seen.note(ev(1, "offline", "a"))
    assert len(seen) == 0 and seen.get("a", NOW) is None and not seen.enabled
    with pytest.raises(ValueError):
        LastSeen(horizon=-1)


def test_snapshot_round_trips_the_map_with_uid_types(tmp_path: Path) -> None:
    sessions = OpenSessions()
    sessions.note(ev(1, "online", "on"))
    last_seen = {7: NOW + 0.1, "7": NOW + 1 / 3, "é" * 40: NOW - 1e6, 2**63 - 1: 1.0}
    path = write_snapshot(str(tmp_path), 10, sessions.sessions, last_seen=last_seen)
    seq, loaded_sessions, loaded = read_snapshot_state(path)
    assert (seq, loaded_sessions, loaded) == (10, sessions.sessions, last_seen)
    assert list(loaded) == [7, "7", "é" * 40, 2**63 - 1]
    assert read_snapshot(path) == (10, sessions.sessions)


def test_a_snapshot_without_the_map_still_loads(tmp_path: Path) -> None:
    # The three-element body written before the last-seen map existed (what encode_snapshot writes without one).
    sessions = OpenSessions()
    sessions.note(ev(1, "online", "on", last_seen=NOW))
    (tmp_path / snapshot_name(5)).write_bytes(encode_snapshot(5, sessions.sessions))
    snapshot = load_snapshot(str(tmp_path))
    assert snapshot.seq == 5 and snapshot.sessions == sessions.sessions and snapshot.last_seen == {}
    assert not snapshot.damaged
    with EventLog(tmp_path) as log:
        recovery = log.recover()
        assert set(recovery.online) == {"on"} and log.last_seen_users == 0


def test_retention_keeps_last_seen_whose_offline_record_it_deleted(tmp_path: Path) -> None:
    clock = [NOW + 1000]
    options: dict[str, Any] = dict(segment_bytes=1000, retention_bytes=2500, clock=lambda: clock[0], last_seen_horizon=DAY)
    with EventLog(tmp_path, **options) as log:
        log.recover()
        log.append([ev(1, "online", "bob"), ev(2, "offline", "bob", last_seen=NOW - 60),
                    ev(3, "offline", 42, last_seen=NOW - 2 * DAY),  # beyond the horizon: pruned at the snapshot
                    ev(4, "online", "carol")])
        seq = churn(log, 5, 60)
        assert log.snapshots >= 1
        assert log.last_seen("bob") == NOW - 60 and log.last_seen("carol") is None
    assert not [r for r in iter_records(tmp_path) if r["uid"] in ("bob", 42)]  # retention deleted them
    seq_snap, _sessions, in_file = read_snapshot_state(list_snapshots(tmp_path)[-1][1])
    assert in_file["bob"] == NOW - 60 and 42 not in in_file
    with EventLog(tmp_path, **options) as log:
        recovery = log.recover()
        assert log.last_seen("bob") == NOW - 60
        assert log.last_seen(42) is None and log.last_seen("carol") is None
        assert log.last_seen(f"c{59}") == NOW + seq - 1  # replayed from the records after the snapshot
        assert recovery.last_seen == log.last_seen_users


def test_records_after_the_snapshot_override_its_map(tmp_path: Path) -> None:
    options: dict[str, Any] = dict(segment_bytes=1000, retention_bytes=2500, clock=lambda: NOW + 1e4)
    with EventLog(tmp_path, **options) as log:
        log.recover()
        log.append([ev(1, "offline", "a", last_seen=NOW - 10), ev(2, "offline", "b", last_seen=NOW - 20)])
        seq = churn(log, 3, 40)
        assert log.snapshots >= 1
        log.append([ev(seq, "online", "a"), ev(seq + 1, "offline", "b", last_seen=NOW + 5)])
    with EventLog(tmp_path, **options) as log:
        log.recover()
        assert log.last_seen("a") is None  # online again after the snapshot (then a restart offline comes)
        assert log.last_seen("b") == NOW + 5


def test_disabled_store_writes_the_old_snapshot_body(tmp_path: Path) -> None:
    options: dict[str, Any] = dict(segment_bytes=1000, retention_bytes=2500, last_seen_horizon=0)
    with EventLog(tmp_path, **options) as log:
        log.recover()
        log.append([ev(1, "offline", "a")])
        churn(log, 2, 40)
        assert log.snapshots >= 1 and log.last_seen("a") is None and log.last_seen_users == 0
    path = list_snapshots(tmp_path)[-1][1]
    seq, sessions = read_snapshot(path)
    assert Path(path).read_bytes() == encode_snapshot(seq, sessions)  # three elements, as before the map


def test_the_map_costs_under_140_bytes_per_offline_user() -> None:
    # What `idled bench --last-seen` measures at 1M (116 B/user for str uids): the dict entry, the uid and the
    # float, which only the map holds once the user is offline.
    n = 100_000

    def offlines() -> Iterator[dict[str, Any]]:
        event: dict[str, Any] = {"kind": "offline"}
        for i in range(n):  # a fresh uid and float per record, as the writer gets them decoded
            event["uid"], event["last_seen"] = f"user-{i:07d}", NOW + i * 0.001
            yield event

    seen, size = filled(lambda: LastSeen(DAY), offlines())
    per_user = size / n
    assert len(seen) == n
    assert per_user < 140, per_user
