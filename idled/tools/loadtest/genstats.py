"""The generator measured in its own run: CPU of the worker processes, CPU per operation, timer lag, loop turns.

Theory of operation
-------------------
A load generator must stay far below the server it measures, or its own lag becomes the result. Each worker
therefore measures itself (`idled.tools.loadtest.workerstate.Worker.mark`): its CPU seconds from
``getrusage`` and its operations -- logins (attaches) + keepalives sent + pongs read + connections ended --
at its start, at the moment its own ramp is done (every session logged in or failed), and at the stop
(before the sockets are closed: teardown is not load). Its final report carries those marks and two
histograms: the lag of every timer (how late a keepalive or a silent / bye moment ran behind its schedule)
and the duration of every engine loop turn.

`generator_figures` sums them over the workers into three phases -- *ramp* (start .. ramp done), *steady*
(ramp done .. stop) and *total* -- each with its CPU seconds, the share of one core the workers used
together (each worker's CPU over its own wall time, summed: 25 % = a quarter of one core), and the CPU
microseconds per operation. The coordinator (observer, sampler, matcher) is measured apart, by the caller,
and reported next to it: it is not the generator's cost per connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idled.tools.loadtest.histogram import Histogram

__all__ = ["generator_figures", "phase_figures"]

_COUNTS = ("logins", "pings", "pongs", "ended")


def phase_figures(spans: Sequence[tuple[dict[str, float], dict[str, float]]]) -> dict[str, Any] | None:
    """One phase over the workers, from each worker's (mark at its start, mark at its end); None if empty."""
    spans = [(a, b) for a, b in spans if b["wall"] > a["wall"]]
    if not spans:
        return None
    cpu = sum(b["cpu"] - a["cpu"] for a, b in spans)
    ops = sum(b["ops"] - a["ops"] for a, b in spans)
    cores = sum((b["cpu"] - a["cpu"]) / (b["wall"] - a["wall"]) for a, b in spans)
    seconds = max(b["wall"] for _, b in spans) - min(a["wall"] for a, _ in spans)
    return {"seconds": seconds, "cpu_seconds": cpu, "cpu_percent": cores * 100.0, "ops": ops,
            "ops_per_s": sum((b["ops"] - a["ops"]) / (b["wall"] - a["wall"]) for a, b in spans),
            "cpu_us_per_op": cpu / ops * 1e6 if ops > 0 else None}


def generator_figures(finals: Sequence[dict[str, Any]], coordinator_cpu_percent: float | None) -> dict[str, Any]:
    """The generator's own figures from the workers' final reports (their ``gen`` blocks)."""
    ramp: list[tuple[dict[str, float], dict[str, float]]] = []
    steady: list[tuple[dict[str, float], dict[str, float]]] = []
    total: list[tuple[dict[str, float], dict[str, float]]] = []
    lag, turn = Histogram(), Histogram()
    counts = dict.fromkeys(_COUNTS, 0)
    for final in finals:
        gen = final.get("gen") or {}
        marks = gen.get("marks") or {}
        start, stop = marks.get("start"), marks.get("stop")
        if start is None or stop is None:
            continue
        done = marks.get("ramp")
        if done is not None and done["wall"] <= stop["wall"]:
            ramp.append((start, done))
            steady.append((done, stop))
        else:
            ramp.append((start, stop))  # stopped before its ramp was done: all of it was ramp
        total.append((start, stop))
        if gen.get("lag_hist"):
            lag.merge(Histogram.from_dict(gen["lag_hist"]))
        if gen.get("turn_hist"):
            turn.merge(Histogram.from_dict(gen["turn_hist"]))
        for key in _COUNTS:
            counts[key] += int((gen.get("counts") or {}).get(key, 0))
    turns = turn.summary()
    return {
        "workers": len(finals), "measured": len(total),
        "ramp": phase_figures(ramp), "steady": phase_figures(steady), "total": phase_figures(total),
        "counts": counts, "lag": lag.summary(),
        "turn_max_seconds": turns.get("max") if turns.get("count") else None,
        "turn_p99_seconds": turns.get("p99") if turns.get("count") else None,
        "turns": turns.get("count", 0),
        "coordinator_cpu_percent": coordinator_cpu_percent,
    }
