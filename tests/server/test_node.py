"""Failover with real parts: a real etcd, two `idled serve --election` cores on 127.0.0.2 and 127.0.0.3 (two
"machines"), SIGKILL, SIGSTOP, etcd killed; and `idled promote` of a standby run without an election."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.protocol import Login, encode
from idled.protocol.codec import PING_FRAME, PONG_FRAME
from idled.tools.bench.daemon import Daemon
from idled.tools.bench.failover import Cluster, DurableObserver, history, probe
from idled.tools.bench.gatewayload import GatewayLoad, login
from idled.tools.etcd import ETCD
from tests.peers import free_port
from tests.server.ha.standby_support import Gateway, active, records, standby, status, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ETCD is None, reason="etcd not on PATH (.ci/system-deps)")]

TTL = 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, TTL, ["--tick", "0.1", "--sync-standby"])
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
    gateway, observer = GatewayLoad(cluster.connect_gateway, 500.0), DurableObserver(cluster)
    observer.target = leader
    gateway.start()
    observer.start()
    try:
        wait_for(lambda: observer.last > 200, what="durable events on the leader")
        started = time.monotonic()
        cluster.kill(leader)
        took = probe(cluster.address(1 - leader), started, limit=TTL + 10)
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
    events = history(cluster.address(1 - leader), observer.last)
    final = {event.seq: (event.kind, event.uid, event.ts, event.reason) for event in events}
    seqs = [event.seq for event in events]
    assert seqs == sorted(set(seqs)), "seqs must be strictly increasing"
    lost = [seq for seq, content in observer.seen.items() if final.get(seq) != content]
    assert not lost, f"{len(lost)} durable events lost, first {lost[:5]}"
    # The new leader began past the old leader's reserved block and ended what it found open as `restart`.
    assert any(event.reason == "restart" for event in events)
    # Both data directories hold the same records now (the old leader followed and caught up).
    cluster.settled()
    wait_for(lambda: records(cluster.base / f"data{leader}") == records(cluster.base / f"data{1 - leader}"),
             what="identical logs")


def test_users_through_an_edge_stay_connected_through_a_failover(cluster: Cluster) -> None:
    leader = _started(cluster)
    cores = ",".join(f"{host}:{port}" for host, port in map(cluster.address, range(2)))
    edge = Daemon(cluster.base, timeout=30, command=[
        sys.executable, "-m", "idled.cli.main", "edge", "--core", cores, "--port", "0", "--log-level", "info"])
    try:
        users = [login(("127.0.0.1", edge.port), Login("uid", f"u{i}", keepalive=30.0)) for i in range(20)]
        assert all(user is not None for user in users)
        wait_for(lambda: len(records(cluster.base / f"data{1 - leader}")) >= 20, what="the onlines replicated")
        started = time.monotonic()
        cluster.kill(leader)
        assert probe(cluster.address(1 - leader), started, limit=TTL + 10) is not None
        wait_for(lambda: "edge: core is now" in edge.stderr(), timeout=20, what="the edge to switch cores")
        for user in users:  # still connected: a pong, no error frame
            assert user is not None
            user.settimeout(5)
            user.sendall(PING_FRAME)
            assert user.recv(64) == PONG_FRAME
        # The new leader's record: each user's session ended `restart` (nobody watched it during the gap),
        # then online again as the edge re-attached it.
        def reattached() -> bool:
            kinds: dict[str, list[str]] = {}
            for event in history(cluster.address(1 - leader), 1):
                kinds.setdefault(str(event.uid), []).append("restart" if event.reason == "restart" else event.kind)
            return all(kinds.get(f"u{i}", [])[-2:] == ["restart", "online"] for i in range(20))

        wait_for(reattached, timeout=20, what="every user re-attached on the new leader")
        for user in users:
            assert user is not None
            user.close()
    finally:
        edge.stop()


def test_a_frozen_leader_writes_nothing_when_it_wakes(cluster: Cluster) -> None:
    leader = _started(cluster)
    gateway = Gateway(cluster.port, host=cluster.address(leader)[0])
    gateway.churn(40)
    data = cluster.base / f"data{leader}"
    wait_for(lambda: len(records(data)) >= 60, what="the leader's records")  # 40 online + 20 offline
    node = cluster.nodes[leader]
    assert node is not None
    os.kill(node.proc.pid, signal.SIGSTOP)
    try:
        frozen_log = records(data)
        gateway.churn(40)  # queued in the frozen leader's socket: work it finds when it wakes
        assert probe(cluster.address(1 - leader), time.monotonic(), limit=TTL + 10) is not None
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)
    # Woken past its lease: it must not write one more record of its own; it follows the new leader.
    wait_for(lambda: _role(cluster, leader) == "standby", what="the woken leader following")
    gateway.close()
    new_log = records(cluster.base / f"data{1 - leader}")
    for directory in [data, *data.glob("aside-*")]:  # its log, and any it moved aside to re-sync
        mine = records(directory)
        written_after_waking = [seq for seq in mine if seq not in frozen_log and mine[seq] != new_log.get(seq)]
        assert not written_after_waking, f"the fenced leader wrote {written_after_waking[:5]} in {directory}"


def test_with_etcd_gone_the_leader_steps_down_by_its_deadline_and_nobody_leads(cluster: Cluster) -> None:
    leader = _started(cluster)
    address = cluster.address(leader)
    sock = login(address, Login("uid", "before"))
    assert sock is not None
    sock.close()
    killed = time.monotonic()
    cluster.etcd.kill()
    wait_for(lambda: _role(cluster, leader) != "leader", timeout=TTL + 5, what="the leader stepping down")
    assert time.monotonic() - killed <= TTL + 1
    time.sleep(0.5)
    for i in range(2):  # no split brain: neither core takes a session without etcd
        assert login(cluster.address(i), Login("uid", f"after-{i}"), timeout=0.5) is None
        assert _role(cluster, i) != "leader"


class LinkProxy:
    """A TCP relay from a port of its own to ``target``; ``cut()`` drops every connection and refuses new ones
    (a network partition between one core and etcd), ``heal()`` accepts again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = threading.Event()
        self.open.set()
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.open.clear()
        with self.lock:
            for sock in self.conns:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns.clear()

    def heal(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_a_leader_cut_off_from_etcd_steps_down_before_the_other_core_leads(cluster: Cluster) -> None:
    proxy = LinkProxy(("127.0.0.1", cluster.etcd.client_port))
    try:
        cluster.start(0, election_url=f"etcd://127.0.0.1:{proxy.port}/bench")
        wait_for(lambda: _role(cluster, 0) == "leader", what="core 0 leading")
        cluster.start(1)
        assert cluster.settled() == 0
        leaders: list[tuple[float, int]] = []  # (time, core) of every look that found a core leading
        proxy.cut()
        cut = time.monotonic()
        while time.monotonic() - cut < TTL + 3:
            for i in range(2):
                if _role(cluster, i) == "leader":
                    leaders.append((time.monotonic() - cut, i))
            time.sleep(0.02)
        old = [t for t, i in leaders if i == 0]
        new = [t for t, i in leaders if i == 1]
        assert new, "the core that still reaches etcd never led"
        assert not old or max(old) < min(new), f"both led: core 0 until {max(old):.2f} s, core 1 from {min(new):.2f} s"
        assert max(old, default=0.0) <= TTL, "the cut-off leader held on past its lease"
        proxy.heal()  # core 0 reaches etcd again: it follows the new leader
        wait_for(lambda: _role(cluster, 0) == "standby", timeout=TTL + 10, what="core 0 following")
    finally:
        proxy.close()


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
        sock = login(("127.0.0.1", follower.port), Login("uid", "after-promotion"))
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


def test_a_node_talks_to_systemd_once_for_the_process_across_a_role_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = active(tmp_path / "a", "--fsync", "always")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(0.2)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # a ping every 0.2 s
    follower, metrics = standby(tmp_path / "s", first)
    monkeypatch.delenv("NOTIFY_SOCKET")
    monkeypatch.delenv("WATCHDOG_USEC")
    messages: list[str] = []

    def drain(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            try:
                messages.extend(notify.recv(4096).decode().splitlines())
            except TimeoutError:
                pass

    try:
        first.stop()
        os.kill(follower.proc.pid, signal.SIGUSR1)  # what idled promote sends
        wait_for(lambda: status(metrics)["role"] == "active", what="the promotion")
        drain(1.0)
        assert "STOPPING=1" not in messages, "a role change looked like a stop to the manager"
        follower.stop()
        drain(0.5)
    finally:
        follower.stop()
        first.stop()
        notify.close()
    assert messages.count("READY=1") == 1
    assert messages.count("WATCHDOG=1") >= 3
    assert any(m.startswith("STATUS=standby of") for m in messages) and "STATUS=leader (promoted by hand)" in messages
    assert messages.index("STOPPING=1") > messages.index("STATUS=leader (promoted by hand)")


# systemd's part: the listening socket at fd 3 and LISTEN_* for the exec'd daemon's pid.
ACTIVATE = r"""
import os, sys
os.dup2(int(sys.argv[1]), 3)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
os.execv(sys.executable, [sys.executable, "-m", "idled.cli.main", *sys.argv[2:]])
"""


def test_a_socket_activated_node_keeps_its_socket_across_a_promotion(tmp_path: Path) -> None:
    first = active(tmp_path / "a", "--fsync", "always")
    listener = socket.create_server(("127.0.0.1", 0))
    port, metrics = listener.getsockname()[1], free_port()
    (tmp_path / "s").mkdir()
    with open(tmp_path / "s.err", "wb") as err:
        node = subprocess.Popen(
            [sys.executable, "-c", ACTIVATE, str(listener.fileno()), "serve", "--data-dir", str(tmp_path / "s"),
             "--standby-of", f"127.0.0.1:{first.port}", "--metrics-port", str(metrics)],
            pass_fds=[listener.fileno()], stderr=err)
    listener.close()  # only the daemon holds it now
    try:
        wait_for(lambda: status(metrics)["role"] == "standby", what="the standby")
        refused = socket.create_connection(("127.0.0.1", port))  # the passed socket: a standby refuses users
        refused.sendall(encode(Login("uid", "early")))
        assert b"not_leader" in refused.recv(4096)
        refused.close()
        first.stop()
        node.send_signal(signal.SIGUSR1)
        wait_for(lambda: status(metrics)["role"] == "active", what="the promotion")
        sock = login(("127.0.0.1", port), Login("uid", "after"))  # the same socket, never re-bound
        assert sock is not None
        sock.close()
    finally:
        node.terminate()
        assert node.wait(timeout=20) == 0
        first.stop()
