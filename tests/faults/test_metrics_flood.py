"""A peer floods the metrics port with idle connections; a prober elsewhere still gets ``/healthz`` within 1 s.

A real ``idled serve`` with a metrics port; a flood process (tests/faults/floodpeer.py) holds as many idle
connections as it can -- several hundred, re-opened as soon as they are closed -- from one source address, or
spread over 38 (127.0.0.3..127.0.0.40: their shares add up to more than the endpoint's 64 connections in all);
a prober from 127.0.0.2 GETs ``/healthz`` every 0.25 s for 5 s. Every probe must be answered 200 within 1 s:
the door's gate (idled.door.door.metrics_gate) gives one address a few connections, drops a connection whose
request head has not come within 2 s, and when the endpoint is full evicts the oldest connection not yet
answered for the newest. The figures (probes ok / total, max and p99 latency, what the flood did) are printed
(``pytest -s``) for the record. Before the door (a cap of 16 clients, no share per address, no head deadline)
a flood of idle connections from one address kept every probe out.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idled.tools.bench.daemon import Daemon, stop
from idled.tools.loadtest.connect import IP_BIND_ADDRESS_NO_PORT
from tests import peers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROBER = "127.0.0.2"
EVERY, SECONDS, WITHIN = 0.25, 5.0, 1.0  # a probe every EVERY s for SECONDS s, each answered WITHIN s


def probe(port: int, timeout: float = 5.0) -> tuple[bool, float]:
    """(answered 200 ok?, seconds from connect to the whole answer) for one GET /healthz from PROBER."""
    start = time.monotonic()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
    sock.settimeout(timeout)
    answer = b""
    try:
        sock.bind((PROBER, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: idled\r\n\r\n")
        while chunk := sock.recv(4096):
            answer += chunk
    except OSError:
        pass
    finally:
        sock.close()
    return answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok\n"), time.monotonic() - start


def probes(port: int) -> list[tuple[bool, float]]:
    """A probe every EVERY seconds for SECONDS seconds (each started on its slot, not after the last ended)."""
    results = []
    start = time.monotonic()
    for i in range(int(SECONDS / EVERY)):
        time.sleep(max(0.0, start + i * EVERY - time.monotonic()))
        results.append(probe(port))
    return results


def figures(results: list[tuple[bool, float]]) -> tuple[int, float, float]:
    """(probes answered 200 within WITHIN, max latency, p99 latency: nearest rank)."""
    latencies = sorted(latency for _, latency in results)
    ok = sum(1 for good, latency in results if good and latency <= WITHIN)
    return ok, latencies[-1], latencies[max(0, math.ceil(0.99 * len(latencies)) - 1)]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[Daemon, int]]:
    metrics_port = peers.free_port()
    with Daemon(tmp_path, "--metrics-port", str(metrics_port)) as daemon:
        yield daemon, metrics_port


def flood(metrics_port: int, sources: list[str], connections: int) -> subprocess.Popen[str]:
    """The flood process, once its first ``connections`` are under way."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.faults.floodpeer", "127.0.0.1", str(metrics_port),
                             ",".join(sources), str(connections)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # the flood settles: the endpoint full, its backlog busy
    return proc


def run(serve: tuple[Daemon, int], what: str, sources: list[str], connections: int) -> None:
    daemon, metrics_port = serve
    assert probe(metrics_port)[0]  # answered before the flood
    cpu = daemon.cpu_seconds()
    flooder = flood(metrics_port, sources, connections)
    try:
        results = probes(metrics_port)
        cpu = daemon.cpu_seconds() - cpu
    finally:
        flooder.terminate()
        out, _ = flooder.communicate(timeout=30)
        stop(flooder)
    done = json.loads(out.strip().splitlines()[-1])
    ok, worst, p99 = figures(results)
    print(f"\nmetrics flood, {what}: /healthz from {PROBER}: {ok}/{len(results)} answered 200 within {WITHIN:g} s; "
          f"latency max {worst * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; the flood ({connections} held open from "
          f"{len(sources)} address(es)): {done['opened']} connections opened, {done['closed_by_server']} closed by "
          f"the daemon, {done['connect_errors']} connect errors, {done['open_at_end']} open at the end; the daemon's "
          f"CPU: {cpu:.1f} s over the flood's {SECONDS + 1:g} s")
    assert done["opened"] >= connections >= 200 and done["open_at_end"] >= 200  # the flood was real
    assert ok == len(results), results
    assert daemon.proc.poll() is None and probe(metrics_port)[0]  # and the daemon is fine after it


def test_one_address_holding_hundreds_of_idle_connections_does_not_keep_a_prober_out(
        serve: tuple[Daemon, int]) -> None:
    run(serve, "one address", ["127.0.0.1"], 400)


def test_many_addresses_over_the_endpoint_limit_do_not_keep_a_prober_out(serve: tuple[Daemon, int]) -> None:
    """38 addresses x 4 connections each is more than the endpoint's 64: the oldest idle one makes room."""
    run(serve, "38 addresses", [f"127.0.0.{i}" for i in range(3, 41)], 400)
