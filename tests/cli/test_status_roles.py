"""`idled status` on every process of a cluster says what it is: its role, its leader, its replication state and
lag -- two elected cores (a real etcd) and an edge in front of them, real processes, a real SIGKILL.

* The leader: ``role leader``, itself as the leader, its standby and how far behind it is.
* The follower: ``role standby``, the leader it follows, the link's state and lag; no line for what a standby
  does not have (no ``None``).
* After the leader is killed, the promoted core's ``up`` counts from its process start, not from the role
  change (the role's own time is beside it).
* An edge's metrics port: its own status (role edge, the core it is on, its link), not "an idled older than
  /status?".
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from idled.tools.bench.daemon import Daemon, free_port
from idled.tools.bench.failover import Cluster, probe
from idled.tools.etcd import ETCD

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ETCD is None, reason="etcd not on PATH (.ci/system-deps)")]

IDLED = [sys.executable, "-m", "idled.cli.main"]
TTL = 2


def status(metrics_port: int, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IDLED, "status", "--metrics", f"127.0.0.1:{metrics_port}", *flags],
                          capture_output=True, text=True, timeout=30)


def lines_of(metrics_port: int) -> dict[str, str]:
    """The text status as {label: rest of the line} (the label: the first 17 columns)."""
    done = status(metrics_port)
    assert done.returncode == 0, done.stderr
    assert "None" not in done.stdout, done.stdout
    return {line[:17].strip(): line[17:] for line in done.stdout.splitlines()[1:]} | {"": done.stdout.splitlines()[0]}


def document(metrics_port: int) -> dict[str, Any]:
    done = status(metrics_port, "--json")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_every_process_of_a_cluster_says_its_role_leader_and_lag(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, TTL, ["--tick", "0.1"])
    edge: Daemon | None = None
    try:
        started = [time.monotonic(), 0.0]
        cluster.start(0)
        started[1] = time.monotonic()
        cluster.start(1)
        leader = cluster.settled()
        follower = 1 - leader
        addresses = [f"{host}:{port}" for host, port in map(cluster.address, range(2))]

        mine = lines_of(cluster.metrics[leader])
        assert mine["role"].startswith("leader for "), mine
        assert mine["leader"] == f"{addresses[leader]} (this core)", mine
        assert mine["replication"].startswith("1 standby: ") and "0 behind" in mine["replication"], mine

        theirs = lines_of(cluster.metrics[follower])
        assert theirs["role"].startswith("standby for "), theirs
        assert theirs["leader"] == addresses[leader], theirs
        assert theirs["replication"].startswith("streaming from "), theirs
        assert "0 records behind" in theirs["replication"], theirs
        assert "sessions online" not in theirs and "detector keys" not in theirs

        metrics_port = free_port()
        edge = Daemon(tmp_path, timeout=30, command=[*IDLED, "edge", "--core", ",".join(addresses), "--port", "0",
                                                     "--metrics-port", str(metrics_port)])
        at_edge = lines_of(metrics_port)
        assert at_edge["role"].startswith("edge "), at_edge
        assert at_edge["leader"].startswith(f"{addresses[leader]} (core link up"), at_edge

        time.sleep(1.0)  # so that the role's time and the process's differ by more than rounding
        killed = time.monotonic()
        cluster.kill(leader)
        assert probe(cluster.address(follower), killed, limit=TTL + 10) is not None
        deadline = time.monotonic() + 15
        while (doc := document(cluster.metrics[follower])).get("role") != "leader":
            assert time.monotonic() < deadline, doc
            time.sleep(0.1)
        promoted = lines_of(cluster.metrics[follower])
        assert promoted["role"].startswith("leader for "), promoted
        alive = time.monotonic() - started[follower]
        assert alive - 2.0 <= doc["uptime_seconds"] <= alive + 0.5, (doc["uptime_seconds"], alive)
        assert doc["role_seconds"] <= time.monotonic() - killed < doc["uptime_seconds"], doc
        deadline = time.monotonic() + 15
        while not lines_of(metrics_port)["leader"].startswith(f"{addresses[follower]} (core link up"):
            assert time.monotonic() < deadline, lines_of(metrics_port)
            time.sleep(0.1)
    finally:
        if edge is not None:
            edge.stop()
        cluster.close()
