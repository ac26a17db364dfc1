"""The result document of one load-test run, built from what the coordinator collected.

Theory of operation
-------------------
The coordinator hands over its `RunState` (plan, matcher, workers' reports, samples, series), the
`Window` (the samples and moments that bound the measurement: start, ramp end, end, the fences) and the
observer. `build_result` settles the matcher (`Matcher.judge`) and turns everything into one plain dict --
the document `--json` writes. `finish` adds the sizing targets and the verdict: ``ok`` is true only when
the run completed, every event was right (``correct``), and no target FAILED, so the text summary, the
comparison table and the exit status all say the same thing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from idled.tools.loadtest.genstats import generator_figures
from idled.tools.loadtest.histogram import Histogram
from idled.tools.loadtest.observer import Observer
from idled.tools.loadtest.rates import phase, reported_rate
from idled.tools.loadtest.report import targets
from idled.tools.loadtest.scenario import Scenario, flag_value
from idled.tools.loadtest.state import RunState
from idled.tools.loadtest.target import Sample, ServerProcess, describe, parse_stall

__all__ = ["Window", "build_result", "finish"]


@dataclass(slots=True)
class Window:
    """The measurement's bounds, as the coordinator saw them."""

    base_sample: Sample | None = None  # before the workers start (RSS baseline)
    start_sample: Sample | None = None  # at t0
    end_sample: Sample | None = None
    steady_mark: tuple[float, Sample | None, list[tuple[float, int]]] | None = None  # when the ramp ended
    ramp_logins: int = 0  # sessions logged in (attached) by then
    rate_mark: tuple[float, Sample | None, list[tuple[float, int]]] | None = None  # keepalive phase start
    peer_mark: tuple[float, Sample | None, list[tuple[float, int]]] | None = None  # --peer: steady window start
    end_wall: float = 0.0
    pings_end: list[tuple[float, int]] = field(default_factory=list)
    client_cpu0: float = 0.0  # coordinator + workers (psutil)
    client_cpu1: float = 0.0
    coordinator_cpu0: float = 0.0  # the coordinator alone (getrusage)
    coordinator_cpu1: float = 0.0
    fence: float | None = None
    fence_end: float | None = None
    aborted: str | None = None
    final_lines: list[str] = field(default_factory=list)


def build_result(r: RunState, w: Window, observer: Observer | None, server: ServerProcess) -> dict[str, Any]:
    sc = r.sc
    tot = r.pool.totals()
    timeout = (tot["timeouts"][0] if tot["timeouts"] else None) or r.matcher.first_timeout or sc.expected_timeout
    verdict = r.matcher.judge(timeout=timeout, tick=sc.tick, cutoff=w.end_wall, bound_ticks=sc.bound_ticks)
    connect = Histogram()
    login = Histogram()
    for final in r.pool.finals():
        connect.merge(Histogram.from_dict(final["connect_hist"]))
        login.merge(Histogram.from_dict(final["login_hist"]))
    client_window = w.end_wall - r.t0
    aborted = w.aborted
    if observer is not None and observer.seq_gaps:
        aborted = aborted or f"the observer missed {observer.seq_gaps} events (sequence gaps)"
    return {
        # correct *and* complete: a session that could not even log in is a failed run, though not a
        # presence error (the errors say why: refused, busy, timeout, ...). `finish` adds the targets.
        "ok": verdict.ok and aborted is None and (w.fence is not None or observer is None)
        and verdict.failed_logins == 0,
        "wire": sc.wire,
        "aborted": aborted,
        "detector": sc.detector or flag_value(list(sc.server_args), "--detector"),
        "scenario": sc.describe(),
        "server": {**describe(server), **_server_stats(r, w)},
        "t0": r.t0,
        "end": w.end_wall,
        "timeout": timeout,
        "verdict": verdict.to_dict(),
        "lateness": {
            "generator": {**verdict.lateness_generator.summary(), "hgrm": verdict.lateness_generator.hgrm()},
            "server": {**verdict.lateness_server.summary(), "hgrm": verdict.lateness_server.hgrm()},
            "deadline_shift": verdict.deadline_shift.summary(),
        },
        "lateness_hgrm_text": verdict.lateness_generator.hgrm_text(),
        "ping_rate": _ping_rate(r, w, tot),
        "phases": _phases(w),
        "steady": _steady(w),
        "gc_walks": _gc_walks(server),
        "connect_latency": connect.summary(),
        "login_latency": login.summary(),
        "connections": {
            "logged_in": tot["logged_in"], "failed": verdict.failed_logins, "attached": tot["attached"],
            "peak": max(r.series["connections"], default=0), "peak_sessions": max(r.series["sessions"], default=0),
        },
        "errors": dict(tot["errors"]),
        "closes": dict(tot["closes"]),
        "observer": None if observer is None else {
            "events": observer.events, "seq_gaps": observer.seq_gaps, "lost": observer.lost,
            "seq_duplicates": observer.seq_duplicates, "resubscribes": observer.resubscribes, "reads": observer.reads,
            "fence_start_seconds": w.fence, "fence_end_seconds": w.fence_end,
            "delivery_delay": observer.delivery.summary()},
        "host": _host_summary(r),
        "generator": generator_figures(
            r.pool.finals(), (w.coordinator_cpu1 - w.coordinator_cpu0) / client_window * 100.0
            if client_window > 0 else None),
        "client": {"workers": sc.workers, "cpu_percent_mean":
                   ((w.client_cpu1 - w.client_cpu0) / client_window * 100.0) if client_window > 0 else None,
                   "frames": tot["frames"], "pongs": tot["pongs"],
                   "timeouts_differ": tot["timeouts_differ"]},
        "workers_dead": {s.index: s.dead for s in r.pool.workers if s.dead},
        "metrics_end": {k: v for k, v in r.metrics_end.items() if "bucket" not in k},
        "timeseries": r.series,
        "notes": r.notes + _generator_notes(sc, verdict.to_dict(), timeout),
    }


def _generator_notes(sc: Scenario, verdict: dict[str, Any], timeout: float) -> list[str]:
    """Say so when the generator, not the server, decided some figures."""
    notes = []
    if verdict["generator_late"]:
        notes.append(f"generator was the bottleneck: figures not trustworthy ({verdict['generator_late']} pinger "
                     "sessions went offline because the generator itself did not send within the timeout)")
    longest = sc.keepalive * (1.0 + sc.jitter)  # (--ping-every is at most the keepalive)
    if longest > timeout:
        notes.append(f"the server's timeout ({timeout:g} s) is shorter than the generator's longest keepalive "
                     f"interval ({longest:g} s): sessions go offline by the plan, and count as generator late")
    return notes


def _ping_rate(r: RunState, w: Window, tot: dict[str, Any]) -> dict[str, Any]:
    """Keepalives per second over the steady part (ramp done .. end) against what the sessions owe."""
    # (each worker's count over its own report times: reports are up to half a second old)
    achieved = target_rate = None
    if w.steady_mark is not None and w.end_wall > w.steady_mark[0]:
        w0, _, p0 = w.steady_mark
        achieved = reported_rate(p0, w.pings_end)
        ts, pinging = r.series["t"], r.series["pinging"]
        pts = [p for t, p in zip(ts, pinging) if t + r.t0 >= w0]
        target_rate = (sum(pts) / len(pts) / (r.sc.ping_every or r.sc.keepalive)) if pts else None
    return {"target_per_s": target_rate, "achieved_per_s": achieved,
            "ratio": (achieved / target_rate) if (achieved is not None and target_rate) else None,
            "client_lag_max_seconds": tot["lag_max"]}


def _phases(w: Window) -> dict[str, Any]:
    """The login and keepalive phases priced in server CPU-seconds (`idled.tools.loadtest.rates`)."""
    if w.steady_mark is None:
        return {"login": None, "keepalive": None}
    keepalive = None
    if w.rate_mark is not None and w.end_wall > w.rate_mark[0]:
        keepalive = phase(w.rate_mark[1], w.end_sample, per_s=reported_rate(w.rate_mark[2], w.pings_end))
    return {"login": phase(w.start_sample, w.steady_mark[1], events=w.ramp_logins), "keepalive": keepalive}


def _steady(w: Window) -> dict[str, Any] | None:
    """--peer: the steady window (every silent session's close owed .. the end of the pings), priced like a
    phase: the server's CPU over it and the keepalives the workers sent in it (`idled.tools.loadtest.peer`)."""
    if w.peer_mark is None or w.end_wall <= w.peer_mark[0]:
        return None
    return phase(w.peer_mark[1], w.end_sample, per_s=reported_rate(w.peer_mark[2], w.pings_end))


def _gc_walks(server: ServerProcess) -> dict[str, Any]:
    """Per process of the daemon: its full GC walks (`idled.ops.gcpolicy`) during the server's life."""
    out: dict[str, Any] = {}
    for process, seconds, cpu in server.gc_walks:
        walks = out.setdefault(process, {"count": 0, "max_seconds": 0.0, "seconds": [], "cpu_seconds": []})
        walks["count"] += 1
        walks["max_seconds"] = max(walks["max_seconds"], seconds)
        walks["seconds"].append(seconds)
        walks["cpu_seconds"].append(cpu)
    return out


def _server_stats(r: RunState, w: Window) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu_percent_mean": None, "cpu_percent_steady": None, "cpu_percent_max": None,
                           "cpu_seconds": None, "rss_base_bytes": None, "rss_peak_bytes": None,
                           "rss_end_bytes": None, "rss_per_session_bytes": None, "rss_total_per_session_bytes": None}
    start, end = w.start_sample, w.end_sample
    if start is not None and end is not None:
        window = end.wall - start.wall
        out["cpu_seconds"] = end.cpu_seconds - start.cpu_seconds
        out["cpu_percent_mean"] = out["cpu_seconds"] / window * 100.0 if window > 0 else None
        steady = w.steady_mark
        if steady is not None and steady[1] is not None and end.wall > steady[1].wall:
            s0 = steady[1]
            out["cpu_percent_steady"] = (end.cpu_seconds - s0.cpu_seconds) / (end.wall - s0.wall) * 100.0
            out["cpu_seconds_steady"] = end.cpu_seconds - s0.cpu_seconds
        out["cpu_percent_max"] = max((s.cpu_percent for s in r.samples), default=None)
        rss_base = (w.base_sample or start).rss
        rss_peak = max([s.rss for s in r.samples] + [end.rss])
        peak_sessions = max(r.series["sessions"], default=0)
        out["rss_base_bytes"] = rss_base
        out["rss_peak_bytes"] = rss_peak
        out["rss_end_bytes"] = end.rss
        if peak_sessions:
            out["rss_per_session_bytes"] = (rss_peak - rss_base) / peak_sessions
            out["rss_total_per_session_bytes"] = rss_peak / peak_sessions
        out["per"] = "connection" if r.sc.mode == "users" else "gateway session"
    out["stall_max_seconds"] = r.stall
    # the metric is a running maximum: if it grew after the ramp, its final value is the steady state's
    # largest stall; if not, the steady state's was at most the value at the ramp's end
    out["stall_max_seconds_at_ramp_end"] = r.stall_at_ramp_end
    out["stall_max_seconds_steady"] = (
        r.stall if (r.stall is not None and r.stall_at_ramp_end is not None and r.stall > r.stall_at_ramp_end)
        else None)
    out["stall_max_seconds_final_log"] = parse_stall(w.final_lines[-20:]) if w.final_lines else None
    out["final_log_lines"] = w.final_lines[-5:]
    return out


def _host_summary(r: RunState) -> dict[str, Any]:
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


def finish(server: ServerProcess, result: dict[str, Any]) -> None:
    """Add the targets and settle the verdict: OK only if the run was correct and no target FAILED."""
    if server.returncode not in (None, 0):
        result["notes"].append(f"the server exited with status {server.returncode}")
    if result["server"].get("stall_max_seconds") is None:
        result["server"]["stall_max_seconds"] = result["server"].get("stall_max_seconds_final_log")
    result["targets"] = targets(result)
    correct = result.setdefault("correct", result["ok"])  # events right and complete, before the targets
    failed = [name for name, t in result["targets"].items() if t["pass"] is False]
    result["targets_failed"] = failed
    result["ok"] = correct and not failed
