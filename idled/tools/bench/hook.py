"""`idled bench --hook`: webhook delivery throughput and end-to-end latency, with real processes.

Starts an `idled serve` (``--fsync always``: the hook reads the durable view, so the fsync policy is part of
its latency), a fast receiver in this process (`http.server.ThreadingHTTPServer` on 127.0.0.1 answering 204
and noting when each event arrived), and an `idled hook` subprocess (signed, default batching). A gateway
connection made here with plain sockets then attaches and detaches uids at ``rate`` events/s until ``events``
events exist. Reported: delivered events/s (first event's ts to the last receipt), latency per event (its
``ts`` in the record, the daemon's wall clock, to the receiver's receipt; same machine, same clock) p50 / p99
/ max, and the hook's CPU time per 1,000 events.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idled.protocol import Attach, Detach, Login, encode
from idled.tools.bench.daemon import Daemon, stop

__all__ = ["report_lines"]

_STEP = 0.01  # seconds between gateway frames


class _Receiver:
    def __init__(self) -> None:
        self.arrivals: dict[int, tuple[float, float]] = {}  # seq -> (ts, received)
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                now = time.time()
                events = json.loads(body)["events"]
                with receiver.lock:
                    for event in events:
                        receiver.arrivals.setdefault(event["seq"], (event["ts"], now))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _generate(port: int, events: int, rate: float) -> None:
    """Attach then detach uids through one gateway connection: ``events`` events at ``rate`` per second."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(encode(Login("gateway", "bench-hook")))
    sock.recv(65536)  # the welcome
    per_step = max(1, int(rate * _STEP))
    start, sent, uid = time.monotonic(), 0, 0
    while sent < events:
        count = min(per_step, events - sent)
        attach = tuple(f"bench-{uid + i}" for i in range((count + 1) // 2))
        uid += len(attach)
        sock.sendall(encode(Attach(attach, 60.0)) + encode(Detach(attach[: count // 2])))
        sent += len(attach) + count // 2
        delay = start + sent / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    sock.close()  # the rest of the attached uids go offline too: a few more events


def _percentile(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def report_lines(events: int, rate: float) -> Iterator[str]:
    import psutil

    receiver = _Receiver()
    try:
        with tempfile.TemporaryDirectory(prefix="idled-bench-hook-") as tmp, \
                Daemon(Path(tmp), "--fsync", "always", "--metrics-port", "0") as daemon:
            secret = os.path.join(tmp, "secret")
            with open(secret, "w") as f:
                f.write("whsec_" + base64.b64encode(os.urandom(32)).decode() + "\n")
            url = f"http://127.0.0.1:{receiver.server.server_address[1]}/"
            hook = subprocess.Popen([sys.executable, "-m", "idled.cli.main", "hook", "--url", url, "--port",
                                     str(daemon.port), "--from", "1", "--state", os.path.join(tmp, "state"),
                                     "--hook-secret-file", secret, "--log-level", "warning"], stdout=subprocess.DEVNULL)
            try:
                yield f"idled bench --hook: {events} events at {rate:g}/s through a gateway, --fsync always, " \
                      "default batching (500 events, 0.05 s), signed"
                _generate(daemon.port, events, rate)
                deadline = time.monotonic() + 60 + events / 1000
                while len(receiver.arrivals) < events and time.monotonic() < deadline:
                    time.sleep(0.05)
                cpu = psutil.Process(hook.pid).cpu_times()
            finally:
                stop(hook, grace=10)  # before the daemon: its subscription ends first
    finally:
        receiver.server.shutdown()
    yield from _summary(receiver, events, cpu.user + cpu.system)


def _summary(receiver: _Receiver, events: int, cpu: float) -> Iterator[str]:
    with receiver.lock:
        arrivals = list(receiver.arrivals.values())
    if len(arrivals) < events:
        raise RuntimeError(f"only {len(arrivals)} of {events} events delivered within the time limit")
    first_ts = min(ts for ts, _ in arrivals)
    last = max(received for _, received in arrivals)
    latencies = sorted(max(0.0, received - ts) * 1000 for ts, received in arrivals)
    yield f"delivered   {len(arrivals)} events in {last - first_ts:.2f} s: {len(arrivals) / (last - first_ts):,.0f} events/s"
    yield (f"latency     event ts -> receipt: p50 {_percentile(latencies, 0.5):.1f} ms, "
           f"p99 {_percentile(latencies, 0.99):.1f} ms, max {latencies[-1]:.1f} ms")
    yield f"hook CPU    {cpu:.2f} s in all, {cpu / len(arrivals) * 1e6:.0f} us per event (start-up included)"
