"""``idled bench --api``: HTTP presence queries per CPU-second of the daemon, by batch size.

A real ``idled serve`` subprocess (``--api-port``, rate limit lifted, ``--fsync never``) gets ``users``
sessions online through one gateway connection (``attach`` frames of 1,000 uids: the cheapest way in, and
the table is the same as with direct users). Then, for each batch size, a client in a separate process holds
one keep-alive connection and POSTs ``/v1/presence`` with ``batch`` uids (random online ones) back to back
for ``seconds``. The daemon's CPU (user + system, psutil) is read before and after each run, and the client
reports its own (``resource``): the client must stay well below 1.0 CPU-second per second, else it, not
the daemon, is what was measured. Printed per batch: requests/s, uids/s, requests and uids per daemon
CPU-second, the daemon's and the client's CPU share.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from idled.protocol import Attach, Login, encode
from idled.tools.bench.daemon import Daemon, free_port

__all__ = ["DEFAULT_BATCHES", "DEFAULT_USERS", "bench_api", "format_rows"]

DEFAULT_BATCHES = (1, 100, 10_000)
DEFAULT_USERS = 100_000
ATTACH_CHUNK = 1_000


def _attach(port: int, users: int) -> socket.socket:
    """One gateway holding ``users`` sessions u0..u{users-1} (kept open: closing it would end them)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(encode(Login("gateway", "bench")))
    sock.recv(65536)  # welcome
    for start in range(0, users, ATTACH_CHUNK):
        uids = tuple(f"u{i}" for i in range(start, min(users, start + ATTACH_CHUNK)))
        sock.sendall(encode(Attach(uids, 3000.0)))
    return sock


def _wait_online(api_port: int, users: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", api_port, timeout=30)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        conn.request("GET", "/v1/stats")
        if json.loads(conn.getresponse().read())["users_online"] >= users:
            return
        time.sleep(0.1)
    raise RuntimeError("the sessions did not all come online")


def client(api_port: int, users: int, batch: int, seconds: float) -> dict[str, float]:
    """The client process's loop: one keep-alive connection, requests back to back."""
    rng = random.Random(batch)
    bodies = [json.dumps({"uids": [f"u{rng.randrange(users)}" for _ in range(batch)]}).encode() for _ in range(16)]
    conn = http.client.HTTPConnection("127.0.0.1", api_port, timeout=60)
    headers = {"Content-Type": "application/json"}
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    requests = 0
    while time.monotonic() - started < seconds:
        conn.request("POST", "/v1/presence", bodies[requests % len(bodies)], headers)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
        requests += 1
    elapsed = time.monotonic() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    return {"requests": requests, "elapsed": elapsed, "cpu": cpu}


def bench_api(users: int = DEFAULT_USERS, batches: tuple[int, ...] = DEFAULT_BATCHES,
              seconds: float = 5.0) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="idled-bench-api-") as tmp:
        api_port = free_port()
        with Daemon(Path(tmp), "--api-port", str(api_port), "--api-rate", "10000000", "--api-burst", "100000000",
                    "--fsync", "never", "--metrics-port", "0", "--timeout", "600", "--max-timeout", "3600",
                    "--log-level", "warning") as daemon:
            gateway = _attach(daemon.port, users)
            _wait_online(api_port, users)
            for batch in batches:
                before = daemon.cpu_seconds()
                out = subprocess.run([sys.executable, "-m", "idled.tools.bench.api", str(api_port), str(users),
                                      str(batch), str(seconds)], capture_output=True, check=True, text=True)
                daemon_cpu = daemon.cpu_seconds() - before
                result = json.loads(out.stdout)
                n, elapsed = result["requests"], result["elapsed"]
                rows.append({"batch": batch, "requests": n, "requests_per_s": n / elapsed,
                             "uids_per_s": n * batch / elapsed,
                             "requests_per_daemon_cpu_s": n / max(daemon_cpu, 1e-9),
                             "uids_per_daemon_cpu_s": n * batch / max(daemon_cpu, 1e-9),
                             "daemon_cpu_share": daemon_cpu / elapsed, "client_cpu_share": result["cpu"] / elapsed})
            gateway.close()
    return rows


def format_rows(rows: list[dict[str, Any]], users: int) -> str:
    lines = [f"HTTP presence API: POST /v1/presence, one keep-alive client process, {users} users online",
             f"{'batch':>6} {'req/s':>9} {'uids/s':>11} {'req/daemon-CPU-s':>17} {'uids/daemon-CPU-s':>18} "
             f"{'daemon CPU':>10} {'client CPU':>10}"]
    for r in rows:
        lines.append(f"{r['batch']:>6} {r['requests_per_s']:>9.0f} {r['uids_per_s']:>11.0f} "
                     f"{r['requests_per_daemon_cpu_s']:>17.0f} {r['uids_per_daemon_cpu_s']:>18.0f} "
                     f"{r['daemon_cpu_share']:>10.2f} {r['client_cpu_share']:>10.2f}")
    return "\n".join(lines)


if __name__ == "__main__":  # the client process: port users batch seconds -> JSON on stdout
    print(json.dumps(client(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))))
    os._exit(0)
