"""`idled bench --standby`: what one standby costs the active core per event, and how far behind it runs.

Theory of operation
-------------------
One active ``idled serve`` (``--fsync always``, so that what it may ship is every record at once and the lag
measured is the shipping's own) gets ``rate`` events/s through one gateway connection (plain sockets, a
thread: attach a step's uids, detach the previous step's, every ``_STEP`` seconds). The run has three
phases of ``seconds`` each, on the same active process: no standby, one standby attached (started, and
caught up, before the phase begins), no standby again (it is stopped). The active's CPU time per event in
each phase gives the ratio, the third phase showing the drift. During the standby phase an observer on the
standby notes, for every event, the standby's wall clock when it arrives less the event's ``ts`` (the
active's wall clock when it emitted it: one machine, one clock), and the standby's ``/status`` is sampled
every 0.2 s for ``lag_records`` and ``lag_seconds``.
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

from idled.protocol import NEED_DATA, Attach, Detach, Event, FrameDecoder, Login, Subscribe, encode, parse_server_message
from idled.tools.bench.daemon import Daemon, free_port

__all__ = ["report_lines"]

_STEP = 0.01  # seconds between gateway frames


class _Generator(threading.Thread):
    """Events at ``rate``/s through one gateway connection until ``stop`` is set; ``sent`` counts them."""

    def __init__(self, port: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.port, self.rate = port, rate
        self.sent = 0
        self.stop = threading.Event()

    def run(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.sendall(encode(Login("gateway", "bench-standby")))
        per_step = max(2, round(self.rate * _STEP / 2))
        previous: tuple[str, ...] = ()
        uid = 0
        started = time.monotonic()
        step = 0
        while not self.stop.is_set():
            attach = tuple(f"s{uid + i}" for i in range(per_step))
            uid += per_step
            frames = encode(Attach(attach, 600.0)) + (encode(Detach(previous)) if previous else b"")
            sock.sendall(frames)
            self.sent += len(attach) + len(previous)
            previous = attach
            step += 1
            time.sleep(max(0.0, started + step * _STEP - time.monotonic()))
        sock.close()


class _Observer(threading.Thread):
    """An observer on the standby: the delay of every event (arrival wall clock less its ``ts``)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.delays: list[float] = []
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(encode(Login("observer", "bench")) + encode(Subscribe()))

    def run(self) -> None:
        decoder = FrameDecoder(1 << 20, parse=parse_server_message)
        try:
            while data := self.sock.recv(1 << 16):
                now = time.time()
                decoder.receive_data(data)
                while (message := decoder.next_event()) is not NEED_DATA:
                    if type(message) is Event:
                        self.delays.append(now - message.ts)
        except OSError:
            pass


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
        document: dict[str, Any] = json.loads(response.read())["standby"]
    return document


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def _phase(active: Daemon, generator: _Generator, seconds: float) -> tuple[float, int]:
    """(active CPU seconds, events) over ``seconds``."""
    cpu, sent = active.cpu_seconds(), generator.sent
    time.sleep(seconds)
    return active.cpu_seconds() - cpu, generator.sent - sent


def report_lines(seconds: float, rate: float) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="idled-bench-standby-") as tmp:
        base = Path(tmp)
        (base / "a").mkdir()
        (base / "s").mkdir()
        with Daemon(base / "a", "--fsync", "always", "--metrics-port", "0", "--timeout", "600") as active:
            generator = _Generator(active.port, rate)
            generator.start()
            time.sleep(1.0)  # warm-up
            alone = _phase(active, generator, seconds)
            metrics = free_port()
            standby = Daemon(base / "s", "--standby-of", f"127.0.0.1:{active.port}", "--metrics-port", str(metrics))
            try:
                while _status(metrics)["lag_records"] > 0 or not _status(metrics)["connected"]:
                    time.sleep(0.05)
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
                attached = _phase(active, generator, seconds)
                sampler_stop.set()
                sampler.join()
                standby_cpu = standby.cpu_seconds()
            finally:
                standby.stop()
            again = _phase(active, generator, seconds)
            generator.stop.set()
            generator.join()
        delays = observer.delays
        yield (f"idled bench --standby: {rate:g} events/s through a gateway for 3 x {seconds:g} s, active --fsync always, "
               f"standby --fsync interval (default)")
        for name, (cpu, events) in (("no standby", alone), ("1 standby", attached), ("no standby again", again)):
            yield f"  active, {name:<17} {events:>7} events  {1e6 * cpu / max(1, events):6.1f} us CPU/event"
        base_cost = (alone[0] / max(1, alone[1]) + again[0] / max(1, again[1])) / 2
        yield f"  cost ratio, 1 standby / none (mean of both): {attached[0] / max(1, attached[1]) / base_cost:.2f}"
        yield (f"  event -> on the standby (observer): p50 {1e3 * _percentile(delays, 0.5):.1f} ms, "
               f"p99 {1e3 * _percentile(delays, 0.99):.1f} ms, max {1e3 * max(delays, default=float('nan')):.1f} ms "
               f"over {len(delays)} events")
        if lags:
            yield (f"  idled_standby_lag_records max {max(r for r, _ in lags)}, "
                   f"idled_standby_lag_seconds max {max(s for _, s in lags):.3f} ({len(lags)} samples of /status)")
        yield f"  standby CPU {standby_cpu:.2f} s ({1e6 * standby_cpu / max(1, attached[1]):.1f} us/event incl. catch-up)"
