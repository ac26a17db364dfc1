"""The operator's first five minutes against a real daemon: `idled user`, `watch`, `query`, `status`, the
health endpoints, the start-up line and the debug lines -- real subprocesses, real loopback sockets.

Timings use a 2 s timeout and a 0.5 s tick; lateness is asserted within [0, tick + 0.3 s] (the 0.3 s is slack
for a shared machine, not a property of the daemon).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import peers

TICK, TIMEOUT, SLACK = 0.5, 2.0, 0.3
IDLED = [sys.executable, "-m", "idled.cli.main"]
pytestmark = pytest.mark.slow


class LiveDaemon:
    """`idled serve` in a subprocess, with a metrics port; stderr in a file."""

    def __init__(self, tmp_path: Path, *extra: str, data_dir: Path | None = None) -> None:
        self.data_dir = data_dir or tmp_path / "data"
        self.metrics_port = peers.free_port()
        self.stderr_path = tmp_path / f"serve-{time.monotonic_ns()}.stderr"
        command = peers.serve_command(self.data_dir, "--metrics-port", str(self.metrics_port), "--tick", str(TICK),
                                      "--timeout", str(TIMEOUT), *extra)
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self.port = self._wait_listening()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def _wait_listening(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.stderr().splitlines():
                if line.startswith("IDLED_LISTENING"):
                    return int(line.rsplit("port=", 1)[1])
            assert self.proc.poll() is None, f"idled exited early:\n{self.stderr()}"
            time.sleep(0.02)
        raise AssertionError(f"idled did not listen within {timeout} s:\n{self.stderr()}")

    def client_flags(self) -> list[str]:
        return ["--port", str(self.port)]

    def get(self, path: str) -> tuple[int, str]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(20)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[LiveDaemon]:
    d = LiveDaemon(tmp_path, "--log-level", "debug")
    try:
        yield d
    finally:
        d.stop()


def idled(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IDLED, *args], capture_output=True, text=True, timeout=timeout)


def test_first_five_minutes_user_goes_idle_and_watch_sees_it(daemon: LiveDaemon) -> None:
    """serve -> `idled user alice --silent` -> `idled watch` shows alice online, then offline idle in time."""
    watch = subprocess.Popen([*IDLED, "watch", *daemon.client_flags(), "--from", "1", "--count", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = time.monotonic()
        user = idled("user", "alice", "--silent", *daemon.client_flags())
        elapsed = time.monotonic() - started
        assert user.returncode == 0, user.stderr
        assert "offline after 2 s of silence" in user.stdout
        assert "idle_timeout" in user.stdout
        assert TIMEOUT <= elapsed <= TIMEOUT + TICK + 5  # the session ended by the detector, not at once
        out, err = watch.communicate(timeout=20)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 0, err
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert "#1  alice  online  login" in lines[0]
    assert "#2  alice  offline  idle" in lines[1]
    lateness = float(lines[1].split("(")[1].split(" s after")[0])
    assert 0 <= lateness <= TICK + SLACK

    # The same events as JSON lines, replayed; then query and status see alice gone.
    as_json = idled("watch", *daemon.client_flags(), "--from", "1", "--count", "2", "--json")
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(r["seq"], r["kind"], r["reason"]) for r in records] == [(1, "online", "login"), (2, "offline", "idle")]
    assert 0 <= records[1]["ts"] - records[1]["deadline"] <= TICK + SLACK
    query = idled("query", "alice", "bob", *daemon.client_flags())
    assert query.returncode == 0 and query.stdout.splitlines() == ["alice offline", "bob offline"]

    # Debug lines: a login with the peer address, the online, the idle offline with its lateness.
    log = daemon.stderr()
    assert "login user 'alice' from 127.0.0.1:" in log
    assert "online 'alice': login (seq 1)" in log
    assert "offline 'alice': idle (seq 2, " in log


def test_user_online_query_status_and_ctrl_c_logs_out(daemon: LiveDaemon) -> None:
    user = subprocess.Popen([*IDLED, "user", "bob", "--keepalive", "1", "--ask-after", "0", *daemon.client_flags()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while idled("query", "bob", *daemon.client_flags()).stdout.strip() != "bob online":
            assert time.monotonic() < deadline and user.poll() is None, user.stderr.read() if user.stderr else ""
            time.sleep(0.1)
        time.sleep(2.5)  # longer than bob's timeout (1.5 s): only his pings keep him online
        assert idled("query", "bob", "--json", *daemon.client_flags()).stdout.strip() == '{"bob": true}'
        status = idled("status", "--metrics", f"127.0.0.1:{daemon.metrics_port}")
        assert status.returncode == 0, status.stderr
        assert "sessions online  1" in status.stdout
        assert "1 user," in status.stdout and ", ready" in status.stdout
        document = json.loads(idled("status", "--json", "--metrics", f"127.0.0.1:{daemon.metrics_port}").stdout)
        assert document["sessions_online"] == 1 and document["connections"]["user"] == 1
        assert document["version"] and document["next_seq"] == 2 and document["uptime_seconds"] > 0
        user.send_signal(2)  # Ctrl-C
        out, _ = user.communicate(timeout=20)
    finally:
        if user.poll() is None:
            user.kill()
    assert user.returncode == 0
    assert "ping" in out and "pong" in out and "quiet" not in out and "logged out (bye)" in out  # --ask-after 0
    replay = idled("watch", *daemon.client_flags(), "--from", "1", "--count", "2").stdout
    assert "bob  offline  logout" in replay


def test_user_devices_are_sessions_of_one_user(daemon: LiveDaemon) -> None:
    """`idled user alice --device D`: two devices at once are one user (one online, one offline, after the
    last); a bad device is a usage error before anything connects."""
    flags = daemon.client_flags()
    laptop = subprocess.Popen([*IDLED, "user", "alice", "--device", "laptop", "--silent", *flags],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # the laptop first: the phone's session outlives it
        phone = idled("user", "alice", "--device", "phone", "--silent", "--quiet", *flags)
        out, err = laptop.communicate(timeout=20)
    finally:
        if laptop.poll() is None:
            laptop.kill()
    assert laptop.returncode == 0 and phone.returncode == 0, (err, phone.stderr)
    assert "logged in as 'alice' (device 'phone')" in phone.stdout and "idle_timeout" in phone.stdout
    records = [json.loads(line) for line in
               idled("watch", *flags, "--from", "1", "--count", "2", "--json").stdout.splitlines()]
    assert [(r["kind"], r["reason"], r.get("device")) for r in records] == [
        ("online", "login", "laptop"), ("offline", "idle", "phone")]
    bad = idled("user", "alice", "--device", "", *flags)
    assert bad.returncode == 2 and "device" in bad.stderr


def test_health_endpoints_and_readyz_turns_503_when_the_log_is_unwritable(tmp_path: Path) -> None:
    """chattr +i on the data directory: even root can no longer create a file in it (the open segment keeps
    taking writes, so the daemon itself carries on; readiness is what must notice)."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("chattr (e2fsprogs) is not installed: no way to make the data dir unwritable for root")
    d = LiveDaemon(tmp_path)
    immutable = False
    try:
        assert d.get("/healthz") == (200, "ok\n")
        assert d.get("/readyz") == (200, "ready\n")
        assert d.get("/nope")[0] == 404
        made = subprocess.run([chattr, "+i", str(d.data_dir)], capture_output=True, text=True)
        if made.returncode:
            pytest.skip(f"chattr +i failed on this file system: {made.stderr.strip()}")
        immutable = True
        deadline = time.monotonic() + 10
        while (answer := d.get("/readyz"))[0] == 200:  # the probe's result is cached for up to a second
            assert time.monotonic() < deadline, "still ready on an unwritable data dir"
            time.sleep(0.2)
        status, body = answer
        assert status == 503 and "not writable" in body and "Operation not permitted" in body, answer
        assert d.get("/healthz")[0] == 200  # alive, just not ready
        document = json.loads(d.get("/status")[1])
        assert document["ready"] is False and "not writable" in document["ready_reason"]
        subprocess.run([chattr, "-i", str(d.data_dir)], check=True)
        immutable = False
        deadline = time.monotonic() + 10
        while d.get("/readyz")[0] != 200:
            assert time.monotonic() < deadline, "not ready again once writable"
            time.sleep(0.2)
    finally:
        if immutable:
            subprocess.run([chattr, "-i", str(d.data_dir)], capture_output=True)
        assert d.stop() == 0, d.stderr()


def test_rejected_garbage_and_http_get_are_logged_with_the_peer(daemon: LiveDaemon) -> None:
    for payload in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00\x00\x00\x03abc"):
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
            sock.sendall(payload)
            sock.settimeout(5)
            while sock.recv(4096):
                pass
    deadline = time.monotonic() + 10
    while daemon.stderr().count("reject ") < 2:
        assert time.monotonic() < deadline, daemon.stderr()
        time.sleep(0.05)
    rejects = [line for line in daemon.stderr().splitlines() if "reject " in line]
    assert all(" from 127.0.0.1:" in line for line in rejects), rejects


def test_start_up_line_names_the_effective_configuration(daemon: LiveDaemon) -> None:
    line = next(line for line in daemon.stderr().splitlines() if "idled.server: idled " in line)
    for part in ("listen 127.0.0.1:", f"data dir {daemon.data_dir}", "detector ring-lazy", "timeout 2s",
                 "tick 0.5s", "auth off", "fsync interval", "connections"):
        assert part in line, (part, line)


def test_events_prints_readable_lines_on_a_terminal_and_json_when_piped(daemon: LiveDaemon) -> None:
    assert idled("user", "carol", "--silent", *daemon.client_flags()).returncode == 0
    daemon.stop()
    piped = idled("events", "--data-dir", str(daemon.data_dir))
    assert [json.loads(line)["kind"] for line in piped.stdout.splitlines()] == ["online", "offline"]
    script = shutil.which("script")
    if script is None:
        pytest.skip("util-linux `script` (to give the command a terminal) is not installed")
    command = " ".join([*IDLED, "events", "--data-dir", str(daemon.data_dir)])
    tty = subprocess.run([script, "-qec", command, "/dev/null"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    lines = [line.strip() for line in tty.stdout.splitlines() if line.strip()]
    assert len(lines) == 2 and "#1  carol  online  login" in lines[0] and "carol  offline  idle" in lines[1], tty
    forced = subprocess.run([script, "-qec", command + " --json", "/dev/null"], capture_output=True, text=True,
                            timeout=30)
    assert json.loads(forced.stdout.splitlines()[0])["uid"] == "carol"
