"""Human-facing output of a pipeline run: the short stdout table and the concurrency chart (matplotlib, lazily)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

__all__ = ["format_report", "write_chart"]


def _utc(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(header)] + [[f"{v:,}" if isinstance(v, int) else (f"{v:.3f}" if isinstance(v, float) else str(v)) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]


def format_report(summary: dict[str, Any]) -> str:
    c = summary["counts"]
    t = summary["timings_s"]
    peak = summary["peak_concurrency"]
    lines = [
        f"idled pipeline: {c['events']:,} events from {len(summary['inputs'])} daemon(s), {c['files']:,} segment files, "
        f"{c['bytes'] / 1e6:,.1f} MB",
        f"  skipped: {c['corrupt']:,} corrupt, {c['malformed']:,} malformed, {c['duplicates']:,} duplicate records; "
        f"{c['torn_bytes']:,} torn bytes",
        f"  sessions: {c['sessions']:,} ({c['open_sessions']:,} open, {c['superseded_sessions']:,} superseded); "
        f"orphan offlines: {c['orphan_offlines']:,}",
        f"  peak concurrency: {peak['users_online']:,} users in the minute of {_utc(peak['minute_start'])}; "
        f"flappers: {c['flapper_users']:,} users ({c['flapper_user_days']:,} user-days)"
        + (f", sessions joined over a {summary['grace_s']:g} s grace" if summary.get("grace_s") else ""),
    ]
    if summary["dau"]:
        lines += _table(["date", "active users", "sessions"], [(d["date"], d["active_users"], d["sessions_started"]) for d in summary["dau"]])
    if summary["lateness_by_detector"]:
        lines.append("  idle-offline lateness (s):")
        lines += _table(
            ["detector", "offlines", "early", "p50", "p99", "max"],
            [(r["detector"], r["offlines"], r["early"], r["p50_s"], r["p99_s"], r["max_s"]) for r in summary["lateness_by_detector"]],
        )
    rate = summary["events_per_s"]["end_to_end"]
    step = summary.get("incremental")
    if step and step["nothing_new"]:
        lines.append("  incremental: nothing new since the last run; nothing rewritten")
    elif step:
        lines.append(
            f"  incremental: {step['files_decoded']:,} file(s) decoded; time: spark start {t['spark_start']:.1f} s, "
            f"run {t['incremental']:.1f} s, total {t['total']:.1f} s"
        )
    else:
        lines.append(
            f"  time: spark start {t['spark_start']:.1f} s, decode {t['decode']:.1f} s, aggregate+write {t['aggregate']:.1f} s, "
            f"total {t['total']:.1f} s -> {rate or 0:,} events/s end to end"
        )
    lines.append(f"  output: {summary['out']}")
    return "\n".join(lines)


def write_chart(concurrency: Sequence[tuple[int, int]], path: str) -> str | None:
    """PNG of users online per minute; returns the path, or None when there is nothing to draw or
    matplotlib (the `plot` extra) is not installed."""
    if not concurrency:
        return None
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    times = [dt.datetime.fromtimestamp(m, dt.UTC) for m, _ in concurrency]
    users = [u for _, u in concurrency]
    fig, ax = plt.subplots(figsize=(11, 4), dpi=100)
    try:
        # matplotlib's stubs type x as numbers or arrays only; its date units converter plots datetimes
        ax.plot(times, users, linewidth=0.8)  # type: ignore[arg-type]
        ax.set_title("idled: users online per minute (any time during the minute)")
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel("users online")
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz=dt.UTC))
        ax.grid(True, alpha=0.3)
        fig.autofmt_xdate()
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
