"""A run starts its wall clock at or after the event log's last ``ts`` (idled.server.runtime.clock.floor_wall): the
clock was stepped back while the daemon was down, or the log came from a standby whose clock was ahead.
(Under libfaketime, with a real subprocess: tests/server/runtime/test_clock_step.py.) And nothing else in the server
reads the system's wall clock."""

from __future__ import annotations

import ast
import time
from pathlib import Path

from idled.log.eventlog import EventLog
from tests.peers import running

AHEAD = 3600.0  # seconds the last logged ts is ahead of the system clock


def write_log(data_dir: Path, ts: float) -> None:
    """A previous run's log: alice online, her online record stamped ``ts``."""
    with EventLog(data_dir) as log:
        log.recover()
        log.append([{"seq": 1, "kind": "online", "uid": "alice", "ts": ts, "reason": "login", "last_seen": ts,
                     "deadline": ts + 30.0, "timeout": 30.0, "detector": "ring-lazy"}])
        log.sync()


async def test_a_run_stamps_nothing_below_the_last_logged_ts(tmp_path: Path) -> None:
    last = time.time() + AHEAD
    write_log(tmp_path / "data", last)
    async with running(tmp_path) as h:
        await h.user("bob")
    records = h.records()
    assert [(r["uid"], r["reason"]) for r in records] == [
        ("alice", "login"), ("alice", "restart"), ("bob", "login"), ("bob", "shutdown")]
    assert all(r["ts"] >= last for r in records), records
    assert all(a["ts"] <= b["ts"] for a, b in zip(records, records[1:])), records
    assert h.server.clock.wall.ahead() > AHEAD - 60.0  # ahead of the system clock, slewing towards it


async def test_a_log_behind_the_clock_changes_nothing(tmp_path: Path) -> None:
    write_log(tmp_path / "data", time.time() - AHEAD)  # the usual restart: the clock is past the last ts
    before = time.time()
    async with running(tmp_path) as h:
        await h.user("bob")
    bob = [r for r in h.records() if r["uid"] == "bob"]
    assert before <= bob[0]["ts"] <= time.time()
    assert h.server.clock.wall.ahead() == 0.0


def test_the_server_reads_the_system_wall_clock_in_one_place() -> None:
    # Every wall-clock time the daemon stamps or judges by comes from Clock.wall (idled.server.runtime.clock): a
    # time.time() elsewhere in server/ would go back with the system clock.
    server = Path(__file__).resolve().parents[3] / "idled" / "server"
    readers = []
    for path in sorted(server.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("time", "time_ns") and \
                    isinstance(node.value, ast.Name) and node.value.id == "time":
                readers.append(f"{path.relative_to(server)}:{node.lineno}")
    assert [reader for reader in readers if not reader.startswith("runtime/clock.py:")] == []
    assert len(readers) == 1, readers  # WallClock.__call__
