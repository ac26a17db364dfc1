"""idled.ops.systemd against real sockets and real subprocesses (no systemd needed)."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.ops import systemd
from idled.ops.systemd import READY, STOPPING, WATCHDOG, Notifier, SystemdError, notify, status

# --- sd_notify ---------------------------------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A unix datagram socket bound in tmp_path, as systemd's notify socket would be."""
    path = tmp_path / "notify"
    if len(os.fsencode(path)) >= 108:  # sun_path limit; pytest's tmp paths are normally far shorter
        pytest.skip(f"tmp_path too long for a unix socket: {path}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)  # a lost datagram fails the test instead of hanging it
    yield sock, str(path)
    sock.close()


def test_notify_messages_arrive_in_order(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    env = {"NOTIFY_SOCKET": path}
    sent = [READY, status("serving 3 connections"), WATCHDOG, STOPPING]
    assert [notify(message, env=env) for message in sent] == [True] * 4
    received = [sock.recv(4096).decode() for _ in sent]
    assert received == ["READY=1", "STATUS=serving 3 connections", "WATCHDOG=1", "STOPPING=1"]


def test_notify_abstract_namespace() -> None:
    name = f"idled-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify(READY + "\n" + status("up"), env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_notifier_reuses_one_socket(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    with Notifier({"NOTIFY_SOCKET": path}) as notifier:
        assert notifier.enabled
        for _ in range(3):
            assert notifier.send(WATCHDOG)
        assert [sock.recv(64) for _ in range(3)] == [b"WATCHDOG=1"] * 3
    assert not notifier.send(WATCHDOG)  # closed: reports, does not raise


def test_notify_without_socket_returns_false() -> None:
    assert notify(READY, env={}) is False
    assert notify(READY, env={"NOTIFY_SOCKET": ""}) is False
    assert notify(READY, env={"NOTIFY_SOCKET": "relative/path"}) is False
    assert Notifier({}).enabled is False


def test_notify_to_vanished_socket_returns_false(tmp_path: Path) -> None:
    path = tmp_path / "gone"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.close()  # the file stays, nobody listens: ECONNREFUSED
    assert notify(READY, env={"NOTIFY_SOCKET": str(path)}) is False
    path.unlink()  # and now ENOENT
    assert notify(READY, env={"NOTIFY_SOCKET": str(path)}) is False


def test_notify_when_receiver_queue_is_full_does_not_block(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    with Notifier({"NOTIFY_SOCKET": path}) as notifier:
        # Nobody reads: the receive queue fills; a blocking send would hang here forever.
        results = [notifier.send(status("x" * 1000)) for _ in range(10_000)]
    assert results[0] is True
    assert results[-1] is False


def test_status_and_mainpid_are_single_assignments() -> None:
    assert status("two\nlines") == "STATUS=two lines"
    assert systemd.mainpid(42) == "MAINPID=42"
    assert systemd.extend_timeout(2.5) == "EXTEND_TIMEOUT_USEC=2500000"


# --- watchdog ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "500000"}, 0.25),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert systemd.watchdog_interval(env) == expected


# --- socket activation -------------------------------------------------------------------------

# Plays systemd's part: move the inherited fd to 3 and exec the real program with LISTEN_* set for
# its pid (exec keeps the pid, exactly as systemd's fork + setenv + exec does).
SHIM = r"""
import os, sys
fd, fdnames, program = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if fd != 3:
    os.dup2(fd, 3)  # the copy at 3 is inheritable
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
if fdnames:
    os.environ["LISTEN_FDNAMES"] = fdnames
os.execv(sys.executable, [sys.executable, "-c", program])
"""

# The daemon's side: adopt, report what it got, serve one connection.
ADOPTER = r"""
import json, os, socket
from idled.ops import systemd
try:
    named = systemd.listen_fds_with_names()
except systemd.SystemdError as exc:
    print(json.dumps({"error": exc.code}), flush=True)
    raise SystemExit(0)
report = {
    "names": [name for name, _ in named],
    "fds": [sock.fileno() for _, sock in named],
    "inheritable": [os.get_inheritable(sock.fileno()) for _, sock in named],
    "family": [int(sock.family) for _, sock in named],
    "type": [int(sock.type) for _, sock in named],
    "port": [sock.getsockname()[1] for _, sock in named],
    "env_left": sorted(k for k in os.environ if k.startswith("LISTEN_")),
}
print(json.dumps(report), flush=True)
conn, _ = named[0][1].accept()
conn.sendall(b"adopted by %d" % os.getpid())
conn.close()
"""


def _spawn_activated(fd: int, fdnames: str = "idled") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", SHIM, str(fd), fdnames, ADOPTER],
        pass_fds=(fd,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_listen_fds_adopts_a_listening_socket_in_a_real_child() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    child = _spawn_activated(listener.fileno())
    listener.close()  # from now on only the child holds the socket
    try:
        assert child.stdout is not None
        report = json.loads(child.stdout.readline())
        assert report == {
            "names": ["idled"],
            "fds": [3],
            "inheritable": [False],  # close-on-exec set
            "family": [int(socket.AF_INET)],
            "type": [int(socket.SOCK_STREAM)],
            "port": [port],
            "env_left": [],  # LISTEN_* unset
        }
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            reply = client.recv(100)
        assert reply == b"adopted by %d" % child.pid
        assert child.wait(timeout=10) == 0
    finally:
        child.kill()
        child.wait()


def test_listen_fds_without_names_reports_unknown() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    child = _spawn_activated(listener.fileno(), fdnames="")
    listener.close()
    try:
        assert child.stdout is not None
        assert json.loads(child.stdout.readline())["names"] == ["unknown"]
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
        assert child.wait(timeout=10) == 0
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("kind", ["pipe", "connected"])
def test_listen_fds_rejects_what_is_not_a_listening_socket(kind: str) -> None:
    if kind == "pipe":
        keep, passed = os.pipe()
        expected = "not-a-socket"
    else:
        a, b = socket.socketpair()
        keep, passed = a.detach(), b.detach()
        expected = "not-listening"
    try:
        child = _spawn_activated(passed)
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err.decode()
        assert json.loads(out) == {"error": expected}
    finally:
        os.close(keep)
        os.close(passed)


def test_listen_fds_for_another_pid_adopts_nothing_and_unsets() -> None:
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "idled", "OTHER": "x"}
    assert systemd.listen_fds(env) == []
    assert env == {"OTHER": "x"}


def test_listen_fds_keeps_variables_when_asked() -> None:
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}
    assert systemd.listen_fds(env, unset=False) == []
    assert env == {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}


def test_listen_fds_nothing_passed() -> None:
    assert systemd.listen_fds({}) == []
    assert systemd.listen_fds({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"}) == []


@pytest.mark.parametrize(
    "env",
    [
        {"LISTEN_PID": "self", "LISTEN_FDS": "1"},
        {"LISTEN_PID": "{pid}", "LISTEN_FDS": "many"},
        {"LISTEN_PID": "{pid}", "LISTEN_FDS": "-1"},
        {"LISTEN_PID": "{pid}", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "only-one"},
    ],
)
def test_listen_fds_malformed_environment_is_a_typed_error(env: dict[str, str]) -> None:
    env = {key: value.replace("{pid}", str(os.getpid())) for key, value in env.items()}
    with pytest.raises(SystemdError) as info:
        systemd.listen_fds(env)
    assert info.value.code == "bad-listen-env"
    assert not any(key.startswith("LISTEN_") for key in env)  # unset even on error


# --- RLIMIT_NOFILE -----------------------------------------------------------------------------


def test_raise_nofile_limit_in_a_child_started_with_a_low_soft_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2:
        pytest.skip(f"hard RLIMIT_NOFILE is {hard}")
    low = min(256, hard - 1)
    program = (
        "import json, resource; from idled.ops import systemd\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({low}, {hard}))\n"
        "before = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "returned = systemd.raise_nofile_limit()\n"
        "print(json.dumps([before, returned, resource.getrlimit(resource.RLIMIT_NOFILE)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, check=True, timeout=30).stdout
    before, returned, after = json.loads(out)
    assert before == [low, hard]
    expected = hard if hard != resource.RLIM_INFINITY else after[0]
    assert returned == [expected, hard] == after


def test_raise_nofile_limit_is_idempotent() -> None:
    first = systemd.raise_nofile_limit()
    assert systemd.raise_nofile_limit() == first == resource.getrlimit(resource.RLIMIT_NOFILE)
