"""`idled bench --failover N`: SIGKILL the elected leader N times under load; how long until the other core
serves, and whether anything durable was lost.

Theory of operation
-------------------
A real etcd (``idled.tools.etcd``) on 127.0.0.1 and two cores, ``idled serve --election`` on 127.0.0.2 and
127.0.0.3 (one port, two "machines"; ``--fsync always``, plus the given flags, e.g. ``--sync-standby``).
A gateway thread sends ``rate`` events/s (attach/detach) to whichever core takes it: on a lost or refused
connection it tries the cores in turn. A *durable* observer follows the leader from its last seq and
notes every event it is given. Per run:

1. wait until both cores run, one leading, the other following with lag 0; load for ``LOAD`` seconds,
   sampling the follower's ``/status`` lag every 0.2 s;
2. SIGKILL the leader (t0); probe the other core with user logins every ``PROBE_EVERY`` s: the first
   ``welcome`` is the **failover time** (kill -> first accepted login on the new leader);
3. restart the killed core (it follows the new leader, re-syncing if its log went further).

At the end the load stops and one observer reads the whole history from seq 1 on the last leader. An event
the durable observer was given and the history lacks, or holds with other content, is a **durable event
lost**; the history's seqs must be strictly increasing (no seq issued twice).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from idled.protocol import Event, Login, Subscribe, encode
from idled.tools.bench.daemon import Daemon, free_port
from idled.tools.bench.gatewayload import GatewayLoad, login, read_events
from idled.tools.etcd import ETCD, EtcdServer

__all__ = ["Cluster", "DurableObserver", "history", "probe", "report_lines"]

HOSTS = ("127.0.0.2", "127.0.0.3")
LOAD = 3.0  # seconds of load before each kill
PROBE_EVERY = 0.02
SETTLE_TIMEOUT = 60.0
CAUGHT_UP = 300  # records a streaming follower may lag and count as caught up


class Cluster:
    """etcd and two elected cores; ``nodes[i]`` is None while core i is down."""

    def __init__(self, base: Path, ttl: int, flags: Sequence[str]) -> None:
        if ETCD is None:
            raise RuntimeError("etcd not found on PATH (Debian: apt-get install etcd-server)")
        self.base, self.ttl, self.flags = base, ttl, list(flags)
        self.etcd = EtcdServer(base / "etcd")
        self.port = _port_free_on(HOSTS)
        self.metrics = [free_port() for _ in HOSTS]
        self.nodes: list[Daemon | None] = [None, None]
        self.starts = [0, 0]

    def start(self, i: int, election_url: str | None = None) -> Daemon:
        """Start core i (``election_url``: its way to etcd, default the etcd's own address)."""
        self.starts[i] += 1
        directory = self.base / f"core{i}-{self.starts[i]}"
        directory.mkdir()
        flags = ["--host", HOSTS[i], "--port", str(self.port), "--metrics-port", str(self.metrics[i]),
                 "--data-dir", str(self.base / f"data{i}"), "--election", election_url or self.etcd.url("bench"),
                 "--election-ttl", str(self.ttl), "--fsync", "always", "--timeout", "600", *self.flags]
        node = self.nodes[i] = Daemon(directory, *flags)
        return node

    def address(self, i: int) -> tuple[str, int]:
        return HOSTS[i], self.port

    def connect_gateway(self) -> socket.socket | None:
        """A gateway connection to whichever core takes it (the leader), None if neither does."""
        for i in range(2):
            if (sock := login(self.address(i), Login("gateway", "bench-failover"))) is not None:
                return sock
        return None

    def status(self, i: int) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics[i]}/status", timeout=2) as response:
                document: dict[str, Any] = json.loads(response.read())
                return document
        except (OSError, ValueError):
            return None

    def settled(self) -> int:
        """Wait until one core leads and the other follows it, caught up; the leader's index."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        streak = 0  # looks in a row that found the follower streaming with nothing to catch up
        while time.monotonic() < deadline:
            docs = [self.status(i) for i in range(2)]
            roles = [doc.get("role") if doc else None for doc in docs]
            if sorted(map(str, roles)) == ["leader", "standby"]:
                follower = docs[roles.index("standby")]
                assert follower is not None
                part = follower.get("standby") or {}
                # Under load the follower is always a batch or so behind: a tenth of a second of events.
                caught_up = part.get("state") == "streaming" and 0 <= part.get("lag_records", -1) <= CAUGHT_UP
                streak = streak + 1 if caught_up else 0
                if streak >= 3:  # not a passing moment of a re-sync
                    return roles.index("leader")
            time.sleep(0.1)
        raise RuntimeError(f"the cores did not settle within {SETTLE_TIMEOUT:g} s: {self._diagnosis()}")

    def _diagnosis(self) -> str:
        """Each core's role and replication state, and the last lines of its log: what a failed settle needs."""
        parts = []
        for i, node in enumerate(self.nodes):
            doc = self.status(i) or {}
            tail = " | ".join(node.stderr().splitlines()[-6:]) if node is not None else "(down)"
            parts.append(f"core {i}: role {doc.get('role')}, standby {doc.get('standby')}; log: {tail}")
        return "; ".join(parts)

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        assert node is not None
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait()
        self.nodes[i] = None

    def close(self) -> None:
        for node in self.nodes:
            if node is not None:
                node.stop()
        self.etcd.kill()


def _port_free_on(hosts: Sequence[str]) -> int:
    for _ in range(100):
        port = free_port(hosts[0])
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every core address")


class DurableObserver(threading.Thread):
    """A durable subscription that follows ``target`` (the leader's index, set by the main thread)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.target = 0
        self.seen: dict[int, tuple[Any, ...]] = {}
        self.last = 0
        self.out_of_order = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            sock = login(self.cluster.address(self.target), Login("observer", "bench-durable"))
            if sock is None:
                time.sleep(0.05)
                continue
            sock.settimeout(0.2)
            sock.sendall(encode(Subscribe(from_seq=self.last + 1, durable=True)))
            try:
                for event in read_events(sock, lambda: not self.stop.is_set()):
                    self._note(event)
            except OSError:
                pass
            finally:
                sock.close()

    def _note(self, event: Event) -> None:
        if event.seq <= self.last:
            self.out_of_order += 1
        self.last = max(self.last, event.seq)
        self.seen[event.seq] = _content(event)


def _content(event: Event) -> tuple[Any, ...]:
    return (event.kind, event.uid, event.ts, event.reason)


def history(address: tuple[str, int], upto: int) -> list[Event]:
    """Every event from seq 1 on (durable), until one at or past ``upto`` and a quiet second."""
    sock = login(address, Login("observer", "bench-history"))
    if sock is None:
        raise RuntimeError(f"cannot read the history from {address}")
    events: list[Event] = []
    sock.settimeout(1.0)
    sock.sendall(encode(Subscribe(from_seq=1, durable=True)))
    try:
        events.extend(read_events(sock, lambda: not events or events[-1].seq < upto))
    finally:
        sock.close()
    return events


def probe(address: tuple[str, int], started: float, limit: float) -> float | None:
    """Seconds from ``started`` until ``address`` accepts a user login (None: not within ``limit``)."""
    n = 0
    while time.monotonic() - started < limit:
        n += 1
        sock = login(address, Login("uid", f"probe-{n}"), timeout=0.5)
        if sock is not None:
            elapsed = time.monotonic() - started
            sock.close()
            return elapsed
        time.sleep(PROBE_EVERY)
    return None


def _percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def report_lines(runs: int, rate: float, ttl: int, flags: Sequence[str]) -> Iterator[str]:
    yield (f"idled bench --failover {runs}: etcd + 2 cores (--election, --election-ttl {ttl}, --fsync always "
           f"{' '.join(flags)}), {rate:g} events/s through a gateway, SIGKILL of the leader per run")
    with tempfile.TemporaryDirectory(prefix="idled-bench-failover-") as tmp:
        cluster = Cluster(Path(tmp), ttl, flags)
        try:
            yield from _runs(cluster, runs, rate)
        finally:
            cluster.close()


def _runs(cluster: Cluster, runs: int, rate: float) -> Iterator[str]:
    cluster.start(0)
    cluster.start(1)
    leader = cluster.settled()
    gateway, observer = GatewayLoad(cluster.connect_gateway, rate), DurableObserver(cluster)
    observer.target = leader
    gateway.start()
    observer.start()
    times: list[float] = []
    lags: list[tuple[int, float]] = []
    for run in range(1, runs + 1):
        leader = cluster.settled()
        observer.target = leader
        follower = 1 - leader
        until = time.monotonic() + LOAD
        while time.monotonic() < until:
            doc = cluster.status(follower)
            if doc and doc.get("standby"):
                lags.append((doc["standby"]["lag_records"], doc["standby"]["lag_seconds"]))
            time.sleep(0.2)
        durable_before = observer.last
        started = time.monotonic()
        cluster.kill(leader)
        took = probe(cluster.address(follower), started, limit=cluster.ttl + 30)
        observer.target = follower
        if took is None:
            yield f"  run {run:>2}: the other core did not take over within {cluster.ttl + 30} s"
            return
        times.append(took)
        yield f"  run {run:>2}: leader {cluster.address(leader)[0]} killed; first login accepted on " \
              f"{cluster.address(follower)[0]} after {1e3 * took:7.1f} ms (durable seq seen before: {durable_before})"
        cluster.start(leader)
    leader = cluster.settled()
    time.sleep(1.0)
    gateway.stop.set()
    gateway.join()
    time.sleep(1.0)
    observer.stop.set()
    observer.join()
    events = history(cluster.address(leader), observer.last)
    yield from _verdict(times, lags, observer, events, gateway, cluster.ttl)


def _verdict(times: list[float], lags: list[tuple[int, float]], observer: DurableObserver, events: list[Event],
             gateway: GatewayLoad, ttl: int) -> Iterator[str]:
    final = {event.seq: _content(event) for event in events}
    seqs = [event.seq for event in events]
    increasing = all(a < b for a, b in zip(seqs, seqs[1:]))
    lost = sum(1 for seq, content in observer.seen.items() if final.get(seq) != content)
    yield (f"  failover time (kill -> first accepted login), {len(times)} runs: p50 {1e3 * _percentile(times, 0.5):.0f} ms, "
           f"max {1e3 * max(times, default=float('nan')):.0f} ms (lease ttl {ttl} s)")
    if lags:
        yield (f"  follower lag under load: records max {max(r for r, _ in lags)}, p99 "
               f"{_percentile([r for r, _ in lags], 0.99):.0f}; seconds max {max(s for _, s in lags):.3f} "
               f"({len(lags)} samples)")
    yield (f"  durable events seen by the observer: {len(observer.seen)}; lost or changed in the final history: {lost}; "
           f"out of order: {observer.out_of_order}")
    yield (f"  final history: {len(events)} events, seqs strictly increasing: {'yes' if increasing else 'NO'}; "
           f"gateway sent {gateway.sent} events over {gateway.connections} connections")
