"""The job's flags and the body that runs them, shared by `idled pipeline run` and the spark-submit entry.

`idled.cli.pipeline` adds these flags to its ``run`` action; `submit.py` (run by spark-submit, which has no
`idled` dispatcher) parses them with `main_submit`. They live here, below the cli layer, because the
spark-submit entry is part of this package and lower layers never import idled.cli.

Importing this module does not import pyspark: `run_from_args` imports the job modules when it runs, and
they import pyspark inside their functions.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Sequence

from idled.pipeline.rules import FlapParams, check_grace

__all__ = ["positive_int", "add_run_arguments", "check_inputs", "run_from_args", "main_submit"]

_FLAP = FlapParams()


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_run_arguments(parser: argparse.ArgumentParser, *, default_master: str | None) -> None:
    parser.add_argument("--events", action="append", required=True, metavar="DIR",
                        help="a daemon's event log directory (*.seg); repeat for several daemons")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (Parquet tables, summary.json, PNG)")
    parser.add_argument("--master", default=default_master, metavar="URL",
                        help=f"Spark master (default {default_master or 'from spark-submit'})")
    parser.add_argument("--driver-memory", default="6g", metavar="SIZE", help="driver JVM heap when Spark is started here (default 6g)")
    parser.add_argument("--shuffle-partitions", type=positive_int, default=4, metavar="N", help="spark.sql.shuffle.partitions (default 4)")
    # The paired path cuts local segments into runs (`paired.runs_of_files`); the record path, and the paired
    # path on directories given as URIs, read files through binaryFiles with this as its hint.
    parser.add_argument("--min-partitions", type=positive_int, default=None, metavar="N",
                        help="decode tasks: how many runs of consecutive segment files the local segments of all "
                             "directories are cut into (default 2 x Spark's default parallelism); for directories "
                             "given as URIs, and on the record path, the binaryFiles hint (default one per 32 MiB "
                             "of segments, at least 2 x the default parallelism)")
    parser.add_argument("--flap-k", type=positive_int, default=_FLAP.k, metavar="K",
                        help=f"flapping: at least K short sessions ... (default {_FLAP.k})")
    parser.add_argument("--flap-short", type=float, default=_FLAP.short_s, metavar="SECONDS",
                        help=f"... shorter than this ... (default {_FLAP.short_s:g})")
    parser.add_argument("--flap-window", type=positive_int, default=_FLAP.window_s, metavar="SECONDS",
                        help=f"... starting within this many whole seconds (default {_FLAP.window_s})")
    parser.add_argument("--grace", type=float, default=0.0, metavar="SECONDS",
                        help="flappers and session_lengths: a session ended by a 'closed' offline and the same user's "
                             "next login on that daemon less than SECONDS later count as one session, as a daemon with "
                             "offline_grace would have logged them (default 0: none; offlines the daemon already delayed "
                             "are left as they are; not with --incremental)")
    parser.add_argument("--conf", action="append", default=[], type=_conf_pair, metavar="KEY=VALUE",
                        help="extra Spark setting, as spark-submit --conf (repeatable)")
    parser.add_argument("--no-chart", dest="chart", action="store_false", help="skip the concurrency PNG")
    parser.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    parser.add_argument("--incremental", action="store_true",
                        help="process only the log written since the last run with the same --state, rewriting only "
                             "the date partitions that changed (needs --state; --events must be readable at the same "
                             "path by the driver and the executors)")
    parser.add_argument("--local-batch-bytes", type=int, default=None, metavar="N",
                        help="with a local master, an input of at most N bytes (a full run's segment files, an "
                             "--incremental run's new bytes) is decoded and paired in a pool of local processes "
                             "without starting Spark (default: any size; 0: always Spark; Spark still starts if the "
                             "record path must run)")
    parser.add_argument("--state", metavar="DIR", default=None,
                        help="state directory of --incremental runs (files processed, open sessions, lateness values)")


def check_inputs(dirs: Sequence[str]) -> str | None:
    """Why the job cannot run over `dirs` (a missing or empty local directory, one given twice), or None."""
    from idled.pipeline.decode import daemon_names

    for directory in dirs:
        if "://" in directory:
            continue  # a cluster filesystem: Spark will say if it is missing
        if not os.path.isdir(directory):
            return f"{directory}: no such directory"
        if not glob.glob(os.path.join(glob.escape(directory), "*.seg")):
            return f"{directory}: no *.seg files"
    if len(set(daemon_names(dirs))) != len(dirs):
        return "the same directory is given twice"
    return None


def run_from_args(args: argparse.Namespace) -> int:
    """Run the job with the flags of `add_run_arguments`; print the report (or the summary as JSON)."""
    # The job modules are imported only now: `idled pipeline generate` and every `--help` must work where
    # pyspark (an optional ~490 MB extra that needs Java) is not installed; the job itself imports pyspark
    # inside its functions, when Spark starts.
    from idled.pipeline.job import JobConfig, run_job
    from idled.pipeline.report import format_report

    problem = check_inputs(args.events)
    if problem:
        print(f"idled pipeline run: {problem}", file=sys.stderr)
        return 2
    try:
        flap = FlapParams(k=args.flap_k, short_s=args.flap_short, window_s=args.flap_window)
    except ValueError as exc:
        print(f"idled pipeline run: {exc}", file=sys.stderr)
        return 2
    if args.incremental != (args.state is not None):
        print("idled pipeline run: --incremental and --state DIR go together", file=sys.stderr)
        return 2
    try:
        check_grace(args.grace)
    except ValueError as exc:
        print(f"idled pipeline run: {exc}", file=sys.stderr)
        return 2
    if args.grace > 0 and args.incremental:
        print("idled pipeline run: --grace is not supported with --incremental (run a full job)", file=sys.stderr)
        return 2
    if args.incremental and any("://" in d for d in args.events):
        print("idled pipeline run: --incremental reads local (or mounted) directories, not URLs", file=sys.stderr)
        return 2
    config = JobConfig(
        events=tuple(args.events), out=args.out, master=args.master, driver_memory=args.driver_memory,
        shuffle_partitions=args.shuffle_partitions, min_partitions=args.min_partitions, flap=flap, chart=args.chart,
        extra_conf=tuple(args.conf), progress=sys.stderr.isatty(), state=args.state, grace=args.grace,
        local_batch_bytes=args.local_batch_bytes,
    )
    from idled.pipeline.incremental import StateError

    try:
        result = run_job(config)
    except StateError as exc:
        print(f"idled pipeline run: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.summary, indent=2, default=str))
    else:
        print(format_report(result.summary))
    return 0


def main_submit(argv: Sequence[str] | None = None) -> int:
    """The job under spark-submit: same flags as `idled pipeline run`, master from spark-submit by default."""
    parser = argparse.ArgumentParser(prog="idled-pipeline (spark-submit)", description="idled presence analytics job")
    add_run_arguments(parser, default_master=None)
    return run_from_args(parser.parse_args(argv))
