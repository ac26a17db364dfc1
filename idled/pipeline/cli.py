"""`idled pipeline run | generate`: argument parsing and the two command bodies.

pyspark is imported only when `run` executes (inside idled.pipeline.job), never by importing this module.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import sys
from collections.abc import Sequence

from idled.pipeline.rules import FlapParams

__all__ = ["add_arguments", "run", "main_submit"]

_FLAP = FlapParams()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _start(text: str) -> float:
    """Unix seconds or an ISO date/time (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not unix seconds or an ISO date: {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def add_run_arguments(parser: argparse.ArgumentParser, *, default_master: str | None) -> None:
    parser.add_argument("--events", action="append", required=True, metavar="DIR",
                        help="a daemon's event log directory (*.seg); repeat for several daemons")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (Parquet tables, summary.json, PNG)")
    parser.add_argument("--master", default=default_master, metavar="URL",
                        help=f"Spark master (default {default_master or 'from spark-submit'})")
    parser.add_argument("--driver-memory", default="6g", metavar="SIZE", help="driver JVM heap when Spark is started here (default 6g)")
    parser.add_argument("--shuffle-partitions", type=_positive_int, default=4, metavar="N", help="spark.sql.shuffle.partitions (default 4)")
    parser.add_argument("--min-partitions", type=_positive_int, default=None, metavar="N",
                        help="binaryFiles minPartitions (default 2 x default parallelism)")
    parser.add_argument("--flap-k", type=_positive_int, default=_FLAP.k, metavar="K",
                        help=f"flapping: at least K short sessions ... (default {_FLAP.k})")
    parser.add_argument("--flap-short", type=float, default=_FLAP.short_s, metavar="SECONDS",
                        help=f"... shorter than this ... (default {_FLAP.short_s:g})")
    parser.add_argument("--flap-window", type=_positive_int, default=_FLAP.window_s, metavar="SECONDS",
                        help=f"... starting within this many whole seconds (default {_FLAP.window_s})")
    parser.add_argument("--conf", action="append", default=[], type=_conf_pair, metavar="KEY=VALUE",
                        help="extra Spark setting, as spark-submit --conf (repeatable)")
    parser.add_argument("--no-chart", dest="chart", action="store_false", help="skip the concurrency PNG")
    parser.add_argument("--json", action="store_true", help="print summary.json instead of the table")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pipeline_command", required=True, metavar="ACTION")
    run_parser = sub.add_parser("run", help="run the Spark job over event log directories",
                                description="Decode presence event segments with Spark and write analytics tables.")
    add_run_arguments(run_parser, default_master="local[*]")
    gen = sub.add_parser("generate", help="write synthetic event logs with the real EventLog writer",
                         description="Write realistic synthetic presence event logs (see idled.pipeline.generate).")
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write (daemon-<d>/ subdirectories if --daemons > 1)")
    gen.add_argument("--users", type=_positive_int, required=True, metavar="N")
    gen.add_argument("--hours", type=float, required=True, metavar="H")
    gen.add_argument("--seed", type=int, default=1, metavar="S")
    gen.add_argument("--daemons", type=_positive_int, default=1, metavar="D", help="daemons (one process each, in parallel)")
    gen.add_argument("--start", type=_start, default=None, metavar="WHEN", help="first instant (default 2026-05-01T00:00Z)")
    gen.add_argument("--segment-bytes", type=_positive_int, default=None, metavar="BYTES", help="segment size (default EventLog's)")
    gen.add_argument("--flappers", type=float, default=0.005, metavar="FRACTION", help="share of users with flap bursts (default 0.005)")
    gen.add_argument("--crashes", type=int, default=2, metavar="N", help="crash/restart cycles per daemon (default 2)")
    gen.add_argument("--maintenance", type=int, default=1, metavar="N", help="graceful restarts per daemon (default 1)")
    gen.add_argument("--no-damage", dest="damage", action="store_false", help="no corrupt record, no torn tail")


def _check_inputs(dirs: Sequence[str]) -> str | None:
    for directory in dirs:
        if "://" in directory:
            continue  # a cluster filesystem: Spark will say if it is missing
        if not os.path.isdir(directory):
            return f"{directory}: no such directory"
        if not glob.glob(os.path.join(glob.escape(directory), "*.seg")):
            return f"{directory}: no *.seg files"
    from idled.pipeline.job import daemon_names  # pyspark-free at import

    if len(set(daemon_names(dirs))) != len(dirs):
        return "the same directory is given twice"
    return None


def _run_job(args: argparse.Namespace) -> int:
    from idled.pipeline.job import JobConfig, run_job
    from idled.pipeline.report import format_report

    problem = _check_inputs(args.events)
    if problem:
        print(f"idled pipeline run: {problem}", file=sys.stderr)
        return 2
    try:
        flap = FlapParams(k=args.flap_k, short_s=args.flap_short, window_s=args.flap_window)
    except ValueError as exc:
        print(f"idled pipeline run: {exc}", file=sys.stderr)
        return 2
    config = JobConfig(
        events=tuple(args.events), out=args.out, master=args.master, driver_memory=args.driver_memory,
        shuffle_partitions=args.shuffle_partitions, min_partitions=args.min_partitions, flap=flap, chart=args.chart,
        extra_conf=tuple(args.conf),
    )
    result = run_job(config)
    if args.json:
        print(json.dumps(result.summary, indent=2, default=str))
    else:
        print(format_report(result.summary))
    return 0


def _generate(args: argparse.Namespace) -> int:
    import time

    from idled.pipeline.generate import DEFAULT_START, GenConfig, generate

    kwargs = {}
    if args.segment_bytes is not None:
        kwargs["segment_bytes"] = args.segment_bytes
    try:
        config = GenConfig(
            out=args.out, users=args.users, hours=args.hours, seed=args.seed, daemons=args.daemons,
            start=DEFAULT_START if args.start is None else args.start, flappers=args.flappers, crashes=args.crashes,
            maintenance=args.maintenance, damage=args.damage, **kwargs,
        )
    except ValueError as exc:
        print(f"idled pipeline generate: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    stats = generate(config)
    seconds = time.perf_counter() - started
    events = sum(s.events for s in stats)
    for s in stats:
        print(
            f"  {s.directory}: {s.events:,} events, {s.users:,} users, detector {s.detector}, {s.segments} segments, "
            f"{s.bytes / 1e6:,.1f} MB; {s.restart_offlines:,} restart + {s.shutdown_offlines:,} shutdown offlines; "
            f"corrupted seq {s.corrupted_seq}, torn tail {s.torn_tail_bytes} B ({s.seconds:.1f} s)"
        )
    print(f"idled pipeline generate: {events:,} events in {seconds:.1f} s ({events / seconds:,.0f} events/s) -> {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.pipeline_command == "run":
        return _run_job(args)
    return _generate(args)


def main_submit(argv: Sequence[str] | None = None) -> int:
    """The job under spark-submit: same flags as `idled pipeline run`, master from spark-submit by default."""
    parser = argparse.ArgumentParser(prog="idled-pipeline (spark-submit)", description="idled presence analytics job")
    add_run_arguments(parser, default_master=None)
    args = parser.parse_args(argv)
    args.pipeline_command = "run"
    return _run_job(args)
