"""`idled pipeline run | generate | cluster | status | compact`: presence analytics on Spark, synthetic event logs to run it on,
and a standalone Spark cluster on this machine to run it against.

``run``'s flags and body are `idled.pipeline.runflags`, shared with the spark-submit entry
(`idled/pipeline/submit.py`), which cannot import this layer. pyspark is imported only when ``run``
executes, never by importing this module (see `runflags.run_from_args`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time

from idled.pipeline.cluster import add_cluster_arguments, run_cluster
from idled.pipeline.compact import add_compact_arguments, run_compact
from idled.pipeline.freshness import add_status_arguments, run_status
from idled.pipeline.generate import DEFAULT_START, GenConfig, generate
from idled.pipeline.runflags import add_run_arguments, positive_int, run_from_args

__all__ = ["add_arguments", "run"]


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
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _add_generate_arguments(gen: argparse.ArgumentParser) -> None:
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write (daemon-<d>/ subdirectories if --daemons > 1)")
    gen.add_argument("--users", type=positive_int, required=True, metavar="N",
                     help="simulated users, shared out over the daemons (about 100 events per user per day)")
    gen.add_argument("--hours", type=float, required=True, metavar="H",
                     help="simulated time span in hours from --start (fractions allowed)")
    gen.add_argument("--seed", type=int, default=1, metavar="S",
                     help="random seed: the same seed and flags write byte-identical logs (default 1)")
    gen.add_argument("--daemons", type=positive_int, default=1, metavar="D",
                     help="simulated daemons, one log each; run in parallel, one process per daemon up to the CPU count (default 1)")
    gen.add_argument("--start", type=_start, default=None, metavar="WHEN", help="first instant (default 2026-05-01T00:00Z)")
    gen.add_argument("--segment-bytes", type=positive_int, default=None, metavar="BYTES", help="segment size (default EventLog's)")
    gen.add_argument("--flappers", type=float, default=0.005, metavar="FRACTION", help="share of users with flap bursts (default 0.005)")
    gen.add_argument("--crashes", type=int, default=2, metavar="N", help="crash/restart cycles per daemon (default 2)")
    gen.add_argument("--maintenance", type=int, default=1, metavar="N", help="graceful restarts per daemon (default 1)")
    gen.add_argument("--devices", type=int, default=0, metavar="K",
                     help="events carry a \"device\" field: each login on one of K devices per user (default 0: none)")
    gen.add_argument("--grace", type=float, default=0.0, metavar="SECONDS",
                     help="simulate the daemon's offline_grace: closed offlines held that long, dropped when the user "
                          "logs in again meanwhile, else written with \"grace\" (default 0: none)")
    gen.add_argument("--damage", dest="damage", action="store_true", default=False,
                     help="after writing, corrupt one record and leave a torn tail in each daemon's log, to exercise "
                          "the pipeline's skip-and-count paths (default: clean logs)")
    # Damage used to be the default; old scripts pass --no-damage, which now only restates the default.
    gen.add_argument("--no-damage", dest="damage", action="store_false", help="deprecated: clean logs are the default")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pipeline_command", required=True, metavar="ACTION")
    run_parser = sub.add_parser("run", help="run the Spark job over event log directories",
                                description="Decode presence event segments with Spark and write analytics tables.")
    add_run_arguments(run_parser, default_master="local[*]")
    gen = sub.add_parser("generate", help="write synthetic event logs with the real EventLog writer",
                         description="Write realistic synthetic presence event logs (see idled.pipeline.generate).")
    _add_generate_arguments(gen)
    cluster = sub.add_parser("cluster", help="start a Spark standalone cluster on this machine (127.0.0.1) until Ctrl-C",
                             description="Start a Spark master and workers from the installed pyspark package, "
                                         "bound to 127.0.0.1, print the spark:// URL, and stop them on Ctrl-C/SIGTERM.")
    add_cluster_arguments(cluster)
    status = sub.add_parser("status", help="how fresh a run's output is: its watermark, its age, the log not yet read",
                            description="Print the watermark of the last run over --out (the newest event time fully "
                                        "accounted for), its age and the backlog per log directory; exit 1 if "
                                        "--max-age or --max-backlog is exceeded, 2 if there is no usable summary.json.")
    add_status_arguments(status)
    compact = sub.add_parser("compact", help="rewrite old days' small sessions files into a few large ones",
                             description="Rewrite each sessions date partition older than --older-than into a few large "
                                         "files sorted by offline_ts, atomically (a journal), under the lock incremental "
                                         "runs take; idempotent.")
    add_compact_arguments(compact)


def _generate(args: argparse.Namespace) -> int:
    kwargs: dict[str, int] = {}
    if args.segment_bytes is not None:
        kwargs["segment_bytes"] = args.segment_bytes
    try:
        config = GenConfig(
            out=args.out, users=args.users, hours=args.hours, seed=args.seed, daemons=args.daemons,
            start=DEFAULT_START if args.start is None else args.start, flappers=args.flappers, crashes=args.crashes,
            maintenance=args.maintenance, damage=args.damage, devices=args.devices, grace=args.grace, **kwargs,
        )
    except ValueError as exc:
        print(f"idled pipeline generate: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    stats = generate(config)
    seconds = time.perf_counter() - started
    events = sum(s.events for s in stats)
    for s in stats:
        damage = f"; damaged: corrupted seq {s.corrupted_seq}, torn tail {s.torn_tail_bytes} B" if config.damage else ""
        print(
            f"  {s.directory}: {s.events:,} events, {s.users:,} users, detector {s.detector}, {s.segments} segments, "
            f"{s.bytes / 1e6:,.1f} MB; {s.restart_offlines:,} restart + {s.shutdown_offlines:,} shutdown offlines"
            f"{damage} ({s.seconds:.1f} s)"
        )
    print(f"idled pipeline generate: {events:,} events in {seconds:.1f} s ({events / seconds:,.0f} events/s) -> {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.pipeline_command == "run":
        return run_from_args(args)
    if args.pipeline_command == "cluster":
        return run_cluster(args)
    if args.pipeline_command == "status":
        return run_status(args)
    if args.pipeline_command == "compact":
        return run_compact(args)
    return _generate(args)
