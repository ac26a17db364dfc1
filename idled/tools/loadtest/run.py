"""`idled loadtest`: drive a server with real connections and check every presence event it emits.

Theory of operation
-------------------
One run is a *scenario*: N sessions, each either a real TCP connection (``--connections N``) or a session
carried by one of G gateway connections (``--gateways G --sessions S``), that log in at ``--ramp`` per
second, keep alive every ``--keepalive`` seconds (with jitter), and -- according to a plan fixed by a seed
before the run (`idled.tools.loadtest.stats.make_plan`) -- a ``--silent-fraction`` of them stop at a known moment and a
``--bye-fraction`` log out. The coordinator (this module, one trio loop) does, in order:

1. gets a server: spawns ``idled serve`` on 127.0.0.1, port 0 (``--spawn``, server flags after ``--`` or in
   ``--server-args``) or uses ``--target HOST:PORT`` (loopback only);
2. connects the observer and subscribes, then *fences* (a probe login whose online event must come back)
   so the subscription is provably live before any session exists;
3. starts the worker processes (``python -m idled.tools.loadtest.worker``; each owns every W-th session or
   gateway, at most ~8,000 connections, well under the 20,000 open-file limit, and binds its connections
   to several 127.0.0.x source addresses so ephemeral ports never run out), reads the server's baseline
   RSS, and gives everyone the same start time t0 (wall clock);
4. every second samples the server's CPU and RSS (psutil, its pid and descendants), sums the workers'
   reports, feeds their records (which session fell silent and when its last frame was sent; which said
   bye; which failed to log in) and the observer's events into the `Matcher`, and prints progress;
5. at t0 + ``--duration`` reads the stall metric, fences again (every event up to now has been matched),
   closes the observer, stops the workers, stops a spawned server, and judges: false offlines, missed
   offlines, lateness histograms, ping rate, connect latency, errors, CPU / RSS.

The silent moments lie in a window that ends ``timeout + 2 ticks + margin`` before the end, so every silent
session must have been reported offline before the measurement stops; `--duration` that leaves no such
window is refused up front. ``--compare ring,scan,heap`` runs the same scenario (same seed, same plan) once
per detector, each against a freshly spawned server, and prints them side by side with the ratios of the
ring's figures to each baseline's.

The JSON document (``--json``) holds the configuration, the verdict, the percentile summaries and an
``.hgrm``-style table of both lateness measures (per generator: ``ts - (last_sent + timeout)``; per server:
``ts - deadline``), the time series, and the targets. Exit status: 0 if every run is correct (no false,
missed or early offlines, nothing lost), 1 if not, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from collections.abc import Callable
from typing import Any, TextIO

import trio

from idled.tools.loadtest import ipc
from idled.tools.loadtest.observer import Observer, ObserverLost
from idled.tools.loadtest.report import clean_json, compare_ratios, compare_text, plot_results, summary_text, targets
from idled.tools.loadtest.target import (
    ProcessSampler, ServerProcess, Sample, describe, find_listening_pid, free_port, parse_stall, scrape_metrics,
    spawn_server, stop_server, STALL_METRIC,
)
from idled.tools.loadtest.stats import Histogram, Matcher, Plan, make_plan, silent_window
from idled.protocol import Event

__all__ = ["Scenario", "add_arguments", "run", "run_scenario", "parse_target", "scenario_from_args", "main"]

MAX_PER_WORKER = 8000  # connections per worker process (open-file limit here: 20,000)
SOURCES_PER = 20000  # connections per loopback source address (ephemeral ports: ~28k per 4-tuple space)
DEFAULT_RAMP_USERS = 1000.0
DEFAULT_RAMP_GATEWAY_SESSIONS = 10000.0


class UsageError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Scenario:
    mode: str  # "users" | "gateways"
    sessions: int
    gateways: int
    workers: int
    sources: tuple[str, ...]
    ramp: float
    keepalive: float
    jitter: float
    silent_fraction: float
    bye_fraction: float
    duration: float
    tick: float
    seed: int
    uid_base: int
    target: tuple[str, int] | None
    spawn: bool
    server_args: tuple[str, ...] = ()
    detector: str | None = None
    server_pid: int | None = None
    metrics_port: int | None = None
    connect_timeout: float = 10.0
    max_inflight: int = 500
    gateway_tick: float = 0.05
    secret_file: str | None = None
    server_log: str | None = None
    sample_interval: float = 1.0
    metrics_interval: float = 5.0
    progress_interval: float = 1.0
    quiet: bool = False
    bound_ticks: float = 2.0
    drain_timeout: float = 30.0

    @property
    def expected_timeout(self) -> float:
        return 1.5 * self.keepalive  # the MQTT rule the server applies (capped by its max_timeout)

    @property
    def ramp_end(self) -> float:
        return self.sessions / self.ramp

    def window(self) -> tuple[float, float]:
        """Where silent and bye moments fall; (0, 0) when no session goes silent or says bye."""
        if not (self.silent_fraction or self.bye_fraction):
            return (0.0, 0.0)
        return silent_window(duration=self.duration, ramp_end=self.ramp_end, timeout=self.expected_timeout,
                             tick=self.tick, bound_ticks=self.bound_ticks)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["expected_timeout"] = self.expected_timeout
        d["ramp_end"] = self.ramp_end
        return d


# -------------------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("server under test (one of)")
    where.add_argument("--target", metavar="HOST:PORT", help="drive a running server (loopback addresses only)")
    where.add_argument("--spawn", action="store_true",
                       help="start `idled serve` on 127.0.0.1 (port 0) for the run; server flags go after `--`")
    where.add_argument("--server-args", default="", metavar="ARGS",
                       help='extra server flags as one shell-quoted string, e.g. "--max-connections 200000"')
    where.add_argument("--server-pid", type=int, metavar="PID",
                       help="with --target: the server's pid for CPU/RSS (default: found from the port)")
    where.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="with --target: the server's Prometheus port, to read "
                            "idled_event_loop_stall_max_seconds (with --spawn a free port is passed to the server)")
    where.add_argument("--server-log", metavar="FILE", help="with --spawn: write the server's output here")
    where.add_argument("--detector", metavar="NAME", help="with --spawn: passed to the server as --detector")
    where.add_argument("--compare", metavar="D1,D2,...",
                       help="run the scenario once per detector (spawning a server each), e.g. ring,scan,heap")

    load = parser.add_argument_group("load")
    load.add_argument("--connections", type=int, default=1000, metavar="N",
                      help="user connections, one uid each (default 1000)")
    load.add_argument("--gateways", type=int, default=0, metavar="G",
                      help="instead of user connections: G gateway connections carrying --sessions in total")
    load.add_argument("--sessions", type=int, default=0, metavar="S", help="sessions carried by the gateways")
    load.add_argument("--ramp", type=float, metavar="PER_S",
                      help=f"new sessions per second (default {DEFAULT_RAMP_USERS:g} connections/s, "
                           f"{DEFAULT_RAMP_GATEWAY_SESSIONS:g} gateway sessions/s)")
    load.add_argument("--keepalive", type=float, default=30.0, metavar="S",
                      help="seconds between keepalives of a session (default 30; server timeout = 1.5x)")
    load.add_argument("--jitter", type=float, default=0.1, metavar="F",
                      help="each interval is keepalive x U(1-F, 1+F) (default 0.1)")
    load.add_argument("--silent-fraction", type=float, default=0.05, metavar="F",
                      help="fraction of sessions that stop pinging at a recorded moment (default 0.05)")
    load.add_argument("--bye-fraction", type=float, default=0.01, metavar="F",
                      help="fraction of sessions that log out with bye / detach (default 0.01)")
    load.add_argument("--duration", type=float, default=120.0, metavar="S",
                      help="length of the measurement from the first connection (default 120)")
    load.add_argument("--tick", type=float, default=1.0, metavar="S",
                      help="the server's tick: bounds missed offlines (timeout + 2 ticks) and the lateness "
                           "target; passed to a spawned server unless its flags set --tick (default 1.0)")
    load.add_argument("--workers", type=int, metavar="W",
                      help=f"worker processes (default: connections / {MAX_PER_WORKER}, rounded up)")
    load.add_argument("--sources", type=int, metavar="K",
                      help="loopback source addresses 127.0.0.2.. (default: one per 20,000 connections, at least 2)")
    load.add_argument("--seed", type=int, default=1, help="seed of the plan (default 1)")
    load.add_argument("--uid-base", type=int, metavar="N",
                      help="session i has uid N+i (default 0 with --spawn, a time-derived base with --target)")
    load.add_argument("--secret-file", metavar="FILE",
                      help="mint login tokens with this secret (server auth on; passed to a spawned server)")
    load.add_argument("--connect-timeout", type=float, default=10.0, metavar="S")
    load.add_argument("--max-inflight", type=int, default=500, metavar="N",
                      help="connections being opened at once per worker (default 500)")
    load.add_argument("--gateway-tick", type=float, default=0.05, metavar="S",
                      help="a gateway batches its touches into slots of this many seconds (default 0.05)")
    load.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                      help="at the end, how long the observer may take to catch up with the server's events "
                           "(sessions keep pinging meanwhile; default 30)")

    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the full result (with .hgrm tables) as JSON")
    out.add_argument("--plot", metavar="FILE.png", help="plot lateness, connections, CPU and RSS (matplotlib)")
    out.add_argument("--quiet", action="store_true", help="no live progress")
    out.add_argument("--check-targets", action="store_true",
                     help="also exit 1 when a sizing target is missed (RSS/connection, lateness p99)")
    parser.add_argument("server_argv", nargs="*", metavar="-- SERVER_ARGS",
                        help="flags passed to `idled serve` (with --spawn / --compare)")


def parse_target(text: str) -> tuple[str, int]:
    """HOST:PORT with HOST a 127.0.0.0/8 address or `localhost`; UsageError otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise UsageError(f"--target must be HOST:PORT, got {text!r}")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise UsageError(f"--target host must be a loopback IPv4 address, got {host!r}") from None
    if addr.version != 4 or not addr.is_loopback:
        raise UsageError(f"only loopback targets are accepted (127.0.0.0/8), got {host}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise UsageError(f"bad port {port}")
    return str(addr), port


def _flag_value(argv: list[str], flag: str) -> str | None:
    for k, a in enumerate(argv):
        if a == flag and k + 1 < len(argv):
            return argv[k + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    server_argv = shlex.split(args.server_args or "") + list(args.server_argv or [])
    spawn = bool(args.spawn or args.compare)
    if args.target and spawn:
        raise UsageError("give either --target or --spawn/--compare, not both")
    if not args.target and not spawn:
        raise UsageError("give --target HOST:PORT or --spawn")
    if server_argv and not spawn:
        raise UsageError("server flags are only used with --spawn / --compare")
    target = parse_target(args.target) if args.target else None
    if args.gateways < 0 or args.sessions < 0 or args.connections < 0:
        raise UsageError("counts must be >= 0")
    if args.gateways:
        mode, sessions = "gateways", args.sessions
        if sessions < 1:
            raise UsageError("--gateways needs --sessions S >= 1")
    else:
        if args.sessions:
            raise UsageError("--sessions needs --gateways G")
        mode, sessions = "users", args.connections
        if sessions < 1:
            raise UsageError("--connections must be >= 1")
    tick = args.tick
    spawned_tick = _flag_value(server_argv, "--tick")
    if spawn and spawned_tick is not None:
        tick = float(spawned_tick)
    if not tick > 0 or not args.keepalive > 0 or not args.duration > 0:
        raise UsageError("--tick, --keepalive and --duration must be > 0")
    if not 0 <= args.jitter < 0.5:
        raise UsageError("--jitter must be in [0, 0.5): a keepalive later than 1.5x would be a real timeout")
    ramp = args.ramp or (DEFAULT_RAMP_USERS if mode == "users" else DEFAULT_RAMP_GATEWAY_SESSIONS)
    if not ramp > 0:
        raise UsageError("--ramp must be > 0")
    conns = sessions if mode == "users" else args.gateways
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    per_worker_limit = max(1, min(nofile - 200, 18000))
    workers = args.workers or max(1, math.ceil(conns / MAX_PER_WORKER))
    if mode == "gateways":
        workers = min(workers if args.workers else min(2, args.gateways), args.gateways)
    if workers < 1 or math.ceil(conns / workers) > per_worker_limit:
        raise UsageError(f"{conns} connections over {workers} workers exceeds {per_worker_limit} per process "
                         f"(open-file limit {nofile}): use more --workers")
    n_sources = args.sources or max(2, math.ceil(conns / SOURCES_PER) + 1)
    if not 1 <= n_sources <= 250:
        raise UsageError("--sources must be 1..250")
    sources = tuple(f"127.0.0.{2 + k}" for k in range(n_sources))
    uid_base = args.uid_base
    if uid_base is None:
        # a fresh base per run against a long-lived server: a uid still online from an earlier run would be a
        # duplicate login (no online event) and wreck the matching
        uid_base = 0 if spawn else (int(time.time()) % 1_000_000) * 10_000_000
    if not (0 <= uid_base and uid_base + sessions < 2**63):
        raise UsageError("--uid-base out of range")
    sc = Scenario(
        mode=mode, sessions=sessions, gateways=args.gateways, workers=workers, sources=sources, ramp=ramp,
        keepalive=args.keepalive, jitter=args.jitter, silent_fraction=args.silent_fraction,
        bye_fraction=args.bye_fraction, duration=args.duration, tick=tick, seed=args.seed, uid_base=uid_base,
        target=target, spawn=spawn, server_args=tuple(server_argv), detector=args.detector,
        server_pid=args.server_pid, metrics_port=args.metrics_port, connect_timeout=args.connect_timeout,
        max_inflight=args.max_inflight, gateway_tick=args.gateway_tick, secret_file=args.secret_file,
        server_log=args.server_log, quiet=args.quiet, drain_timeout=args.drain_timeout,
    )
    if not (0 <= sc.silent_fraction <= 1 and 0 <= sc.bye_fraction <= 1 and sc.silent_fraction + sc.bye_fraction <= 1):
        raise UsageError("--silent-fraction and --bye-fraction must be in [0, 1] and sum to at most 1")
    try:
        sc.window()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return sc


def run(args: argparse.Namespace) -> int:
    try:
        scenario = scenario_from_args(args)
        detectors = [d.strip() for d in args.compare.split(",") if d.strip()] if args.compare else [args.detector]
        if args.compare and len(detectors) < 2:
            raise UsageError("--compare needs at least two detectors, e.g. ring,scan,heap")
    except UsageError as exc:
        print(f"idled loadtest: {exc}", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    try:
        for k, detector in enumerate(detectors):
            if k:
                time.sleep(2.0)  # let the previous server's sockets settle
            results.append(trio.run(run_scenario, replace(scenario, detector=detector)))
            print(summary_text(results[-1]), file=sys.stderr if args.json == "-" else sys.stdout)
    except KeyboardInterrupt:
        print("idled loadtest: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, ObserverLost) as exc:
        print(f"idled loadtest: {exc}", file=sys.stderr)
        return 1
    document: dict[str, Any]
    if len(results) > 1:
        ratios = compare_ratios(results)
        print(compare_text(results, ratios), file=sys.stderr if args.json == "-" else sys.stdout)
        document = {"compare": detectors, "runs": results, "ratios": ratios}
    else:
        document = results[0]
    if args.json:
        text = json.dumps(clean_json(document), indent=1, default=str, allow_nan=False)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text + "\n")
    if args.plot:
        try:
            plot_results(results, args.plot)
        except ImportError as exc:
            print(f"idled loadtest: --plot needs matplotlib ({exc})", file=sys.stderr)
    ok = all(r["ok"] for r in results)
    if args.check_targets:
        ok = ok and all(all(t["pass"] is not False for t in r["targets"].values()) for r in results)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m idled.tools.loadtest.run ...` (the same as `idled loadtest ...`)."""
    parser = argparse.ArgumentParser(prog="idled loadtest", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


# ------------------------------------------------------------------------------------ the coordinator


@dataclass(slots=True)
class _WorkerState:
    index: int
    process: trio.Process
    pid: int
    ready: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    last: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] | None = None
    dead: str | None = None


class _Run:
    """One scenario against one server: the state the coordinator's tasks share."""

    def __init__(self, sc: Scenario, err: TextIO) -> None:
        self.sc = sc
        self.err = err
        window = sc.window()
        self.plan: Plan = make_plan(sc.sessions, silent_fraction=sc.silent_fraction,
                                    bye_fraction=sc.bye_fraction, window=window, seed=sc.seed)
        self.matcher = Matcher(self.plan, sc.uid_base)
        self.secret: bytes | None = None
        if sc.secret_file:
            from idled.protocol.tokens import load_secret

            self.secret = load_secret(sc.secret_file)
        self.workers: list[_WorkerState] = []
        self.samples: list[Sample] = []
        self.client_samples: list[tuple[float, float]] = []  # (wall, cpu seconds of coordinator + workers)
        self.series: dict[str, list[Any]] = {k: [] for k in (
            "t", "connections", "sessions", "pinging", "pings_per_s", "online_events", "offline_events",
            "false_offlines", "server_cpu_percent", "server_rss_bytes", "stall_max_seconds", "host_cpu_percent",
            "client_cpu_percent")}
        self.t0 = 0.0
        self.stall: float | None = None
        self.stall_at_ramp_end: float | None = None
        self.metrics_end: dict[str, float] = {}
        self.ramp_done_at: float | None = None
        self.observer_delay: Callable[[], float | None] | None = None
        self.notes: list[str] = []

    # -- tokens --

    def token(self, role: str, name: str) -> str | None:
        if self.secret is None:
            return None
        from idled.protocol.tokens import mint

        return mint(self.secret, role, name, time.time() + 86400)

    # -- observer callback: keep it cheap, it runs for every event --

    def on_event(self, ev: Event) -> None:
        self.matcher.event(ev.kind, ev.uid, ev.ts, ev.reason, ev.deadline, ev.last_seen)

    # -- workers --

    def owner(self, index: int) -> int:
        sc = self.sc
        return index % sc.workers if sc.mode == "users" else (index % sc.gateways) % sc.workers

    async def start_workers(self, nursery: trio.Nursery, host: str, port: int) -> None:
        sc = self.sc
        plans = self.plan.split(self.owner, sc.workers)
        for w in range(sc.workers):
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "idled.tools.loadtest.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            state = _WorkerState(w, process, process.pid)
            self.workers.append(state)
            cfg = {
                "worker": w, "workers": sc.workers, "mode": sc.mode, "host": host, "port": port,
                "sources": list(sc.sources), "uid_base": sc.uid_base, "sessions": sc.sessions,
                "gateways": sc.gateways, "keepalive": sc.keepalive, "jitter": sc.jitter, "ramp": sc.ramp,
                "connect_timeout": sc.connect_timeout, "max_inflight": sc.max_inflight,
                "gateway_tick": sc.gateway_tick, "seed": sc.seed, "report_interval": 0.5,
                "plan": {i: [kind, moment] for i, (kind, moment) in plans[w].items()},
                "secret": self.secret.hex() if self.secret else None,
                "name": f"loadtest-{os.getpid()}-w{w}",
            }
            assert process.stdin is not None
            await ipc.send(process.stdin, cfg)
            nursery.start_soon(self._read_worker, state)
        with trio.move_on_after(60):
            for state in self.workers:
                await state.ready.wait()
        missing = [s.index for s in self.workers if not s.ready.is_set() or s.dead]
        if missing:
            raise RuntimeError(f"worker(s) {missing} did not start")

    async def _read_worker(self, state: _WorkerState) -> None:
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

    def worker_totals(self) -> dict[str, Any]:
        tot: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        closes: Counter[str] = Counter()
        lag = 0.0
        ramp_done = bool(self.workers)
        timeouts: list[float] = []
        for s in self.workers:
            m = s.final or s.last
            for key in ("conns", "logged_in", "attached", "pinging", "pings", "frames", "pongs", "timeouts_differ"):
                tot[key] += int(m.get(key, 0) or 0)
            errors.update(m.get("errors", {}))
            closes.update(m.get("closes", {}))
            lag = max(lag, float(m.get("lag_max", 0.0) or 0.0))
            ramp_done = ramp_done and bool(m.get("ramp_done"))
            if m.get("timeout") is not None:
                timeouts.append(float(m["timeout"]))
        return {**tot, "errors": errors, "closes": closes, "lag_max": lag, "ramp_done": ramp_done,
                "timeouts": timeouts}

    def worker_pings(self) -> list[tuple[float, int]]:
        """(report wall time, cumulative keepalives) of each worker's latest report."""
        return [(float(s.last.get("wall", 0.0)), int(s.last.get("pings", 0))) for s in self.workers]

    async def stop_workers(self) -> None:
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

    # -- sampling --

    def host_cpu(self) -> float:
        """Whole-machine CPU use since the previous call, 0..100 (all cores): is the host saturated?"""
        import psutil

        return float(psutil.cpu_percent(interval=None))

    def client_cpu(self) -> float:
        import psutil

        total = 0.0
        for pid in [os.getpid()] + [s.pid for s in self.workers]:
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def record_sample(self, sample: Sample | None, now: float, prev: dict[str, Any]) -> dict[str, Any]:
        tot = self.worker_totals()
        t = now - self.t0
        dt = now - prev.get("wall", now)
        pings_rate = (tot["pings"] - prev.get("pings", 0)) / dt if dt > 0 else 0.0
        sessions = tot["conns"] if self.sc.mode == "users" else tot["pinging"]
        s = self.series
        s["t"].append(round(t, 3))
        s["connections"].append(tot["conns"])
        s["sessions"].append(sessions)
        s["pinging"].append(tot["pinging"])
        s["pings_per_s"].append(round(pings_rate, 2))
        s["online_events"].append(self.matcher.online_events)
        s["offline_events"].append(self.matcher.offline_events)
        s["false_offlines"].append(self.matcher._pinger_offlines)
        s["server_cpu_percent"].append(None if sample is None else round(sample.cpu_percent, 2))
        s["server_rss_bytes"].append(None if sample is None else sample.rss)
        s["stall_max_seconds"].append(self.stall)
        s["host_cpu_percent"].append(round(self.host_cpu(), 1))
        client = self.client_samples
        s["client_cpu_percent"].append(
            round((client[-1][1] - client[-2][1]) / (client[-1][0] - client[-2][0]) * 100.0, 1)
            if len(client) >= 2 and client[-1][0] > client[-2][0] else None)
        if self.ramp_done_at is None and tot["ramp_done"]:
            self.ramp_done_at = now
        return {"wall": now, "pings": tot["pings"], "tot": tot, "sessions": sessions, "rate": pings_rate}


async def run_scenario(sc: Scenario, err: TextIO | None = None) -> dict[str, Any]:
    """Run one scenario (spawning its server if asked) and return the result document."""
    err = err or sys.stderr
    r = _Run(sc, err)
    server: ServerProcess | None = None
    log_file = open(sc.server_log, "a", encoding="utf-8") if sc.server_log else None  # noqa: SIM115
    try:
        async with trio.open_nursery() as nursery:
            try:
                server = await _get_server(nursery, sc, log_file)
                result = await _drive(r, nursery, server)
            finally:
                with trio.CancelScope(shield=True):
                    for s in r.workers:
                        if s.process.returncode is None:
                            s.process.kill()
                    if server is not None and server.process is not None:
                        await stop_server(server)
                nursery.cancel_scope.cancel()
    finally:
        if log_file is not None:
            log_file.close()
    assert server is not None
    _finish(r, server, result)
    return result


async def _get_server(nursery: trio.Nursery, sc: Scenario, log: TextIO | None) -> ServerProcess:
    if sc.target is not None:
        host, port = sc.target
        pid = sc.server_pid or find_listening_pid(port, host)
        return ServerProcess(host, port, pid, [], None, sc.metrics_port)
    argv = [sys.executable, "-m", "idled.cli.main", "serve", "--host", "127.0.0.1", "--port", "0"]
    user = list(sc.server_args)
    if _flag_value(user, "--tick") is None:
        argv += ["--tick", f"{sc.tick:g}"]
    if sc.detector:
        user = _without_flag(user, "--detector")
        argv += ["--detector", sc.detector]
    metrics_port = None
    if _flag_value(user, "--metrics-port") is None:
        metrics_port = free_port()
        argv += ["--metrics-port", str(metrics_port)]
    elif _flag_value(user, "--metrics-port") != "0":
        metrics_port = int(_flag_value(user, "--metrics-port") or 0) or None
    if sc.secret_file and _flag_value(user, "--secret-file") is None:
        argv += ["--secret-file", sc.secret_file]  # the tokens we mint are for this secret
    if _flag_value(user, "--data-dir") is None:
        # the event log of a throw-away server: a fresh directory, removed when the run ends
        data_dir = tempfile.mkdtemp(prefix="idled-loadtest-")
        nursery.start_soon(_remove_at_exit, data_dir)
        argv += ["--data-dir", data_dir]
    argv += user
    server = await spawn_server(nursery, argv, log=log)
    if server.metrics_port is None:
        server.metrics_port = metrics_port
    host_ip = ipaddress.ip_address(server.host)
    if not host_ip.is_loopback:
        await stop_server(server, grace=5)
        raise RuntimeError(f"the spawned server listens on {server.host}, not loopback: refusing to drive it")
    return server


async def _remove_at_exit(path: str) -> None:
    try:
        await trio.sleep_forever()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _without_flag(argv: list[str], flag: str) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


async def _scrape(r: _Run, port: int | None) -> dict[str, float] | None:
    if not port:
        return None
    try:
        metrics = await trio.to_thread.run_sync(scrape_metrics, port, "127.0.0.1", 5.0, abandon_on_cancel=True)
    except (OSError, ValueError):
        return None
    if STALL_METRIC in metrics:
        r.stall = metrics[STALL_METRIC]
    return metrics


def _say(r: _Run, text: str) -> None:
    if not r.sc.quiet:
        print(text, file=r.err, flush=True)


async def _drive(r: _Run, nursery: trio.Nursery, server: ServerProcess) -> dict[str, Any]:
    sc = r.sc
    sampler: ProcessSampler | None = None
    if server.pid:
        try:
            sampler = ProcessSampler(server.pid)
            sampler.sample()
        except Exception as exc:  # psutil.Error and friends: run without server stats
            r.notes.append(f"cannot sample server pid {server.pid}: {exc}")
            sampler = None
    else:
        r.notes.append("server pid unknown (give --server-pid): no CPU/RSS figures")
    _say(r, f"idled loadtest: server {server.host}:{server.port} pid {server.pid} "
            f"detector {sc.detector or '(server default)'}; {sc.sessions} {sc.mode} sessions"
            + (f" on {sc.gateways} gateways" if sc.mode == "gateways" else "")
            + f", {sc.workers} workers, keepalive {sc.keepalive:g} s, tick {sc.tick:g} s, {sc.duration:g} s")

    # 1. observer first, and prove the subscription is live before any session exists
    observer = Observer(server.host, server.port, r.on_event, token=r.token, keepalive=max(1.0, sc.keepalive))
    await observer.connect()
    observer_scope = trio.CancelScope()

    async def observe() -> None:
        with observer_scope:
            await observer.run()

    nursery.start_soon(observe)
    r.observer_delay = lambda: observer.last_delay
    fence = await observer.fence()
    if fence is None:
        raise ObserverLost(f"the observer saw no event for its probe login ({observer.lost or 'timeout'})")

    # 2. workers, baseline, start
    await r.start_workers(nursery, server.host, server.port)
    base_sample = sampler.sample() if sampler else None
    await _scrape(r, server.metrics_port)
    r.t0 = time.time() + 0.5
    r.matcher.t0_wall = r.t0
    for s in r.workers:
        assert s.process.stdin is not None
        await ipc.send(s.process.stdin, {"t": "start", "t0": r.t0})
    await trio.sleep(max(0.0, r.t0 - time.time()))
    start_sample = sampler.sample() if sampler else None
    client_cpu0 = r.client_cpu()
    r.client_samples.append((time.time(), client_cpu0))

    # 3. the measurement
    end = r.t0 + sc.duration
    prev = r.record_sample(start_sample, time.time(), {"wall": time.time(), "pings": 0})
    next_metrics = time.time() + sc.metrics_interval
    next_progress = time.time()
    steady_mark: tuple[float, Sample | None, list[tuple[float, int]]] | None = None  # when the ramp ended
    server_gone = False
    tty = r.err.isatty()
    while True:
        now = time.time()
        if now >= end:
            break
        await trio.sleep(min(sc.sample_interval, end - now))
        now = time.time()
        sample = sampler.sample() if sampler else None
        if sampler and sample is None:
            server_gone = True
        if sample is not None:
            r.samples.append(sample)
        r.client_samples.append((now, r.client_cpu()))
        prev = r.record_sample(sample, now, prev)
        if steady_mark is None and r.ramp_done_at is not None:
            steady_mark = (now, sample, r.worker_pings())
            await _scrape(r, server.metrics_port)
            r.stall_at_ramp_end = r.stall
        if now >= next_metrics:
            next_metrics = now + sc.metrics_interval
            await _scrape(r, server.metrics_port)
        if now >= next_progress and not sc.quiet:
            next_progress = now + (sc.progress_interval if tty else 5.0 * sc.progress_interval)
            line = _progress(r, prev, sample, now)
            print(("\r" + line + "\x1b[K") if tty else line, end="" if tty else "\n", file=r.err, flush=True)
        if observer.lost or server_gone or all(s.dead for s in r.workers):
            break
    if tty and not sc.quiet:
        print(file=r.err)
    aborted = None
    if observer.lost:
        aborted = f"observer lost: {observer.lost}"
    elif server_gone:
        aborted = "the server exited during the run"
    elif all(s.dead for s in r.workers):
        aborted = "every worker died"

    # 4. end of the measurement: stall, last sample, final fence, then teardown
    end_wall = time.time()
    metrics_end = await _scrape(r, server.metrics_port)
    r.metrics_end = metrics_end or {}
    end_sample = sampler.sample() if sampler else None
    pings_end = r.worker_pings()
    client_cpu1 = r.client_cpu()
    fence_end = None if aborted else await observer.fence(timeout=sc.drain_timeout)
    cutoff = end_wall
    if fence_end is None and not aborted:
        aborted = f"the final fence failed ({observer.lost or 'timeout'})"
    observer_scope.cancel()
    await observer.aclose()
    await r.stop_workers()
    final_lines: list[str] = []
    if server.process is not None:
        await stop_server(server)
        final_lines = list(server.tail)

    # 5. judge
    tot = r.worker_totals()
    timeout = (tot["timeouts"][0] if tot["timeouts"] else None) or r.matcher.first_timeout or sc.expected_timeout
    verdict = r.matcher.judge(timeout=timeout, tick=sc.tick, cutoff=cutoff, bound_ticks=sc.bound_ticks)
    connect = Histogram()
    login = Histogram()
    for s in r.workers:
        if s.final:
            connect.merge(Histogram.from_dict(s.final["connect_hist"]))
            login.merge(Histogram.from_dict(s.final["login_hist"]))

    # ping rate over the steady part (ramp done .. end)
    # (each worker's count over its own report times: reports are up to half a second old)
    achieved = target_rate = None
    if steady_mark is not None and end_wall > steady_mark[0]:
        w0, _, p0 = steady_mark
        achieved = sum((c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in zip(p0, pings_end) if t1 > t0)
        ts, pinging = r.series["t"], r.series["pinging"]
        pts = [p for t, p in zip(ts, pinging) if t + r.t0 >= w0]
        target_rate = (sum(pts) / len(pts) / sc.keepalive) if pts else None

    server_stats = _server_stats(r, base_sample, start_sample, end_sample, steady_mark, end_wall, tot)
    server_stats["stall_max_seconds"] = r.stall
    # the metric is a running maximum: if it grew after the ramp, its final value is the steady state's
    # largest stall; if not, the steady state's was at most the value at the ramp's end
    server_stats["stall_max_seconds_at_ramp_end"] = r.stall_at_ramp_end
    server_stats["stall_max_seconds_steady"] = (
        r.stall if (r.stall is not None and r.stall_at_ramp_end is not None and r.stall > r.stall_at_ramp_end)
        else None)
    server_stats["stall_max_seconds_final_log"] = parse_stall(final_lines[-20:]) if final_lines else None
    server_stats["final_log_lines"] = final_lines[-5:]
    client_window = end_wall - r.t0
    result: dict[str, Any] = {
        # correct *and* complete: a session that could not even log in is a failed run, though not a
        # presence error (the errors say why: refused, busy, timeout, ...)
        "ok": verdict.ok and aborted is None and fence is not None and verdict.failed_logins == 0,
        "aborted": aborted,
        "detector": sc.detector or _flag_value(list(sc.server_args), "--detector"),
        "scenario": sc.describe(),
        "server": {**describe(server), **server_stats},
        "t0": r.t0,
        "end": end_wall,
        "timeout": timeout,
        "verdict": verdict.to_dict(),
        "lateness": {
            "generator": {**verdict.lateness_generator.summary(), "hgrm": verdict.lateness_generator.hgrm()},
            "server": {**verdict.lateness_server.summary(), "hgrm": verdict.lateness_server.hgrm()},
            "deadline_shift": verdict.deadline_shift.summary(),
        },
        "lateness_hgrm_text": verdict.lateness_generator.hgrm_text(),
        "ping_rate": {
            "target_per_s": target_rate, "achieved_per_s": achieved,
            "ratio": (achieved / target_rate) if (achieved is not None and target_rate) else None,
            "client_lag_max_seconds": tot["lag_max"],
        },
        "connect_latency": connect.summary(),
        "login_latency": login.summary(),
        "connections": {
            "logged_in": tot["logged_in"], "failed": verdict.failed_logins, "attached": tot["attached"],
            "peak": max(r.series["connections"], default=0), "peak_sessions": max(r.series["sessions"], default=0),
        },
        "errors": dict(tot["errors"]),
        "closes": dict(tot["closes"]),
        "observer": {"events": observer.events, "seq_gaps": observer.seq_gaps, "lost": observer.lost,
                     "seq_duplicates": observer.seq_duplicates, "resubscribes": observer.resubscribes,
                     "reads": observer.reads,
                     "fence_start_seconds": fence, "fence_end_seconds": fence_end,
                     "delivery_delay": observer.delivery.summary()},
        "host": _host_summary(r),
        "client": {"workers": sc.workers, "cpu_percent_mean":
                   ((client_cpu1 - client_cpu0) / client_window * 100.0) if client_window > 0 else None,
                   "frames": tot["frames"], "pongs": tot["pongs"],
                   "timeouts_differ": tot["timeouts_differ"]},
        "workers_dead": {s.index: s.dead for s in r.workers if s.dead},
        "metrics_end": {k: v for k, v in r.metrics_end.items() if "bucket" not in k},
        "timeseries": r.series,
        "notes": r.notes,
    }
    if observer.seq_gaps:
        result["ok"] = False
        result["aborted"] = result["aborted"] or f"the observer missed {observer.seq_gaps} events (sequence gaps)"
    return result


def _server_stats(r: _Run, base: Sample | None, start: Sample | None, end: Sample | None,
                  steady_mark: tuple[float, Sample | None, int] | None, end_wall: float,
                  tot: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu_percent_mean": None, "cpu_percent_steady": None, "cpu_percent_max": None,
                           "cpu_seconds": None, "rss_base_bytes": None, "rss_peak_bytes": None,
                           "rss_end_bytes": None, "rss_per_session_bytes": None, "rss_total_per_session_bytes": None}
    if start is None or end is None:
        return out
    window = end.wall - start.wall
    out["cpu_seconds"] = end.cpu_seconds - start.cpu_seconds
    out["cpu_percent_mean"] = out["cpu_seconds"] / window * 100.0 if window > 0 else None
    if steady_mark is not None and steady_mark[1] is not None and end.wall > steady_mark[1].wall:
        s0 = steady_mark[1]
        out["cpu_percent_steady"] = (end.cpu_seconds - s0.cpu_seconds) / (end.wall - s0.wall) * 100.0
        out["cpu_seconds_steady"] = end.cpu_seconds - s0.cpu_seconds
    out["cpu_percent_max"] = max((s.cpu_percent for s in r.samples), default=None)
    rss_base = (base or start).rss
    rss_peak = max([s.rss for s in r.samples] + [end.rss])
    peak_sessions = max(r.series["sessions"], default=0)
    out["rss_base_bytes"] = rss_base
    out["rss_peak_bytes"] = rss_peak
    out["rss_end_bytes"] = end.rss
    if peak_sessions:
        out["rss_per_session_bytes"] = (rss_peak - rss_base) / peak_sessions
        out["rss_total_per_session_bytes"] = rss_peak / peak_sessions
    out["per"] = "connection" if r.sc.mode == "users" else "gateway session"
    return out


def _host_summary(r: _Run) -> dict[str, Any]:
    """How busy the whole machine was: figures taken on a saturated host describe the host, not idled."""
    cpu = [c for c in r.series["host_cpu_percent"][1:] if c is not None]
    out: dict[str, Any] = {"cpus": os.cpu_count(), "load_average_end": list(os.getloadavg()),
                           "cpu_percent_mean": (sum(cpu) / len(cpu)) if cpu else None,
                           "cpu_percent_max": max(cpu, default=None)}
    if cpu and sum(cpu) / len(cpu) > 90.0:
        r.notes.append(f"the host's CPUs were {sum(cpu) / len(cpu):.0f}% busy on average during the run "
                       f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs): other processes "
                       "competed with the server and the generator; figures may reflect the host, not idled")
    return out


def _finish(r: _Run, server: ServerProcess, result: dict[str, Any]) -> None:
    if server.returncode not in (None, 0):
        result["notes"].append(f"the server exited with status {server.returncode}")
    if result["server"].get("stall_max_seconds") is None:
        result["server"]["stall_max_seconds"] = result["server"].get("stall_max_seconds_final_log")
    result["targets"] = targets(result)


def _progress(r: _Run, prev: dict[str, Any], sample: Sample | None, now: float) -> str:
    tot = prev["tot"]
    sc = r.sc
    up = f"conns {tot['conns']}/{sc.sessions}" if sc.mode == "users" else \
        f"gw {tot['conns']}/{sc.gateways} sessions {tot['pinging']}/{sc.sessions}"
    srv = "" if sample is None else f" | server cpu {sample.cpu_percent:5.1f}% rss {sample.rss / 2**20:7.1f} MiB"
    stall = "" if r.stall is None else f" stall {r.stall * 1e3:.1f} ms"
    m = r.matcher
    errors = sum(tot["errors"].values())
    host = r.series["host_cpu_percent"][-1] if r.series["host_cpu_percent"] else None
    delay = r.observer_delay() if r.observer_delay else None
    behind = "" if delay is None or delay < 1.0 else f" (observer {delay:.1f} s behind)"
    return (f"[{now - r.t0:6.1f}s] {up} pings/s {prev['rate']:7.1f} online {m.online_events} "
            f"offline {m.offline_events}{behind} (false {m._pinger_offlines}) errors {errors}{srv}{stall}"
            + ("" if host is None else f" | host cpu {host:.0f}%"))


if __name__ == "__main__":
    sys.exit(main())
