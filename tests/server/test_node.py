"""Failover with real parts: a real etcd, two `idled serve --election` cores on 127.0.0.2 and 127.0.0.3 (two
"machines"), SIGKILL, SIGSTOP, etcd killed; and `idled promote` of a standby run without an election."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.protocol import Login
from idled.tools.bench.failover import Cluster, _DurableObserver, _Gateway, _history, _login, _probe
from idled.tools.etcd import ETCD
from tests.server.standby_support import Gateway, active, records, standby, status, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ETCD is None, reason="etcd not on PATH (.ci/system-deps)")]

TTL = 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, TTL, ["--tick", "0.1"])
    try:
        yield cluster
    finally:
        cluster.close()


def _started(cluster: Cluster) -> int:
    cluster.start(0)
    cluster.start(1)
    return cluster.settled()


def _role(cluster: Cluster, i: int) -> str | None:
    doc = cluster.status(i)
    return None if doc is None else doc.get("role")


def test_sigkill_of_the_leader_under_load_hands_over_and_loses_no_durable_event(cluster: Cluster) -> None:
    leader = _started(cluster)
    gateway, observer = _Gateway(cluster, 500.0), _DurableObserver(cluster)
    observer.target = leader
    gateway.start()
    observer.start()
    try:
        wait_for(lambda: observer.last > 200, what="durable events on the leader")
        started = time.monotonic()
        cluster.kill(leader)
        took = _probe(cluster.address(1 - leader), started, limit=TTL + 10)
        observer.target = 1 - leader
        assert took is not None and took < TTL + 2, f"the standby took {took} s to accept a login"
        seen_before = observer.last
        wait_for(lambda: observer.last > seen_before + 200, what="durable events on the new leader")
        cluster.start(leader)  # back as a follower of the new leader
        assert cluster.settled() == 1 - leader
    finally:
        gateway.stop.set()
        gateway.join()
    time.sleep(0.5)
    observer.stop.set()
    observer.join()
    history = _history(cluster.address(1 - leader), observer.last)
    final = {event.seq: (event.kind, event.uid, event.ts, event.reason) for event in history}
    seqs = [event.seq for event in history]
    assert seqs == sorted(set(seqs)), "seqs must be strictly increasing"
    lost = [seq for seq, content in observer.seen.items() if final.get(seq) != content]
    assert not lost, f"{len(lost)} durable events lost, first {lost[:5]}"
    # The new leader began past the old leader's reserved block and ended what it found open as `restart`.
    assert any(event.reason == "restart" for event in history)
    # Both data directories hold the same records now (the old leader followed and caught up).
    cluster.settled()
    wait_for(lambda: records(cluster.base / f"data{leader}") == records(cluster.base / f"data{1 - leader}"),
             what="identical logs")


def test_a_frozen_leader_writes_nothing_when_it_wakes(cluster: Cluster) -> None:
    leader = _started(cluster)
    gateway = _Gateway(cluster, 300.0)
    gateway.start()
    try:
        wait_for(lambda: gateway.sent > 300, what="events")
        node = cluster.nodes[leader]
        assert node is not None
        os.kill(node.proc.pid, signal.SIGSTOP)
        try:
            frozen_log = records(cluster.base / f"data{leader}")
            started = time.monotonic()
            assert _probe(cluster.address(1 - leader), started, limit=TTL + 10) is not None
            time.sleep(1.0)  # the gateway sends on, to the new leader (and frames queue up at the frozen one)
        finally:
            os.kill(node.proc.pid, signal.SIGCONT)
        # Woken past its lease: it must not write one more record of its own; it follows the new leader.
        wait_for(lambda: _role(cluster, leader) == "standby", what="the woken leader following")
    finally:
        gateway.stop.set()
        gateway.join()
    new_log = records(cluster.base / f"data{1 - leader}")
    mine = records(cluster.base / f"data{leader}")
    written_after_waking = [seq for seq in mine if seq not in frozen_log and mine[seq] != new_log.get(seq)]
    assert not written_after_waking, f"the fenced leader wrote {written_after_waking[:5]}"


def test_with_etcd_gone_the_leader_steps_down_by_its_deadline_and_nobody_leads(cluster: Cluster) -> None:
    leader = _started(cluster)
    address = cluster.address(leader)
    sock = _login(address, Login("uid", "before"))
    assert sock is not None
    sock.close()
    killed = time.monotonic()
    cluster.etcd.kill()
    wait_for(lambda: _role(cluster, leader) != "leader", timeout=TTL + 5, what="the leader stepping down")
    assert time.monotonic() - killed <= TTL + 1
    time.sleep(0.5)
    for i in range(2):  # no split brain: neither core takes a session without etcd
        assert _login(cluster.address(i), Login("uid", f"after-{i}"), timeout=0.5) is None
        assert _role(cluster, i) != "leader"


def test_promote_makes_a_standby_the_active_core(tmp_path: Path) -> None:
    first = active(tmp_path / "a", "--fsync", "always")
    follower, metrics = standby(tmp_path / "s", first)
    try:
        gateway = Gateway(first.port)
        gateway.churn(20)
        wait_for(lambda: status(metrics)["standby"]["last_seq"] == 30, what="the standby catching up")
        gateway.close()
        first.proc.kill()
        first.proc.wait()
        done = subprocess.run(
            [sys.executable, "-m", "idled.cli.main", "promote", "--data-dir", str(tmp_path / "s" / "data"),
             "--metrics", f"127.0.0.1:{metrics}"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "promoted" in done.stdout
        assert status(metrics)["role"] == "active"
        sock = _login(("127.0.0.1", follower.port), Login("uid", "after-promotion"))
        assert sock is not None
        sock.close()
        # The promoted core ended what it found open (restart) and continued the seqs after its last record.
        wait_for(lambda: max(records(tmp_path / "s" / "data")) > 30, what="new records")
        assert min(seq for seq in records(tmp_path / "s" / "data") if seq > 30) == 31
    finally:
        follower.stop()
        first.stop()


def test_promote_refuses_a_directory_nobody_runs_on(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    done = subprocess.run([sys.executable, "-m", "idled.cli.main", "promote", "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == f"idled promote: no running idled holds {tmp_path / 'd'} (its lock is free or names no process)"
