"""`idled loadtest --peer mqtt`: idled and an MQTT broker under the same load, side by side (pure arithmetic).

Theory of operation
-------------------
The command line (`idled.cli.loadtest`) runs one scenario twice with the same engine, plan and checks: first
against ``idled serve`` (spawned, ``--workers 0`` unless told otherwise), its offlines read by the observer;
then against a Mosquitto of its own (`idled.tools.loadtest.mosquitto`), the users speaking MQTT 3.1.1
(`idled.tools.loadtest.wire`), where the close each client sees is the event. Both runs use the same integral
keepalive, the same ping cadence (every keepalive x U(1 - jitter, 1 + jitter): the load test's rule), the same
silent sessions at the same recorded moments, and the same windows, laid out here:

    0 .. ramp_end                              logins at --ramp per second
    ramp_end .. ramp_end + span                the silent (and bye) moments, `span` = min(5 s, keepalive / 2)
    .. + timeout + grace  = steady_from        every silent session's close is owed by now
    steady_from .. duration                    the steady window: nothing but keepalives
    duration ..                                the stop: every connection closes (not measured)

``grace`` (``--peer-grace``, default 10 s) is how late after its timeout a silent session may be closed
before it counts as *missed*: idled is still judged by its own bound (timeout + 2 ticks), the broker -- MQTT
promises no bound -- by timeout + grace. The steady window starts at the same planned moment in both runs,
so neither the ramp nor the silent sessions' closes nor the final close storm is in it.

`peer_row` takes one run's result document and returns the figures of the issue's table: false / missed /
early, offline lateness p50 / p99 / max (close or offline time minus the client's last send + timeout), steady
CPU (server CPU-seconds over the steady window / its wall time), CPU per keepalive (the same CPU over the
keepalives the workers sent in the window), RSS per connection over the whole process (peak RSS / peak
connections) and over the idle process ((peak - RSS before any connection) / peak connections), and the
generator's own CPU and timer lag, which show that the client was not the bottleneck. `peer_ratios` divides
idled's by the broker's; `peer_text` prints both rows and the ratios. Worked by hand: a steady window of
100 s in which the server used 2.2 CPU-seconds while 95,000 keepalives were sent is 2.2 % of a core and
2.2 / 95,000 = 23.2 us per keepalive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from idled.tools.loadtest.report import format_table

__all__ = ["PEERS", "DEFAULT_GRACE", "MAX_SPAN", "MIN_STEADY", "silence_span", "steady_from", "min_duration",
           "peer_row", "peer_ratios", "peer_text"]

PEERS: Final = ("mqtt",)
DEFAULT_GRACE: Final = 10.0  # seconds past the timeout a broker may take to close a silent client
MAX_SPAN: Final = 5.0  # seconds over which the silent moments are spread
MIN_STEADY: Final = 2.5  # the shortest steady window: at least one interval of the 2 s sampler
DEFAULT_STEADY: Final = 60.0
_RATIO_KEYS: Final = ("lateness_p99", "steady_cpu_percent", "cpu_us_per_keepalive", "rss_whole_bytes",
                      "rss_over_idle_bytes")


def silence_span(keepalive: float) -> float:
    """Seconds after the ramp over which the silent and bye moments fall."""
    return min(MAX_SPAN, keepalive / 2)


def steady_from(ramp_end: float, span: float, timeout: float, grace: float) -> float:
    """Seconds after t0 from which no silent session's close is still owed: the steady window's start."""
    return ramp_end + span + timeout + grace


def min_duration(start: float, tick: float) -> float:
    """The shortest run whose steady window (from ``start``) is long enough and whose silent window is the
    same for both peers (`idled.tools.loadtest.stats.silent_window` keeps 0.5 s + a tick at the end)."""
    return start + max(MIN_STEADY, 0.5 + tick)


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    node: Any = d
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def peer_row(result: Mapping[str, Any], name: str) -> dict[str, Any]:
    """One run's figures for the table (None where the run did not measure them)."""
    v = result.get("verdict") or {}
    late = _get(result, "lateness", "generator") or {}
    steady = result.get("steady") or {}
    server = result.get("server") or {}
    gen = result.get("generator") or {}
    return {
        "name": name, "ok": bool(result.get("ok")), "aborted": result.get("aborted"),
        "false": v.get("false_offlines"), "missed": v.get("missed_offlines"), "early": v.get("early_offlines"),
        "generator_late": v.get("generator_late"),
        "lateness_p50": late.get("p50") if late.get("count") else None,
        "lateness_p99": late.get("p99") if late.get("count") else None,
        "lateness_max": late.get("max") if late.get("count") else None,
        "timed": late.get("count", 0),  # silent sessions whose offline / close was timed
        "steady_seconds": steady.get("seconds"), "keepalives_per_s": steady.get("events_per_s"),
        "steady_cpu_percent": steady.get("cpu_percent"), "cpu_us_per_keepalive": steady.get("cpu_us_each"),
        "connections": _get(result, "connections", "peak_sessions"),
        "rss_whole_bytes": server.get("rss_total_per_session_bytes"),
        "rss_over_idle_bytes": server.get("rss_per_session_bytes"),
        "rss_idle_bytes": server.get("rss_base_bytes"),
        "generator_cpu_percent": _get(gen, "steady", "cpu_percent"),
        "generator_lag_p99": _get(gen, "lag", "p99"), "generator_lag_max": _get(gen, "lag", "max"),
    }


def peer_ratios(subject: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, float | None]:
    """``subject`` / ``base`` for the compared figures (None where either is missing or the base is 0)."""
    out: dict[str, float | None] = {}
    for key in _RATIO_KEYS:
        a, b = subject.get(key), base.get(key)
        out[key] = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.0f}"


def _n(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _kib(x: float | None) -> str:
    return "-" if x is None else f"{x / 1024:.2f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def peer_text(rows: Sequence[Mapping[str, Any]], ratios: Mapping[str, float | None], title: str) -> str:
    """Both rows, the ratios idled / peer, and the generator's own figures, as aligned text."""
    head = ["server", "false/missed/early", "lateness p50/p99/max ms", "steady CPU", "CPU/keepalive",
            "keepalives/s", "RSS/conn whole/over idle KiB", "verdict"]
    table = [head]
    for r in rows:
        counts = "/".join(_n(r[key], "d") for key in ("false", "missed", "early"))
        lateness = " / ".join(_ms(r[key]) for key in ("lateness_p50", "lateness_p99", "lateness_max"))
        table.append([r["name"], counts, lateness, _n(r["steady_cpu_percent"], ".2f") + " %",
                      _n(r["cpu_us_per_keepalive"], ".1f") + " us", _n(r["keepalives_per_s"], ",.0f"),
                      f"{_kib(r['rss_whole_bytes'])} / {_kib(r['rss_over_idle_bytes'])}",
                      "ABORTED" if r["aborted"] else "OK" if r["ok"] else "FAILED"])
    table.append([f"{rows[0]['name'].split()[0]} / {rows[-1]['name'].split()[0]}", "",
                  f"p99 {_x(ratios.get('lateness_p99'))}", _x(ratios.get("steady_cpu_percent")),
                  _x(ratios.get("cpu_us_per_keepalive")), "",
                  f"{_x(ratios.get('rss_whole_bytes'))} / {_x(ratios.get('rss_over_idle_bytes'))}", ""])
    lines = [title, format_table(table)]
    for r in rows:
        lines.append(f"  generator ({r['name'].split()[0]} run): CPU {_n(r['generator_cpu_percent'], '.1f')} % of one "
                     f"core steady, timer lag p99 {_ms(r['generator_lag_p99'])} ms, max {_ms(r['generator_lag_max'])} "
                     f"ms; {r['timed']} silent sessions timed; steady window {_n(r['steady_seconds'], '.0f')} s; idle "
                     f"process RSS {_n(None if r['rss_idle_bytes'] is None else r['rss_idle_bytes'] / 2**20, '.1f')} MiB")
    return "\n".join(lines)
