"""The load test's worker processes, seen from the coordinator: start them, read their reports, stop them.

Theory of operation
-------------------
`WorkerPool.start` runs ``python -m idled.tools.loadtest.worker`` once per worker, writes each its
configuration (its share of the plan: worker w owns every session, or every gateway, with index = w mod W)
on its stdin and waits for every ``ready``. One reader task per worker then takes its reports as they come
and feeds the records in them -- which session fell silent and when its last frame was sent, which said
bye, which never logged in, which pinger the server closed and when it last sent, which late session
delayed a keepalive -- straight into the `Matcher`; the latest report of each worker is kept for
the totals and the progress line. `stop` sends ``stop``, closes the pipes, waits for the final reports (with
the latency histograms) and reaps the processes, killing any that linger.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import trio

from idled.tools.loadtest import ipc
from idled.tools.loadtest.scenario import Scenario
from idled.tools.loadtest.stats import Matcher, Plan

__all__ = ["WorkerState", "WorkerPool", "START_TIMEOUT"]

START_TIMEOUT = 60.0  # seconds for every worker to say ready (imports on a loaded host are slow)


@dataclass(slots=True)
class WorkerState:
    index: int
    process: trio.Process
    pid: int
    ready: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    last: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] | None = None
    dead: str | None = None


class WorkerPool:
    def __init__(self, sc: Scenario, plan: Plan, matcher: Matcher, secret: bytes | None) -> None:
        self.sc = sc
        self.plan = plan
        self.matcher = matcher
        self.secret = secret
        self.workers: list[WorkerState] = []

    def owner(self, index: int) -> int:
        sc = self.sc
        return index % sc.workers if sc.mode == "users" else (index % sc.gateways) % sc.workers

    def _config(self, w: int, host: str, port: int, plan: dict[int, tuple[int, float]]) -> dict[str, Any]:
        sc = self.sc
        return {
            "worker": w, "workers": sc.workers, "mode": sc.mode, "host": host, "port": port,
            "sources": list(sc.sources), "uid_base": sc.uid_base, "sessions": sc.sessions,
            "gateways": sc.gateways, "keepalive": sc.keepalive, "jitter": sc.jitter, "ramp": sc.ramp,
            "ping_every": sc.ping_every, "ask_one_in": sc.ask_one_in, "late_by": sc.late_by, "devices": sc.devices,
            "max_seconds": sc.duration + sc.drain_timeout + 120.0,  # the worker's own bound on its life
            "connect_timeout": sc.connect_timeout, "max_inflight": sc.max_inflight,
            "gateway_tick": sc.gateway_tick, "user_tick": sc.user_tick, "seed": sc.seed, "report_interval": 0.5,
            # (index, kind, moment) triples: the pipe's decoder takes string map keys only
            "plan": [[i, kind, moment] for i, (kind, moment) in plan.items()],
            "secret": self.secret.hex() if self.secret else None,
            "name": f"loadtest-{os.getpid()}-w{w}",
            **sc.front,  # TLS and PROXY, for connect.open_from
            "wire": sc.wire,  # what the user connections speak (wire.py)
        }

    async def start(self, nursery: trio.Nursery, host: str, port: int) -> None:
        sc = self.sc
        plans = self.plan.split(self.owner, sc.workers)
        for w in range(sc.workers):
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "idled.tools.loadtest.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            state = WorkerState(w, process, process.pid)
            self.workers.append(state)
            assert process.stdin is not None
            await ipc.send(process.stdin, self._config(w, host, port, plans[w]))
            nursery.start_soon(self._read, state)
        with trio.move_on_after(START_TIMEOUT):
            for state in self.workers:
                await state.ready.wait()
        missing = [s.index for s in self.workers if not s.ready.is_set() or s.dead]
        if missing:
            raise RuntimeError(f"worker(s) {missing} did not start")

    async def send_all(self, message: dict[str, Any]) -> None:
        for s in self.workers:
            assert s.process.stdin is not None
            await ipc.send(s.process.stdin, message)

    async def _read(self, state: WorkerState) -> None:
        assert state.process.stdout is not None
        reader = ipc.Reader(state.process.stdout)
        matcher = self.matcher
        try:
            while True:
                msg = await reader.recv()
                if msg is None:
                    break
                t = msg.get("t")
                if t == "ready":
                    state.ready.set()
                    continue
                for i, last_sent in msg.get("silent", ()):
                    matcher.silent(i, last_sent)
                for i, sent in msg.get("bye", ()):
                    matcher.bye(i, sent)
                for i in msg.get("failed", ()):
                    matcher.failed(i)
                for i, sent_prev, sent_last, at, how in msg.get("closed", ()):
                    matcher.closed(i, sent_prev, sent_last, at, how)
                for i, last_sent, planned in msg.get("late", ()):
                    matcher.late(i, last_sent, planned)
                self._events(msg)
                state.last = msg
                if t == "final":
                    state.final = msg
                    break
        except (ipc.IpcError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            state.dead = f"pipe: {exc}"
        finally:
            if state.final is None and state.dead is None:
                state.dead = "exited without a final report"
            state.ready.set()
            state.done.set()

    def _events(self, msg: dict[str, Any]) -> None:
        """MQTT: the workers' record of each CONNACK and each close, fed to the matcher as the events an
        observer would have seen (one device per uid: `idled.cli.loadtest` refuses --devices with --peer)."""
        matcher, base = self.matcher, self.sc.uid_base
        if msg.get("online"):
            now = time.time()
            timeout = self.sc.expected_timeout
            for i in msg["online"]:
                matcher.event("online", base + i, now, "login", now + timeout, now)
        for i, at, reason, deadline, last in msg.get("offline", ()):
            matcher.event("offline", base + i, at, reason, deadline, last)

    def all_dead(self) -> bool:
        return all(s.dead for s in self.workers)

    def totals(self) -> dict[str, Any]:
        """The workers' latest (or final) reports, summed."""
        tot: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        closes: Counter[str] = Counter()
        lag = 0.0
        ramp_done = bool(self.workers)
        timeouts: list[float] = []
        for s in self.workers:
            m = s.final or s.last
            for key in ("conns", "logged_in", "attached", "pinging", "pings", "frames", "pongs",
                        "timeouts_differ"):
                tot[key] += int(m.get(key, 0) or 0)
            errors.update(m.get("errors", {}))
            closes.update(m.get("closes", {}))
            lag = max(lag, float(m.get("lag_max", 0.0) or 0.0))
            ramp_done = ramp_done and bool(m.get("ramp_done"))
            if m.get("timeout") is not None:
                timeouts.append(float(m["timeout"]))
        return {**tot, "errors": errors, "closes": closes, "lag_max": lag, "ramp_done": ramp_done,
                "timeouts": timeouts}

    def pings(self) -> list[tuple[float, int]]:
        """(report wall time, cumulative keepalives) of each worker's latest report."""
        return [(float(s.last.get("wall", 0.0)), int(s.last.get("pings", 0))) for s in self.workers]

    def finals(self) -> list[dict[str, Any]]:
        return [s.final for s in self.workers if s.final]

    async def stop(self) -> None:
        for s in self.workers:
            try:
                assert s.process.stdin is not None
                await ipc.send(s.process.stdin, {"t": "stop"})
                await s.process.stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        with trio.move_on_after(60):
            for s in self.workers:
                await s.done.wait()
        for s in self.workers:
            with trio.move_on_after(10):
                await s.process.wait()
            if s.process.returncode is None:
                s.process.kill()
                await s.process.wait()

    def kill(self) -> None:
        """Last resort on the way out (no waiting: may run inside a cancelled scope)."""
        for s in self.workers:
            if s.process.returncode is None:
                s.process.kill()
