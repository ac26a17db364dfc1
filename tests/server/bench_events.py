"""Event -> follower latency of ``GET /v1/events`` (Server-Sent Events) with many followers.

Not a test (no ``test_`` prefix: pytest does not collect it); a benchmark that prints figures:

    PYTHONPATH=. python tests/server/bench_events.py [--followers 1000] [--rate 3000] [--seconds 10]

A real daemon (``idled serve --api-port``, auth off on loopback, ``--fsync never``). A producer *process*
(this file with ``--produce``) logs in as a gateway and attaches then detaches sessions every 10 ms: ``--rate``
events per second. The followers are ``--followers`` plain sockets in this process, read with one epoll loop
(no task per connection: the reader must cost far less than the server it measures). For each read, the
event latency is taken from the *first* event in the bytes read (its ``ts``, the daemon's wall clock when
the event happened, against this process's wall clock on arrival) and counted for every event in that read
(``id:`` lines): the oldest event of a read is the latest one, so the figures are an upper bound per event.
The first ``WARMUP`` seconds are not counted. Prints the events published, the deliveries, the latency
percentiles, the CPU of the daemon and of the reader, and how long each waited for a CPU it was ready to use
(``/proc/PID/schedstat``): on a shared machine, the part of the latency that is other processes' load.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WARMUP = 2.0
TS = b'"ts":'


def produce(port: int, rate: float, seconds: float) -> None:
    from idled.protocol import Attach, Detach, FrameDecoder, Login, encode, parse_server_message

    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(encode(Login("gateway", "bench")))
    decoder = FrameDecoder(1 << 20, parse=parse_server_message)
    decoder.receive_data(sock.recv(65536))
    period = 0.01
    per_tick = max(1, int(rate * period / 2))
    start = time.monotonic()
    n = 0
    tick = 0
    while time.monotonic() - start < seconds:
        keys = tuple(f"u{n + i}" for i in range(per_tick))
        n += per_tick
        sock.sendall(encode(Attach(keys, keepalive=600)) + encode(Detach(keys)))
        tick += 1
        delay = start + tick * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    sock.close()


def runqueue_wait(pid: int) -> float:
    """Seconds the process's threads have spent runnable but waiting for a CPU (/proc/PID/schedstat, its second
    field, summed over its tasks): on a shared machine, how much of the latency is other processes' CPU."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[1])
    return total / 1e9


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--followers", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=3000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--produce", nargs=3, metavar=("PORT", "RATE", "SECONDS"))
    args = parser.parse_args()
    if args.produce:
        produce(int(args.produce[0]), float(args.produce[1]), float(args.produce[2]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        api_port = free_port()
        stderr = open(Path(tmp) / "idled.stderr", "wb")
        daemon = subprocess.Popen([sys.executable, "-m", "idled.cli.main", "serve", "--port", "0", "--data-dir",
                                   f"{tmp}/data", "--fsync", "never", "--metrics-port", "0", "--api-port", str(api_port),
                                   "--api-max-clients", str(args.followers + 100), "--max-pending-per-address",
                                   str(args.followers + 100)], stderr=stderr, stdin=subprocess.DEVNULL)
        try:
            return run(args, daemon, Path(tmp) / "idled.stderr", api_port)
        finally:
            daemon.kill()
            daemon.wait()


def run(args: argparse.Namespace, daemon: subprocess.Popen[bytes], stderr: Path, api_port: int) -> int:
    port = 0
    for _ in range(500):
        for line in stderr.read_text(errors="replace").splitlines():
            if line.startswith("IDLED_LISTENING"):
                port = int(line.rsplit("port=", 1)[1])
        if port:
            break
        time.sleep(0.02)
    assert port, stderr.read_text()
    selector = selectors.DefaultSelector()
    request = b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    socks = []
    for _ in range(args.followers):
        sock = socket.create_connection(("127.0.0.1", api_port))
        sock.sendall(request)
        socks.append(sock)
    for sock in socks:  # every stream open (its head and first comment) before the first event
        head = b""
        while b"idled events" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    daemon_proc = psutil.Process(daemon.pid)
    producer = subprocess.Popen([sys.executable, __file__, "--produce", str(port), str(args.rate),
                                 str(args.seconds)], env={**os.environ})
    started = time.time()
    histogram: dict[int, int] = {}  # latency in 0.5 ms buckets -> events
    deliveries = counted = 0
    cpu0 = sum(daemon_proc.cpu_times()[:2])
    me0 = time.process_time()
    waits0 = runqueue_wait(daemon.pid), runqueue_wait(os.getpid())
    measured_from = started + WARMUP
    end = started + args.seconds + 1.0
    buffer = bytearray(1 << 20)  # one buffer for every read (a fresh 1 MiB bytes per recv would cost more)
    idmark = b"\nid: "
    while time.time() < end:
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                size = sock.recv_into(buffer)
            except BlockingIOError:
                continue
            now = time.time()
            events = buffer.count(idmark, 0, size) + buffer.startswith(b"id: ")
            if not events:
                continue
            deliveries += events
            where = buffer.find(TS, 0, size)
            if where < 0 or now < measured_from:
                continue
            stop = buffer.find(b",", where, size)
            ts = float(buffer[where + len(TS):stop])
            bucket = max(0, int((now - ts) * 2000))
            histogram[bucket] = histogram.get(bucket, 0) + events
            counted += events
    cpu = sum(daemon_proc.cpu_times()[:2]) - cpu0
    me = time.process_time() - me0
    waits = runqueue_wait(daemon.pid) - waits0[0], runqueue_wait(os.getpid()) - waits0[1]
    load = os.getloadavg()[0]
    producer.wait()
    with socket.create_connection(("127.0.0.1", api_port)) as sock:
        sock.sendall(b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    published = json.loads(raw.split(b"\r\n\r\n", 1)[1])["next_seq"] - 1
    for sock in socks:
        sock.close()

    def percentile(p: float) -> float:
        target, seen = p * counted, 0
        for bucket in sorted(histogram):
            seen += histogram[bucket]
            if seen >= target:
                return (bucket + 1) / 2.0
        return float("nan")

    elapsed = args.seconds + 1.0
    print(f"SSE: {args.followers} followers, producer at {args.rate:g} events/s for {args.seconds:g} s: "
          f"{published} events published, {deliveries} deliveries ({deliveries / max(1, published):.1f} per event; "
          f"{deliveries / elapsed:,.0f}/s)")
    print(f"event -> follower latency (after {WARMUP:g} s warm-up, {counted} deliveries, upper bound per read): "
          f"p50 {percentile(0.5):.1f} ms, p90 {percentile(0.9):.1f} ms, p99 {percentile(0.99):.1f} ms, "
          f"p99.9 {percentile(0.999):.1f} ms, max {max(histogram, default=0) / 2 + 0.5:.1f} ms")
    print(f"CPU over the run: daemon {cpu:.1f} s ({cpu / elapsed:.0%} of a core), reader {me:.1f} s "
          f"({me / elapsed:.0%})")
    print(f"waiting for a CPU (runnable, not running) over the run: daemon {waits[0]:.1f} s, reader {waits[1]:.1f} s; "
          f"machine load average {load:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
