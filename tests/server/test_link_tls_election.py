"""An elected pair with TLS on both cores (issue 33, item 6): the follower reaches the leader over TLS, a failover
hands over, and the old leader comes back following the new one over TLS. A real etcd and two `idled serve
--election` cores on 127.0.0.2 and 127.0.0.3, certified for the name ``localhost`` (``link_server_name``: cores
reached by IP, certified by name). And the static refusal of a core that serves TLS but would follow without."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.protocol import Attach, Login, encode
from idled.tools.bench.failover import Cluster
from idled.tools.etcd import ETCD
from tests.server.ha.standby_support import wait_for
from tests.tlscerts import Certs

pytestmark = pytest.mark.slow

TTL = 2


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return Certs(tmp_path / "certs")


@pytest.fixture
def cluster(tmp_path: Path, certs: Certs) -> Iterator[Cluster]:
    if ETCD is None:
        pytest.skip("etcd not on PATH (Debian: apt-get install etcd-server; see .ci/system-deps)")
    cert, key = certs.server()  # names localhost and 127.0.0.1, not the cores' 127.0.0.2/3
    cluster = Cluster(tmp_path, TTL, ["--tick", "0.1", "--tls-cert", str(cert), "--tls-key", str(key),
                                      "--link-tls", "--link-ca", str(certs.ca), "--link-server-name", "localhost"])
    try:
        yield cluster
    finally:
        cluster.close()


def follower_part(cluster: Cluster, i: int) -> dict:
    doc = cluster.status(i) or {}
    return dict(doc.get("standby") or {})


def make_events(cluster: Cluster, leader: int, certs: Certs, users: int) -> None:
    """Attach ``users`` uids on the leader through a TLS gateway (auth is off: loopback)."""
    raw = socket.create_connection(cluster.address(leader), timeout=10)
    with certs.client_context().wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(encode(Login("gateway", "gw")) + encode(Attach(tuple(f"u{i}" for i in range(users)), 600.0)))
        sock.recv(4096)  # the welcome: the attach was read after it


def test_an_elected_pair_with_tls_on_both_follows_and_fails_over_over_tls(cluster: Cluster, certs: Certs) -> None:
    cluster.start(0)
    cluster.start(1)
    leader = cluster.settled()  # one leads, the other streams from it (over TLS: nothing else gets through)
    follower = 1 - leader
    assert follower_part(cluster, follower)["tls"] is True
    make_events(cluster, leader, certs, 50)
    wait_for(lambda: follower_part(cluster, follower)["last_seq"] >= 50, what="the follower to copy the events")
    cluster.kill(leader)
    wait_for(lambda: (cluster.status(follower) or {}).get("role") == "leader", timeout=TTL + 15,
             what="the follower to take over")
    cluster.start(leader)  # back as a follower of the new leader, over TLS
    assert cluster.settled() == follower
    part = follower_part(cluster, leader)
    assert part["tls"] is True and part["state"] == "streaming" and part["last_seq"] >= 50
    for node in cluster.nodes:
        assert node is not None and "fatal" not in node.stderr()


def test_an_elected_core_that_serves_tls_without_link_tls_is_refused_before_it_starts(
        tmp_path: Path, certs: Certs) -> None:
    """Both cores of an election run one configuration: one that serves TLS would follow a TLS leader in plain
    text. Refused statically, by check-config and serve alike, before etcd is even asked."""
    cert, key = certs.server()
    flags = ["--election", "etcd://127.0.0.1:1/idled", "--advertise", "127.0.0.1:7878", "--data-dir",
             str(tmp_path / "data"), "--tls-cert", str(cert), "--tls-key", str(key), "--metrics-port", "0"]
    for command in ("check-config", "serve"):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "idled.cli.main", command, *flags], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert ("configuration: an elected core that serves TLS (tls_cert) follows its leader over TLS: give "
                "link_tls") in done.stderr, done.stderr
        assert time.monotonic() - started < 20
    ok = subprocess.run([sys.executable, "-m", "idled.cli.main", "check-config", *flags, "--link-tls", "--link-ca",
                         str(certs.ca)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
