"""CLI tools given several cores (``--core A,B``) follow a failover, through one code path
(`idled.cli.follow`): real daemons, real subprocesses, real SIGKILL.

* Two elected cores (a real etcd, ``idled serve --election``): `idled watch --core A,B` and `idled user --core
  A,B` run across a SIGKILL of the leader -- the watch keeps printing events (those of the new leader), the
  user is logged in again on it.
* Two plain cores, both killed: the watch follows to the second, then gives up ``--failover-timeout`` seconds
  after losing it, with one line and exit status 1 -- not a hang.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idled.protocol import Login
from idled.tools.bench.daemon import Daemon
from idled.tools.bench.daemon import free_port as peers_free_port
from idled.tools.bench.failover import Cluster, probe
from idled.tools.bench.gatewayload import login
from idled.tools.etcd import ETCD

pytestmark = pytest.mark.slow

IDLED = [sys.executable, "-m", "idled.cli.main"]
TTL = 2


class Tool:
    """An idled command in a subprocess, its stdout and stderr lines collected by threads."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*IDLED, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, lines), daemon=True).start()

    def _read(self, stream: Any, lines: list[str]) -> None:
        for line in stream:
            with self._changed:
                lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                assert left > 0 and self.proc.poll() is None or predicate(), (
                    f"{what}: not within {timeout} s (exit {self.proc.poll()}); out {self.out}; err {self.err}")
                self._changed.wait(min(left, 0.2) if left > 0 else 0.2)

    def events(self) -> list[dict[str, Any]]:
        with self._changed:
            return [json.loads(line) for line in self.out if line.startswith("{")]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def tools() -> Iterator[Callable[..., Tool]]:
    started: list[Tool] = []

    def start(*args: str) -> Tool:
        started.append(tool := Tool(*args))
        return tool

    try:
        yield start
    finally:
        for tool in started:
            tool.close()


def _online(tool: Tool, uid: str, since_seq: int = 0) -> bool:
    return any(e["kind"] == "online" and e["uid"] == uid and e["seq"] > since_seq for e in tool.events())


@pytest.mark.skipif(ETCD is None, reason="etcd not on PATH (.ci/system-deps)")
def test_watch_and_user_follow_the_leader_across_a_sigkill(tmp_path: Path, tools: Callable[..., Tool]) -> None:
    cluster = Cluster(tmp_path, TTL, ["--tick", "0.1"])
    try:
        cluster.start(0)
        cluster.start(1)
        leader = cluster.settled()
        # The leader first: the watch subscribes there (a follower would serve it too).
        cores = ",".join(f"{host}:{port}" for host, port in (cluster.address(leader), cluster.address(1 - leader)))
        watch = tools("watch", "--core", cores, "--json", "--failover-timeout", "20")
        watch.wait_for(lambda: any("watching" in line for line in watch.err), 10, "the watch to start")
        user = tools("user", "carol", "--core", cores, "--keepalive", "1", "--quiet", "--failover-timeout", "20")
        watch.wait_for(lambda: _online(watch, "carol"), 10, "carol online on the leader")
        before = max(e["seq"] for e in watch.events())

        started = time.monotonic()
        cluster.kill(leader)
        assert probe(cluster.address(1 - leader), started, limit=TTL + 10) is not None, "no new leader"
        sock = login(cluster.address(1 - leader), Login("uid", "dave"))  # an event only the new leader has
        assert sock is not None
        try:
            watch.wait_for(lambda: _online(watch, "dave"), 15, "the watch to print the new leader's events")
            # The user's session was logged in again on the new leader (the old one's ended `restart` there).
            watch.wait_for(lambda: _online(watch, "carol", since_seq=before), 15, "carol back online")
        finally:
            sock.close()
        assert watch.proc.poll() is None and user.proc.poll() is None
        new = f"{cluster.address(1 - leader)[0]}:{cluster.address(1 - leader)[1]}"
        assert any("lost the core at" in line for line in watch.err), watch.err
        # stderr is read by its own thread: under load it may lag the stdout that showed the events.
        watch.wait_for(lambda: any(f"now on {new}" in line for line in watch.err), 5, "the watch to say where it is")
        user.wait_for(lambda: any(f"now on {new}" in line for line in user.err), 5, "the user to say where it is")
        assert not any("lost the daemon" in line for line in watch.err + user.err)
    finally:
        cluster.close()


def _plain(directory: Path) -> Daemon:
    directory.mkdir()
    return Daemon(directory, "--tick", "0.1", "--metrics-port", "0")


def _sigkill(daemon: Daemon) -> None:
    daemon.proc.kill()
    daemon.proc.wait(10)


def test_the_watch_gives_up_when_no_core_is_left(tmp_path: Path, tools: Callable[..., Tool]) -> None:
    a, b = _plain(tmp_path / "a"), _plain(tmp_path / "b")
    try:
        watch = tools("watch", "--core", f"127.0.0.1:{a.port},127.0.0.1:{b.port}", "--failover-timeout", "2")
        watch.wait_for(lambda: any("watching" in line for line in watch.err), 10, "the watch to start")
        _sigkill(a)
        watch.wait_for(lambda: any(f"now on 127.0.0.1:{b.port}" in line for line in watch.err), 10, "following to b")
        _sigkill(b)
        lost = time.monotonic()
        assert watch.proc.wait(15) == 1
        took = time.monotonic() - lost
    finally:
        a.stop()
        b.stop()
    assert 2 <= took < 2 + 5, took  # the timeout, plus at most one backoff
    assert watch.err[-1].startswith("idled watch: lost the daemon: no core took the login within 2 s"), watch.err


def test_a_standby_behind_the_seq_to_resume_from_sends_the_watch_on(tmp_path: Path, tools: Callable[..., Tool]) -> None:
    """A standby whose copy has not reached ``--from`` answers ``unavailable`` (retryable), not ``bad_message``:
    the watch tries the next core at once instead of exiting."""
    active = _plain(tmp_path / "active")
    (tmp_path / "standby").mkdir()
    cut_off = Daemon(tmp_path / "standby", "--standby-of", f"127.0.0.1:{peers_free_port()}", "--metrics-port", "0")
    users = [login(("127.0.0.1", active.port), Login("uid", f"u{i}")) for i in range(4)]
    try:
        watch = tools("watch", "--core", f"127.0.0.1:{cut_off.port},127.0.0.1:{active.port}", "--from", "3",
                      "--json", "--count", "2")
        assert watch.proc.wait(20) == 0, watch.err
        assert [(e["seq"], e["uid"]) for e in watch.events()] == [(3, "u2"), (4, "u3")]
    finally:
        for sock in users:
            if sock is not None:
                sock.close()
        active.stop()
        cut_off.stop()
