"""The accept loop out of descriptors, for real: a subprocess squeezes its own RLIMIT_NOFILE to a few free
descriptors and runs `idled.door.accept.accept_loop` on a real listening socket; this test connects more
clients than fit. The descriptor budget normally keeps a daemon from getting here (tests/faults/
test_descriptors.py); this is what happens when something else ate the reserve anyway.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time

import msgpack
import pytest

from idled.door.addresses import is_local

pytestmark = pytest.mark.slow

FREE = 4  # descriptors left free after the squeeze: the spare, and three connections

# Runs accept_loop with every descriptor but FREE in use; a served connection gets b"served" and is held
# until its client closes. The Shortage window is 0.5 s so its count line shows up within the test. With
# "room", the loop is given a Room (as an edge's is) that is never full: descriptors run out first.
SQUEEZED = r"""
import logging, os, resource, sys, trio
from idled.door.accept import Shortage, accept_loop
from idled.server.roles.doorway import refuse

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
FREE = int(sys.argv[1])

class Unlimited:
    def full(self):
        return False
    def enter(self):
        pass
    def elsewhere(self):
        return False
    async def overflow(self, stream):
        raise AssertionError("never full")

ROOM = Unlimited() if sys.argv[2:] == ["room"] else None

async def hold(stream):
    async with stream:
        await stream.send_all(b"served")
        while await stream.receive_some(100):
            pass

async def main():
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    in_use = len(os.listdir("/proc/self/fd")) - 1  # less the descriptor listdir itself used
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + FREE, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(listener.socket.getsockname()[1], flush=True)
    async with trio.open_nursery() as handlers:
        await accept_loop(listener, hold, handlers, refuse, Shortage(lambda: "the test's squeeze", every=0.5), ROOM)
    print("done", file=sys.stderr)

trio.run(main)
"""


def reply(sock: socket.socket) -> bytes:
    """What the server sent before closing, or up to b"served"; socket.timeout if it sent nothing."""
    data = b""
    while data != b"served":
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("room", [False, True], ids=["core", "edge-room"])
def test_out_of_descriptors_refuses_with_busy_and_keeps_serving(room: bool) -> None:
    """The same for the core's loop and for an edge's (which passes a Room): one accept loop for both."""
    child = subprocess.Popen([sys.executable, "-c", SQUEEZED, str(FREE), *(["room"] if room else [])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients: list[socket.socket] = []
    refused: list[bytes] = []
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())

        def connect() -> tuple[socket.socket, bytes, float]:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            clients.append(sock)
            started = time.perf_counter()
            return sock, reply(sock), time.perf_counter() - started

        outcomes = [connect() for _ in range(12)]
        served = [sock for sock, data, _ in outcomes if data == b"served"]
        refused = [data for _, data, _ in outcomes if data != b"served"]
        assert 1 <= len(served) < FREE, outcomes
        assert len(refused) == 12 - len(served)
        for data in refused:  # a busy error frame, then the close: promptly, not a hang in the backlog
            assert msgpack.unpackb(data[4:])["code"] == "busy", data
        assert max(seconds for _, _, seconds in outcomes) < 2.0, outcomes

        # A served client leaves: its descriptor is free again, and the next client is served.
        served[0].close()
        time.sleep(0.2)
        assert connect()[1] == b"served"
        # Still out of descriptors after that: refused again; more than 0.5 s after the first, so counted.
        time.sleep(0.4)
        assert connect()[1] != b"served"
        time.sleep(0.2)  # the client has its answer before the server logs it
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
    finally:
        for sock in clients:
            sock.close()
        child.kill()
        _, stderr = child.communicate(timeout=10)
    assert "Traceback" not in stderr, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("WARNING")]
    print(stderr)
    assert len(warnings) == 2, stderr
    assert "Too many open files (EMFILE)" in warnings[0] and "the test's squeeze" in warnings[0]
    # Every refusal after the first (which the warning told), and the last one: one line, a count.
    assert f"out of descriptors in the last 1 s: {len(refused)} connections refused with busy, 0 accepts retried" \
        in warnings[1], stderr


def test_without_a_spare_the_connection_waits_and_is_served_once_descriptors_are_back() -> None:
    """No descriptor left even for the spare: the connection waits in the backlog (nothing else is possible),
    the loop retries every 0.1 s without a traceback, and serves it as soon as the limit is raised
    (prlimit on the running process, as an operator would)."""
    child = subprocess.Popen([sys.executable, "-c", SQUEEZED, "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=0.6) as sock:
            with pytest.raises(socket.timeout):
                sock.recv(100)  # waiting, not refused: there is no descriptor to refuse it with
            soft, hard = resource.prlimit(child.pid, resource.RLIMIT_NOFILE)
            resource.prlimit(child.pid, resource.RLIMIT_NOFILE, (soft + 4, hard))
            sock.settimeout(5)
            assert reply(sock) == b"served"
            time.sleep(0.2)
        assert child.poll() is None
    finally:
        child.kill()
        _, stderr = child.communicate(timeout=10)
    assert "Traceback" not in stderr, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 2 and "Too many open files (EMFILE)" in warnings[0], stderr
    assert "0 connections refused with busy" in warnings[1] and "accepts retried 0.1 s later" in warnings[1], stderr


@pytest.mark.parametrize(
    ("host", "port", "local"),
    [
        ("127.0.0.1", 7878, True), ("127.8.9.10", 7878, True), ("::1", 7878, True), ("::ffff:127.0.0.1", 1, True),
        ("localhost", 7878, True), ("/run/idled.sock", None, True),
        ("0.0.0.0", 7878, False), ("::", 7878, False), ("10.0.0.1", 7878, False), ("::ffff:10.0.0.1", 1, False),
        ("fe80::1%eth0", 7878, False), ("example.org", 7878, False),
    ],
)
def test_what_counts_as_local(host: str, port: int | None, local: bool) -> None:
    assert is_local(host, port) is local
