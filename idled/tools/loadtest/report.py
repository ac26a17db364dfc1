"""Presenting load-test results: targets, the text summary, the side-by-side comparison, the plot.

Everything here reads the result documents `idled.tools.loadtest.run.run_scenario` returns (plain dicts, as written
to ``--json``); nothing measures. matplotlib is imported inside `plot_results` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["targets", "asks_text", "summary_text", "compare_ratios", "compare_text", "format_table", "plot_results", "clean_json"]

RSS_PER_CONNECTION_LIMIT = 8 * 1024  # bytes
TLS_RSS_PER_CONNECTION_LIMIT = 32 * 1024  # bytes, with --tls: an OpenSSL connection's state (docs/tls.md)
# Below this many connections the RSS growth is mostly allocator granularity (one 1 MiB arena over 300
# connections is 3.4 KiB each): the per-connection figure is shown but not judged.
RSS_TARGET_MIN_SESSIONS = 1000
LATENESS_SLACK = 0.050  # seconds above one tick


def clean_json(value: Any) -> Any:
    """The same structure with non-finite floats as None and tuples as lists (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def _target(value: Any, limit: float, le: bool = True, applies: bool = True) -> dict[str, Any]:
    ok = None if (value is None or not applies) else (value <= limit if le else value == limit)
    return {"value": value, "limit": limit, "pass": ok}


def targets(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The sizing targets of the issue, each {value, limit, pass}; pass is None when not measurable.

    A False pass makes the run's verdict FAILED (`idled.tools.loadtest.results.finish`)."""
    v = result["verdict"]
    tick = v["tick"]
    users = result["scenario"]["mode"] == "users"
    enough = (result.get("connections") or {}).get("peak_sessions", 0) >= RSS_TARGET_MIN_SESSIONS
    return {
        "false_offlines == 0": _target(v["false_offlines"], 0, le=False),
        "missed_offlines == 0": _target(v["missed_offlines"], 0, le=False),
        "early_offlines == 0": _target(v["early_offlines"], 0, le=False),
        # offlines the generator caused by sending late: the server was right, the run's figures are not
        "generator_late == 0": _target(v.get("generator_late"), 0, le=False),
        # idled's promise (one tick); MQTT makes none, so against a broker the lateness is shown, not judged
        "lateness p99 <= tick + 50 ms": _target(result["lateness"]["generator"]["p99"], tick + LATENESS_SLACK,
                                                applies=result["scenario"].get("wire", "idled") != "mqtt"),
        **({"server RSS per TLS connection <= 32 KiB": _target(result["server"].get("rss_per_session_bytes"),
                                                               TLS_RSS_PER_CONNECTION_LIMIT, applies=users and enough)}
           if result["scenario"].get("tls") else
           {"server RSS per connection <= 8 KiB": _target(result["server"].get("rss_per_session_bytes"),
                                                          RSS_PER_CONNECTION_LIMIT, applies=users and enough)}),
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.1f} MiB"


def _lat(summary: dict[str, Any]) -> str:
    if not summary.get("count"):
        return "no samples"
    return (f"p50 {_ms(summary['p50'])}  p90 {_ms(summary['p90'])}  p99 {_ms(summary['p99'])}  "
            f"p99.9 {_ms(summary['p99_9'])}  max {_ms(summary['max'])}  (n={summary['count']}, "
            f"min {_ms(summary['min'])})")


def asks_text(one_in: int) -> str:
    """What ``--ask-one-in`` N makes of the keepalives, in words."""
    return {1: "every keepalive a ping", 0: "every keepalive quiet"}.get(
        one_in, f"one keepalive in {one_in} a ping, the others quiet")


def summary_text(result: dict[str, Any]) -> str:
    sc = result["scenario"]
    v = result["verdict"]
    srv = result["server"]
    pr = result["ping_rate"]
    conns = result["connections"]
    what = (f"{sc['sessions']} connections" if sc["mode"] == "users"
            else f"{sc['sessions']} sessions on {sc['gateways']} gateways")
    if sc.get("devices", 1) > 1:
        what += f" ({sc['sessions'] // sc['devices']} users x {sc['devices']} devices; events are per user)"
    lines = [
        f"idled loadtest: {what}, keepalive {sc['keepalive']:g} s (timeout {result['timeout']:g} s"
        + ("" if sc.get("ask_one_in", 1) == 1 else f"; {asks_text(sc['ask_one_in'])}")
        + "), "
        f"tick {sc['tick']:g} s, "
        + ("against mosquitto" if sc.get("wire") == "mqtt" else f"detector {result['detector'] or '(default)'}")
        + f", {sc['duration']:g} s"
        + ("" if not result.get("aborted") else f"  ** ABORTED: {result['aborted']} **"),
        f"  sessions      {conns['logged_in'] if sc['mode'] == 'users' else conns['attached']} up, "
        f"{v['failed_logins']} failed; peak {conns['peak_sessions']}; connect {_lat_short(result['connect_latency'])}; "
        f"login {_lat_short(result['login_latency'])}",
        f"  ping rate     {_rate(pr['achieved_per_s'])}/s achieved vs {_rate(pr['target_per_s'])}/s target"
        + (f" ({pr['ratio'] * 100:.1f}%)" if pr.get("ratio") else "")
        + f"; client lag max {_ms(pr['client_lag_max_seconds'])}; client CPU {_pct(result['client']['cpu_percent_mean'])}",
        *_generator_lines(result.get("generator")),
        f"  lateness gen  {_lat(result['lateness']['generator'])}",
        f"  lateness srv  {_lat(result['lateness']['server'])}",
        f"  deadline shift {_lat_short(result['lateness'].get('deadline_shift', {}))} "
        "(server deadline - (last sent + timeout))",
        f"  correctness   false offlines {v['false_offlines']}, missed offlines {v['missed_offlines']} "
        f"(never {v['missed_never']}, late {v['missed_late']}), early {v['early_offlines']}, "
        f"unjudged {v['unjudged_silent']}, silent {v['planned']['silent']}, "
        f"logouts {v['logouts_seen']}/{v['planned']['bye']} (missed {v['missed_logouts']}), "
        f"duplicate offlines {v['duplicate_offlines']}, online missing {v['online_missing']}; "
        f"generator late {v.get('generator_late', 0)}" + _late_text(v),
        f"  server        pid {srv.get('pid')}, CPU mean {_pct(srv.get('cpu_percent_mean'))} "
        f"(steady {_pct(srv.get('cpu_percent_steady'))}, max {_pct(srv.get('cpu_percent_max'))}), "
        f"RSS base {_mib(srv.get('rss_base_bytes'))} peak {_mib(srv.get('rss_peak_bytes'))}, "
        f"RSS/{srv.get('per', 'session')} {_kib(srv.get('rss_per_session_bytes'))}, "
        f"stall max {_ms(srv.get('stall_max_seconds'))} ({_ms(srv.get('stall_max_seconds_at_ramp_end'))} by ramp end)",
        f"  observer      {_observer(result.get('observer'))}; host CPU "
        f"{_pct((result.get('host') or {}).get('cpu_percent_mean'))} mean of {(result.get('host') or {}).get('cpus')} CPUs",
        f"  errors        {_counts(result['errors'])}",
    ]
    lines += _phase_lines(result.get("phases") or {}) + _gc_lines(result.get("gc_walks") or {})
    if v["false_offline_reasons"]:
        lines.append(f"  false reasons {_counts(v['false_offline_reasons'])}")
    if v["silent_wrong_reason"] or v["logout_wrong_reason"]:
        lines.append(f"  odd reasons   silent {_counts(v['silent_wrong_reason'])}; "
                     f"bye {_counts(v['logout_wrong_reason'])}")
    for note in result.get("notes", []):
        lines.append(f"  note          {note}")
    ts = result.get("targets") or {}
    if ts:
        lines.append("  targets       " + "; ".join(
            f"{name}: {'PASS' if t['pass'] else 'n/a' if t['pass'] is None else 'FAIL'}" for name, t in ts.items()))
    lines.append(f"  verdict       {'OK' if result['ok'] else 'FAILED'}")
    return "\n".join(lines)


def _observer(obs: dict[str, Any] | None) -> str:
    if obs is None:  # --peer mqtt: the workers' CONNACKs and closes are the events
        return "none (MQTT: each CONNACK and each close seen by its client is the event)"
    return (f"{obs.get('events')} events ({obs.get('resubscribes', 0)} resubscribes), delivery delay "
            f"{_lat_short(obs.get('delivery_delay', {}))}")


def _late_text(v: dict[str, Any]) -> str:
    """The planned late sessions (--late-fraction), if any."""
    if not v.get("late_planned"):
        return ""
    return (f"; late sessions {v['late_planned']} (owed an offline {v['late_expected']}, offline "
            f"{v['late_offlines']}, missed {v['late_missed']})")


def _generator_lines(gen: dict[str, Any] | None) -> list[str]:
    """The generator's own cost and lag (`idled.tools.loadtest.genstats`)."""
    if not gen or not gen.get("total"):
        return []

    def cpu(name: str) -> str:
        ph = gen.get(name)
        if not ph:
            return f"{name} -"
        each = "" if ph["cpu_us_per_op"] is None else f", {ph['cpu_us_per_op']:.1f} us/op"
        return f"{name} {_pct(ph['cpu_percent'])} ({ph['seconds']:.0f} s, {ph['ops_per_s']:,.0f} ops/s{each})"

    c = gen["counts"]
    lag = gen["lag"]
    return [
        f"  generator     {gen['workers']} worker processes, CPU of one core: {cpu('ramp')}; {cpu('steady')}; "
        f"{cpu('total')}; coordinator {_pct(gen.get('coordinator_cpu_percent'))}",
        f"  gen. lag      timers {_lat_short(lag)}; largest loop turn {_ms(gen.get('turn_max_seconds'))} "
        f"(p99 {_ms(gen.get('turn_p99_seconds'))}, {gen.get('turns', 0)} turns); ops: logins {c['logins']}, "
        f"pings {c['pings']}, pongs {c['pongs']}, ends {c['ended']}",
    ]


def _phase_lines(phases: dict[str, Any]) -> list[str]:
    """Logins and keepalives per server CPU-second (`idled.tools.loadtest.rates`)."""
    out = []
    for name, what in (("login", "logins"), ("keepalive", "keepalives")):
        ph = phases.get(name)
        if ph and ph["per_cpu_second"]:
            split = (f" (core {ph['core_us_each']:.1f} + edges {ph['edge_us_each']:.1f})"
                     if ph["edge_cpu_seconds"] > 0.005 else "")
            out.append(f"  {what:<14}{ph['events_per_s']:,.0f}/s in the {name} phase ({ph['seconds']:.1f} s), "
                       f"server CPU {ph['cpu_percent']:.1f}%: {ph['per_cpu_second']:,.0f} {what} per CPU-second, "
                       f"{ph['cpu_us_each']:.1f} us each{split}")
    return out


def _gc_lines(walks: dict[str, Any]) -> list[str]:
    """The full GC walks of each process of the daemon (``gc full walk`` log lines)."""
    if not walks:
        return []
    def cpu(w: dict[str, Any]) -> str:
        known = [c for c in w.get("cpu_seconds", ()) if c is not None]
        return f", CPU max {max(known) * 1e3:.1f} ms" if known else ""

    return ["  gc walks      " + "; ".join(
        f"{name} {w['count']} (max {w['max_seconds'] * 1e3:.1f} ms{cpu(w)})" for name, w in sorted(walks.items()))]


def _lat_short(s: dict[str, Any]) -> str:
    if not s.get("count"):
        return "-"
    return f"p50 {_ms(s['p50'])} p99 {_ms(s['p99'])} max {_ms(s['max'])}"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _kib(x: float | None) -> str:
    return "-" if x is None else f"{x / 1024:.2f} KiB"


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items(), key=lambda kv: -kv[1])) or "none"


# ------------------------------------------------------------------------------------------ comparison

_COMPARED: tuple[tuple[str, str, str], ...] = (
    # (label, path into the result, format)
    ("largest event-loop stall", "server.stall_max_seconds", "ms"),
    ("  of which by ramp end", "server.stall_max_seconds_at_ramp_end", "ms"),
    ("  after the ramp (if larger)", "server.stall_max_seconds_steady", "ms"),
    ("server CPU, mean", "server.cpu_percent_mean", "pct"),
    ("server CPU, steady", "server.cpu_percent_steady", "pct"),
    ("server CPU seconds", "server.cpu_seconds", "num"),
    ("server RSS peak", "server.rss_peak_bytes", "mib"),
    ("lateness p50 (gen)", "lateness.generator.p50", "ms"),
    ("lateness p99 (gen)", "lateness.generator.p99", "ms"),
    ("lateness max (gen)", "lateness.generator.max", "ms"),
    ("lateness p99 (server)", "lateness.server.p99", "ms"),
    ("false offlines", "verdict.false_offlines", "int"),
    ("missed offlines", "verdict.missed_offlines", "int"),
)
_RATIO_KEYS = ("server.stall_max_seconds", "server.cpu_percent_mean", "server.cpu_percent_steady",
               "server.cpu_seconds", "server.rss_peak_bytes", "lateness.generator.p99", "lateness.generator.max")


def _get(result: dict[str, Any], path: str) -> Any:
    node: Any = result
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _subject(results: Sequence[dict[str, Any]]) -> int:
    for k, r in enumerate(results):
        if str(r.get("detector") or "").startswith("ring"):
            return k
    return 0


def compare_ratios(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The subject's (the ring's) figures divided by each baseline's: {"subject", "vs": {name: {key: ratio}}}."""
    k = _subject(results)
    subject = results[k]
    out: dict[str, Any] = {"subject": subject.get("detector"), "vs": {}}
    for j, base in enumerate(results):
        if j == k:
            continue
        ratios: dict[str, float | None] = {}
        for key in _RATIO_KEYS:
            a, b = _get(subject, key), _get(base, key)
            ratios[key] = (a / b) if (isinstance(a, (int, float)) and isinstance(b, (int, float)) and b) else None
        out["vs"][str(base.get("detector"))] = ratios
    return out


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "ms":
        return f"{value * 1e3:.1f} ms"
    if kind == "pct":
        return f"{value:.1f}%"
    if kind == "mib":
        return f"{value / 2**20:.1f} MiB"
    if kind == "int":
        return str(int(value))
    return f"{value:.2f}"


def compare_text(results: Sequence[dict[str, Any]], ratios: dict[str, Any]) -> str:
    names = [str(r.get("detector")) for r in results]
    bases = list(ratios["vs"])
    subject = ratios["subject"]
    head = ["metric"] + names + [f"{subject}/{b}" for b in bases]
    rows = [head]
    for label, path, kind in _COMPARED:
        row = [label] + [_fmt(_get(r, path), kind) for r in results]
        for b in bases:
            ratio = ratios["vs"][b].get(path)
            row.append("-" if ratio is None else f"{ratio:.2f}x")
        rows.append(row)
    rows.append(["verdict"] + ["OK" if r["ok"] else "FAILED" for r in results] + [""] * len(bases))
    return format_table(rows)


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells as aligned text: the first column left, the others right, a rule under the head."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if c else cell.ljust(w) for c, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- plot


def plot_results(results: Sequence[dict[str, Any]], path: str) -> None:
    """Lateness percentiles, sessions, server CPU and RSS over time; one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    ax_lat, ax_conn, ax_cpu, ax_rss = axes[0][0], axes[0][1], axes[1][0], axes[1][1]
    for r in results:
        name = str(r.get("detector") or "default detector")
        for which, style in (("generator", "-"), ("server", "--")):
            rows = r["lateness"][which]["hgrm"]
            xs = [row["inverse"] for row in rows if row["inverse"] is not None and math.isfinite(row["inverse"])]
            ys = [row["value"] * 1e3 for row in rows if row["inverse"] is not None and math.isfinite(row["inverse"])]
            if xs:
                ax_lat.plot(xs, ys, style, label=f"{name} ({which})")
        ts = r["timeseries"]
        t = ts["t"]
        ax_conn.plot(t, ts["sessions"], label=name)
        ax_cpu.plot(t, [c if c is not None else math.nan for c in ts["server_cpu_percent"]], label=name)
        ax_rss.plot(t, [x / 2**20 if x is not None else math.nan for x in ts["server_rss_bytes"]], label=name)
    ax_lat.set_xscale("log")
    ax_lat.set_xlabel("percentile: 1/(1-p)  (10 = p90, 100 = p99, 1000 = p99.9)")
    ax_lat.set_ylabel("lateness (ms)")
    ax_lat.set_title("offline lateness of silent sessions")
    ax_conn.set_title("sessions up")
    ax_conn.set_xlabel("s")
    ax_cpu.set_title("server CPU % (100 = one core)")
    ax_cpu.set_xlabel("s")
    ax_rss.set_title("server RSS (MiB)")
    ax_rss.set_xlabel("s")
    if not ax_lat.lines:
        ax_lat.text(0.5, 0.5, "no silent session was reported offline", ha="center", va="center",
                    transform=ax_lat.transAxes)
    for ax in (ax_lat, ax_conn, ax_cpu, ax_rss):
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
