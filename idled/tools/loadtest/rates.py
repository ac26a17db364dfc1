"""Throughput per server CPU-second: the login phase and the keepalive phase of a run, and a sweep over
``idled serve --workers W`` side by side.

Theory of operation
-------------------
A run has two phases whose work is known. The *login phase* runs from t0 to the first sample after every
worker finished its ramp: the server's work is the logins (plus the few keepalives of sessions already up;
with the default 30 s keepalive, ~1 % as many). The *keepalive phase* runs from a moment after the ramp
(once ``--ping-every`` has taken over, so the offered rate is fixed) to the end: the server's work is the
keepalives, each read, answered with a pong and -- through an edge -- relayed to the core as a batched
touch. For each phase: the server's CPU-seconds (summed over its process tree; the core's apart -- under
``--workers`` the ``--core-of-workers`` child with the small root's own --, the edges' the rest), the events, and their ratio: logins per CPU-second, keepalives per
CPU-second, CPU microseconds per event. Idle costs (the tick, the monitor, the links' pings) are included:
they are small next to thousands of events per second.

The keepalive count of a phase comes from the workers' reports (every 0.5 s), the CPU from the sampler's
(every 1 s): the rate is the workers' rate over their own report times, the CPU rate the sampler's over its
own, and their ratio is what is reported. `sweep_table` sets one run per ``--workers`` value side by side
and prices the relay: the CPU per keepalive with W edges minus the CPU per keepalive of one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from idled.tools.loadtest.report import format_table
from idled.tools.loadtest.target import Sample

__all__ = ["phase", "reported_rate", "sweep_rows", "sweep_table"]


def phase(start: Sample | None, end: Sample | None, *, events: float | None = None,
          per_s: float | None = None) -> dict[str, Any] | None:
    """One phase's CPU-seconds (total, core, edges) and its events, given as a count (over the phase's wall
    time) or as a rate; None if the phase was not seen."""
    if start is None or end is None or end.wall <= start.wall or (events is None and per_s is None):
        return None
    seconds = end.wall - start.wall
    cpu = end.cpu_seconds - start.cpu_seconds
    core = end.core_cpu_seconds - start.core_cpu_seconds
    rate = per_s if per_s is not None else events / seconds  # type: ignore[operator]
    cpu_rate = cpu / seconds  # cores busy
    out: dict[str, Any] = {
        "seconds": seconds, "events": rate * seconds, "events_per_s": rate, "cpu_seconds": cpu,
        "core_cpu_seconds": core, "edge_cpu_seconds": cpu - core, "cpu_percent": cpu_rate * 100.0,
        "per_cpu_second": rate / cpu_rate if cpu_rate > 0 else None,
        "cpu_us_each": None, "core_us_each": None, "edge_us_each": None,
    }
    if rate > 0:
        for key, used in (("cpu_us_each", cpu), ("core_us_each", core), ("edge_us_each", cpu - core)):
            out[key] = used / seconds / rate * 1e6
    return out


def reported_rate(before: Sequence[tuple[float, int]], after: Sequence[tuple[float, int]]) -> float:
    """Events per second summed over the workers, from two of their (report wall time, cumulative count)
    lists, each worker's over its own report times."""
    return sum((c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in zip(before, after) if t1 > t0)


def _workers(result: dict[str, Any]) -> str:
    args = list(result["scenario"].get("server_args") or ())
    for k, a in enumerate(args):
        if a == "--workers" and k + 1 < len(args):
            return args[k + 1]
        if a.startswith("--workers="):
            return a.split("=", 1)[1]
    return "0"


def sweep_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run: the --workers value, both phases, the ratios to the first run, and the relay's price."""
    rows: list[dict[str, Any]] = []
    base = (results[0].get("phases") or {}) if results else {}
    for r in results:
        phases = r.get("phases") or {}
        login, keep = phases.get("login"), phases.get("keepalive")
        row: dict[str, Any] = {"workers": _workers(r), "login": login, "keepalive": keep}
        for name, ph in (("login", login), ("keepalive", keep)):
            b = base.get(name)
            row[f"{name}_ratio"] = (ph["per_cpu_second"] / b["per_cpu_second"]
                                    if ph and b and ph["per_cpu_second"] and b["per_cpu_second"] else None)
        b = base.get("keepalive")
        row["relay_us_per_keepalive"] = (keep["cpu_us_each"] - b["cpu_us_each"]
                                         if keep and b and keep["cpu_us_each"] is not None
                                         and b["cpu_us_each"] is not None else None)
        rows.append(row)
    return rows


_LINES: tuple[tuple[str, str, str, str], ...] = (
    # (label, phase, key, format)
    ("logins/s (login phase)", "login", "events_per_s", "n"),
    ("login phase server CPU-s", "login", "cpu_seconds", "f2"),
    ("  core / edges", "login", "split", ""),
    ("logins per server CPU-second", "login", "per_cpu_second", "n"),
    ("  ratio to the first", "", "login_ratio", "x"),
    ("keepalives/s (keepalive phase)", "keepalive", "events_per_s", "n"),
    ("server CPU % (keepalive phase)", "keepalive", "cpu_percent", "f1"),
    ("keepalives per server CPU-second", "keepalive", "per_cpu_second", "n"),
    ("  ratio to the first", "", "keepalive_ratio", "x"),
    ("CPU us per keepalive", "keepalive", "cpu_us_each", "f1"),
    ("  in the core", "keepalive", "core_us_each", "f1"),
    ("  in the edges", "keepalive", "edge_us_each", "f1"),
    ("relay cost us per keepalive", "", "relay_us_per_keepalive", "f1"),
)


def _cell(row: dict[str, Any], where: str, key: str, kind: str) -> str:
    node = row.get(where) if where else row
    if not node:
        return "-"
    if key == "split":
        return f"{node['core_cpu_seconds']:.2f} / {node['edge_cpu_seconds']:.2f}"
    value = node.get(key)
    if value is None:
        return "-"
    return {"n": f"{value:,.0f}", "f2": f"{value:.2f}", "f1": f"{value:.1f}", "x": f"{value:.2f}x"}[kind]


def sweep_table(rows: Sequence[dict[str, Any]]) -> str:
    """The runs side by side, one column per --workers value."""
    table = [["server --workers"] + [str(row["workers"]) for row in rows]]
    for label, where, key, kind in _LINES:
        table.append([label] + [_cell(row, where, key, kind) for row in rows])
    return format_table(table)
