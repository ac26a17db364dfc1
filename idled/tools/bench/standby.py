"""`idled bench --standby`: what one standby costs the active core per event, how far behind it runs, and what
synchronous replication (``--sync-standby``) adds to a durable observer's wait.

Theory of operation
-------------------
An active ``idled serve`` (``--fsync always``, so that what it may ship is every record at once and the lag
measured is the shipping's own) gets ``rate`` events/s through one gateway connection (plain sockets, a
thread: attach a step's uids, detach the previous step's, every ``gatewayload.STEP`` seconds). The run has five phases
of ``seconds`` each. On a first active: no standby, one standby attached (started, and caught up, before the
phase begins: *async*), no standby again (it is stopped). On a second active, started with
``--sync-standby``: no standby (the fallback: its own fsync alone), then one standby attached and
synchronous (the active has logged ``sync standby attached``). Both standbys run ``--fsync always``, so an
ack means "on the standby's disk". Per phase: the active's CPU time per event, and for every event a durable
observer of the active receives, its wall clock then less the event's ``ts`` (the active's wall clock when it
emitted it: one machine, one clock) -- the latency ``--sync-standby`` adds is there. During the async phase an
observer on the standby notes the same delays, and the standby's ``/status`` is sampled every 0.2 s for
``lag_records`` and ``lag_seconds``.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idled.protocol import Login, Subscribe, encode
from idled.tools.bench.daemon import Daemon, free_port
from idled.tools.bench.gatewayload import GatewayLoad, login, read_events

__all__ = ["report_lines"]

class _Observer(threading.Thread):
    """An observer: the delay of every event (arrival wall clock less its ``ts``); ``durable`` subscribes so."""

    def __init__(self, port: int, durable: bool = False) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.delays: list[float] = []
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(encode(Login("observer", "bench")) + encode(Subscribe(None, durable)))

    def run(self) -> None:
        try:
            for event in read_events(self.sock, lambda: True):
                self.delays.append(time.time() - event.ts)
        except OSError:
            pass


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
        document: dict[str, Any] = json.loads(response.read())["standby"]
    return document


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


class _Phase:
    """One phase's figures: the active's CPU seconds, the events sent, the durable observer's delays."""

    def __init__(self, active: Daemon, generator: GatewayLoad, durable: _Observer, seconds: float) -> None:
        cpu, sent, seen = active.cpu_seconds(), generator.sent, len(durable.delays)
        time.sleep(seconds)
        self.cpu, self.events = active.cpu_seconds() - cpu, generator.sent - sent
        self.delays = durable.delays[seen:]

    @property
    def per_event(self) -> float:
        return self.cpu / max(1, self.events)


def _standby(directory: Path, active: Daemon) -> tuple[Daemon, int]:
    """A standby of ``active`` (``--fsync always``), caught up; and its metrics port."""
    directory.mkdir()
    metrics = free_port()
    standby = Daemon(directory, "--standby-of", f"127.0.0.1:{active.port}", "--metrics-port", str(metrics),
                     "--fsync", "always")
    try:
        # Caught up: connected, told the active's durable seq by a frame (before the first one, head is only
        # our own last seq: "lag 0" then means nothing), and holding it.
        while not ((doc := _status(metrics))["connected"] and doc["active_durable_seq"] > 0
                   and doc["lag_records"] == 0):
            time.sleep(0.05)
    except BaseException:
        standby.stop()
        raise
    return standby, metrics


def _active(directory: Path, *flags: str) -> Daemon:
    directory.mkdir()
    return Daemon(directory, "--fsync", "always", "--metrics-port", "0", "--timeout", "600", *flags)


def _start(active: Daemon, rate: float) -> tuple[GatewayLoad, _Observer]:
    generator = GatewayLoad(lambda: login(("127.0.0.1", active.port), Login("gateway", "bench-standby")), rate, "s")
    generator.start()
    durable = _Observer(active.port, durable=True)
    durable.start()
    time.sleep(1.0)  # warm-up
    return generator, durable


def report_lines(seconds: float, rate: float) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="idled-bench-standby-") as tmp:
        base = Path(tmp)
        phases: dict[str, _Phase] = {}
        with _active(base / "a") as active:
            generator, durable = _start(active, rate)
            phases["none"] = _Phase(active, generator, durable, seconds)
            standby, metrics = _standby(base / "s", active)
            try:
                observer = _Observer(standby.port)
                observer.start()
                lags: list[tuple[int, float]] = []
                sampler_stop = threading.Event()

                def sample() -> None:
                    while not sampler_stop.wait(0.2):
                        doc = _status(metrics)
                        lags.append((doc["lag_records"], doc["lag_seconds"]))

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                phases["async, 1 standby"] = _Phase(active, generator, durable, seconds)
                sampler_stop.set()
                sampler.join()
                standby_cpu = standby.cpu_seconds()
            finally:
                standby.stop()
            phases["none again"] = _Phase(active, generator, durable, seconds)
            generator.stop.set()
            generator.join()
        with _active(base / "b", "--sync-standby") as active:
            generator, durable = _start(active, rate)
            phases["sync, none attached"] = _Phase(active, generator, durable, seconds)
            standby, _ = _standby(base / "t", active)
            try:
                deadline = time.monotonic() + 30
                while "sync standby attached" not in active.stderr():
                    if time.monotonic() > deadline:
                        raise RuntimeError("the active never said `sync standby attached`: is sync_standby wired?")
                    time.sleep(0.05)
                phases["sync, 1 sync standby"] = _Phase(active, generator, durable, seconds)
            finally:
                standby.stop()
            generator.stop.set()
            generator.join()
        yield (f"idled bench --standby: {rate:g} events/s through a gateway, 5 phases of {seconds:g} s on two actives "
               f"(--fsync always; the second with --sync-standby); standbys --fsync always")
        yield f"  {'phase':<22} {'events':>7}  {'active CPU/event':>16}  event -> durable observer on the active"
        for name, phase in phases.items():
            delays = phase.delays
            yield (f"  {name:<22} {phase.events:>7}  {1e6 * phase.per_event:13.1f} us  p50 "
                   f"{1e3 * _percentile(delays, 0.5):6.2f} ms, p99 {1e3 * _percentile(delays, 0.99):6.2f} ms "
                   f"({len(delays)} events)")
        base_cost = (phases["none"].per_event + phases["none again"].per_event) / 2
        yield (f"  cost ratio / none (mean of both): async {phases['async, 1 standby'].per_event / base_cost:.2f}, "
               f"sync {phases['sync, 1 sync standby'].per_event / base_cost:.2f}")
        delays = observer.delays
        yield (f"  event -> on the standby (observer, async phase): p50 {1e3 * _percentile(delays, 0.5):.1f} ms, "
               f"p99 {1e3 * _percentile(delays, 0.99):.1f} ms, max {1e3 * max(delays, default=float('nan')):.1f} ms "
               f"over {len(delays)} events")
        if lags:
            yield (f"  idled_standby_lag_records max {max(r for r, _ in lags)}, "
                   f"idled_standby_lag_seconds max {max(s for _, s in lags):.3f} ({len(lags)} samples of /status)")
        attached = phases["async, 1 standby"]
        yield f"  standby CPU {standby_cpu:.2f} s ({1e6 * standby_cpu / max(1, attached.events):.1f} us/event incl. catch-up)"
