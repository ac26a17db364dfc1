"""The load-test coordinator: one scenario against one server, from the first connection to the result.

Theory of operation
-------------------
One run is a *scenario* (`idled.tools.loadtest.scenario`): N sessions, each either a real TCP connection or a
session carried by one of G gateway connections, that log in at ``ramp`` per second, keep alive every
``keepalive`` seconds (with jitter), and -- according to a plan fixed by a seed before the run
(`idled.tools.loadtest.stats.make_plan`) -- a fraction of them stop at a known moment and a fraction log
out. The coordinator (this module, one trio loop) does, in order:

1. gets a server: spawns ``idled serve`` on 127.0.0.1, port 0, or uses the ``--target`` (loopback only);
2. connects the observer and subscribes, then *fences* (a probe login whose online event must come back)
   so the subscription is provably live before any session exists;
3. starts the worker processes (`idled.tools.loadtest.pool`; each owns every W-th session or gateway, at
   most ~8,000 connections, well under the 20,000 open-file limit, and binds its connections to several
   127.0.0.x source addresses so ephemeral ports never run out), reads the server's baseline RSS, and gives
   everyone the same start time t0 (wall clock);
4. every second samples the server's CPU and RSS (psutil, its pid and descendants), sums the workers'
   reports (whose records reach the `Matcher` as they arrive, as do the observer's events), and prints
   progress;
5. at t0 + ``duration`` reads the stall metric, fences again (every event up to now has been matched),
   closes the observer, stops the workers, stops a spawned server, and hands everything to
   `idled.tools.loadtest.results`, which judges: false offlines, missed offlines, lateness histograms, ping
   rate, connect latency, errors, CPU / RSS, and the sizing targets.

The silent moments lie in a window that ends ``timeout + 2 ticks + margin`` before the end, so every silent
session must have been reported offline before the measurement stops. The command line (`idled.cli.loadtest`)
builds the scenario, runs it once per detector for ``--compare``, and prints and writes the results.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import IO, Any, TextIO

import trio

from idled.ops.fatal import exception_leaves
from idled.protocol.address import format_address
from idled.tools.loadtest.connect import connect_reason
from idled.tools.loadtest.mosquitto import spawn_mosquitto
from idled.tools.loadtest.observer import Observer, ObserverLost
from idled.tools.loadtest.results import Window, build_result, finish
from idled.tools.loadtest.scenario import Scenario
from idled.tools.loadtest.state import RunState
from idled.tools.loadtest.target import ProcessSampler, ServerProcess, get_server, stop_server

__all__ = ["run_scenario", "RunFailed"]


class RunFailed(RuntimeError):
    """The run could not be carried out (the target is unreachable, a worker did not start, ...)."""


async def run_scenario(sc: Scenario, err: TextIO | None = None) -> dict[str, Any]:
    """Run one scenario (spawning its server if asked) and return the result document.

    Raises RunFailed (or OSError, ObserverLost) when the run cannot be carried out.
    """
    r = RunState(sc, err or sys.stderr)
    server: ServerProcess | None = None
    # Blocking, but once before the run starts; it must outlive the nursery below, hence no `with`.
    log_file = open(sc.server_log, "a", encoding="utf-8") if sc.server_log else None  # noqa: SIM115, ASYNC230
    try:
        async with trio.open_nursery() as nursery:
            try:
                server = await (spawn_mosquitto(nursery) if sc.wire == "mqtt" else get_server(nursery, sc, log_file))
                result = await _drive(r, nursery, server)
            finally:
                with trio.CancelScope(shield=True):
                    r.pool.kill()
                    if server is not None and server.process is not None:
                        await stop_server(server)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # a nursery wraps even its body's exception: hand the caller the one failure there was
        leaves = [e for e in exception_leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(leaves) == 1:
            raise leaves[0] from None
        raise
    finally:
        if log_file is not None:
            log_file.close()
    assert server is not None
    finish(server, result)
    return result



def _sampler(r: RunState, server: ServerProcess) -> ProcessSampler | None:
    if not server.pid:
        r.notes.append("server pid unknown (give --server-pid): no CPU/RSS figures")
        return None
    try:
        sampler = ProcessSampler(server.pid)
        sampler.sample()
    except Exception as exc:  # psutil.Error and friends: run without server stats
        r.notes.append(f"cannot sample server pid {server.pid}: {exc}")
        return None
    return sampler


async def _drive(r: RunState, nursery: trio.Nursery, server: ServerProcess) -> dict[str, Any]:
    sc = r.sc
    sampler = _sampler(r, server)
    what = "mosquitto" if sc.wire == "mqtt" else f"detector {sc.detector or '(server default)'}"
    r.say(f"idled loadtest: server {format_address((server.host, server.port))} pid {server.pid} "
          f"{what}; {sc.sessions} {sc.mode} sessions"
          + (f" on {sc.gateways} gateways" if sc.mode == "gateways" else "")
          + f", {sc.workers} workers, keepalive {sc.keepalive:g} s, tick {sc.tick:g} s, {sc.duration:g} s")
    w = Window()
    # (MQTT has no observer: the workers report each CONNACK and each close as the events, `pool`)
    observer, observer_scope = (None, None) if sc.wire == "mqtt" else await _start_observer(r, nursery, server, w)
    await _start_workers(r, nursery, server, sampler, w)
    await _measure(r, server, sampler, observer, w)
    await _wind_down(r, server, sampler, observer, observer_scope, w)
    return build_result(r, w, observer, server)


async def _start_observer(r: RunState, nursery: trio.Nursery, server: ServerProcess,
                          w: Window) -> tuple[Observer, trio.CancelScope]:
    """Connect and subscribe, then prove the subscription is live before any session exists."""
    observer = Observer(server.host, server.port, r.on_event, token=r.token, keepalive=max(1.0, r.sc.keepalive),
                        front=r.sc.front)
    try:
        await observer.connect()
    except OSError as exc:
        raise RunFailed(f"cannot connect to {format_address((server.host, server.port))}: {connect_reason(exc)}") from None
    scope = trio.CancelScope()

    async def observe() -> None:
        with scope:
            await observer.run()

    nursery.start_soon(observe)
    r.observer_delay = lambda: observer.last_delay
    w.fence = await observer.fence()
    if w.fence is None:
        raise ObserverLost(f"the observer saw no event for its probe login ({observer.lost or 'timeout'})")
    return observer, scope


async def _start_workers(r: RunState, nursery: trio.Nursery, server: ServerProcess,
                         sampler: ProcessSampler | None, w: Window) -> None:
    """Workers up, the server's baseline read, then everyone starts at the same wall time t0."""
    await r.pool.start(nursery, server.host, server.port)
    w.base_sample = sampler.sample() if sampler else None
    await r.scrape(server.metrics_port)
    r.t0 = time.time() + 0.5
    r.matcher.t0_wall = r.t0
    await r.pool.send_all({"t": "start", "t0": r.t0})
    await trio.sleep(max(0.0, r.t0 - time.time()))
    w.start_sample = sampler.sample() if sampler else None
    w.client_cpu0 = r.client_cpu()
    w.coordinator_cpu0 = _own_cpu()
    r.client_samples.append((time.time(), w.client_cpu0))


async def _measure(r: RunState, server: ServerProcess, sampler: ProcessSampler | None, observer: Observer | None,
                   w: Window) -> None:
    """One sample per second until t0 + duration, or until the run cannot go on (w.aborted says why)."""
    sc = r.sc
    end = r.t0 + sc.duration
    prev = r.record_sample(w.start_sample, time.time(), {"wall": time.time(), "pings": 0})
    next_metrics = time.time() + sc.metrics_interval
    next_progress = time.time()
    server_gone = False
    tty = r.err.isatty()
    while (now := time.time()) < end:
        await trio.sleep(min(sc.sample_interval, end - now))
        now = time.time()
        sample = sampler.sample() if sampler else None
        if sampler and sample is None:
            server_gone = True
        if sample is not None:
            r.samples.append(sample)
        r.client_samples.append((now, r.client_cpu()))
        prev = r.record_sample(sample, now, prev)
        if w.steady_mark is None and r.ramp_done_at is not None:
            w.steady_mark = (now, sample, r.pool.pings())
            w.ramp_logins = prev["tot"]["logged_in" if sc.mode == "users" else "attached"]
            await r.scrape(server.metrics_port)
            r.stall_at_ramp_end = r.stall
        elif w.rate_mark is None and w.steady_mark is not None and now >= w.steady_mark[0] + sc.settle:
            w.rate_mark = (now, sample, r.pool.pings())
        if w.peer_mark is None and sc.steady_from is not None and now >= r.t0 + sc.steady_from:
            w.peer_mark = (now, sample, r.pool.pings())  # --peer: the steady window starts (peer.py)
        if now >= next_metrics:
            next_metrics = now + sc.metrics_interval
            await r.scrape(server.metrics_port)
        if now >= next_progress and not sc.quiet:
            next_progress = now + (sc.progress_interval if tty else 5.0 * sc.progress_interval)
            _print_progress(r.progress(prev, sample, now), tty, r.err)
        if (observer is not None and observer.lost) or server_gone or r.pool.all_dead():
            break
    if tty and not sc.quiet:
        print(file=r.err)
    if observer is not None and observer.lost:
        w.aborted = f"observer lost: {observer.lost}"
    elif server_gone:
        w.aborted = "the server exited during the run"
    elif r.pool.all_dead():
        w.aborted = "every worker died"


def _own_cpu() -> float:
    """CPU seconds of this process (the coordinator: observer, sampler, matcher), apart from the workers."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _print_progress(line: str, tty: bool, err: IO[str]) -> None:
    print(("\r" + line + "\x1b[K") if tty else line, end="" if tty else "\n", file=err, flush=True)


async def _wind_down(r: RunState, server: ServerProcess, sampler: ProcessSampler | None, observer: Observer | None,
                     observer_scope: trio.CancelScope | None, w: Window) -> None:
    """End of the measurement: last sample, stall, final fence, then teardown (observer, workers, server)."""
    w.end_wall = time.time()
    w.end_sample = sampler.sample() if sampler else None  # (before the scrape: its CPU is ours, not the load's)
    w.pings_end = r.pool.pings()
    w.client_cpu1 = r.client_cpu()
    w.coordinator_cpu1 = _own_cpu()
    r.metrics_end = await r.scrape(server.metrics_port) or {}
    if observer is not None and observer_scope is not None:
        if w.aborted is None:
            w.fence_end = await observer.fence(timeout=r.sc.drain_timeout)
            if w.fence_end is None:
                w.aborted = f"the final fence failed ({observer.lost or 'timeout'})"
        observer_scope.cancel()
        await observer.aclose()
    await r.pool.stop()  # (MQTT: the workers' final reports carry the last closes)
    if server.process is not None:
        await stop_server(server)
        w.final_lines = list(server.tail)

