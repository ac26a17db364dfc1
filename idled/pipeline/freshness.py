"""How fresh a pipeline's output is: the watermark a run records, and `idled pipeline status`.

Theory of operation
-------------------
A daemon writes its records in seq order with (almost) increasing ts, and a run reads every complete
record of each segment file it is given; so after a run, every event of a daemon up to the largest ts it
read (its *data end*) is in the tables. The run's **watermark** is the smallest data end of its daemons
(`watermark_of`): every event at or before it, of every daemon, is accounted for. A daemon that stopped
writing holds the watermark back -- which is what an operator wants to be told. A daemon with no records
at all has nothing to account for and is left out.

The run also records, per daemon directory, how many bytes of each segment file it read (`log_read`: the
file's size minus its torn tail, the end of the last complete record). The **backlog** of a directory is
what is there now and was not read (`backlog_of`): a new file counts whole, a grown one from where the run
stopped, a file rewritten shorter (a copy replaced) whole; files deleted by retention count nothing.

`status` puts the two together with the *age* of the watermark (``now`` minus the watermark: how stale the
tables are, the figure to alert on), and `run_status` is the command: exit 0 when fresh, 1 when
``--max-age`` or ``--max-backlog`` is exceeded, 2 when there is no readable summary. Plain file I/O, no
pyspark; time is an argument (`status`), only `run_status` reads the clock.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["watermark_of", "log_read_of", "backlog_of", "status", "format_status", "add_status_arguments", "run_status"]

EXIT_FRESH: Final = 0
EXIT_STALE: Final = 1
EXIT_USAGE: Final = 2


def watermark_of(names: Sequence[str], data_end: Mapping[int, float | None]) -> dict[str, Any]:
    """The summary's freshness keys: ``watermark`` (the smallest data end of the daemons with records,
    None if none has any) and ``data_end`` per daemon directory (None for a daemon with no records)."""
    ends = {name: data_end.get(index) for index, name in enumerate(names)}
    known = [end for end in ends.values() if end is not None]
    return {"watermark": min(known) if known else None, "data_end": ends}


def log_read_of(names: Sequence[str], per_file: Mapping[str, tuple[int, int, int]]) -> dict[str, dict[str, int]]:
    """``log_read`` for the summary: per daemon directory, segment file name -> bytes read. `per_file`:
    path or ``file:`` URI -> (daemon, size, torn bytes). Only local files still present are listed (a long-lived state remembers
    files retention deleted long ago; they are no backlog either way)."""
    from urllib.parse import urlparse

    read: dict[str, dict[str, int]] = {name: {} for name in names}
    for path, (daemon, size, torn) in per_file.items():
        local = urlparse(path).path if path.startswith("file:") else path  # binaryFiles names files by URI
        if "://" not in local and os.path.exists(local):
            read[names[daemon]][os.path.basename(path)] = size - torn
    return read


def backlog_of(directory: str, read: Mapping[str, int]) -> tuple[int, int]:
    """(bytes, files) of `directory`'s segments not read by the run whose `log_read` entry is `read`."""
    total = files = 0
    for entry in os.scandir(directory):
        if not entry.name.endswith(".seg") or entry.name[0] in "._" or not entry.is_file():
            continue
        size = entry.stat().st_size
        done = read.get(entry.name, 0)
        pending = size if size < done else size - done
        if pending > 0:
            total += pending
            files += 1
    return total, files


def status(summary: Mapping[str, Any], logs: Sequence[str] | None, now: float) -> dict[str, Any]:
    """The freshness of the run that wrote `summary`: watermark, its age at `now`, backlog per directory
    (`logs`, default the run's inputs; a directory the run did not read counts whole)."""
    inputs = list(summary.get("inputs", []))
    read = summary.get("log_read", {})
    watermark = summary.get("watermark")
    daemons = []
    for position, directory in enumerate(logs if logs else inputs):
        path = os.path.abspath(directory)
        # the run's entry for this directory: by path, else by position (a log copied elsewhere)
        name = path if path in read else (inputs[position] if logs and len(logs) == len(inputs) else path)
        pending, files = backlog_of(directory, read.get(name, {})) if os.path.isdir(directory) else (0, 0)
        daemons.append({"log": directory, "data_end": summary.get("data_end", {}).get(name), "backlog_bytes": pending,
                        "backlog_files": files, "missing": not os.path.isdir(directory)})
    return {
        "out": summary.get("out"), "watermark": watermark,
        "age_s": None if watermark is None else round(now - watermark, 3),
        "backlog_bytes": sum(d["backlog_bytes"] for d in daemons), "daemons": daemons,
        "incremental": bool(summary.get("incremental")),
    }


def _utc(seconds: float | None) -> str:
    return "-" if seconds is None else dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(abs(seconds))
    text = f"{whole // 3600}h{whole % 3600 // 60:02d}m{whole % 60:02d}s"
    return text if seconds >= 0 else f"-{text} (in the future: a clock ahead?)"


def format_status(report: Mapping[str, Any]) -> str:
    lines = [f"idled pipeline status: {report['out']}",
             f"  watermark: {_utc(report['watermark'])} (age {_age(report['age_s'])})",
             f"  backlog: {report['backlog_bytes']:,} bytes not yet read"]
    for daemon in report["daemons"]:
        where = " (missing)" if daemon["missing"] else ""
        lines.append(f"  {daemon['log']}{where}: data end {_utc(daemon['data_end'])}, backlog {daemon['backlog_bytes']:,} "
                     f"bytes in {daemon['backlog_files']} file(s)")
    return "\n".join(lines)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="the output directory of `idled pipeline run` (its summary.json)")
    parser.add_argument("--log", action="append", default=None, metavar="DIR",
                        help="a daemon's event log directory to measure the backlog of (repeatable; default the run's --events)")
    parser.add_argument("--max-age", type=float, default=None, metavar="SECONDS",
                        help="exit 1 if the watermark is older than this (or there is none)")
    parser.add_argument("--max-backlog", type=int, default=None, metavar="BYTES",
                        help="exit 1 if more than this many bytes of log are not yet read")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def run_status(args: argparse.Namespace) -> int:
    """`idled pipeline status`: 0 fresh, 1 stale (--max-age / --max-backlog exceeded), 2 no usable summary."""
    path = os.path.join(args.out, "summary.json")
    try:
        with open(path) as file:
            summary = json.load(file)
    except (OSError, ValueError) as exc:
        print(f"idled pipeline status: {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if "log_read" not in summary:
        print(f"idled pipeline status: {path} has no freshness keys (written by an older idled); run again", file=sys.stderr)
        return EXIT_USAGE
    report = status(summary, args.log, time.time())
    print(json.dumps(report, indent=2) if args.json else format_status(report))
    stale = args.max_age is not None and (report["age_s"] is None or report["age_s"] > args.max_age)
    stale |= args.max_backlog is not None and report["backlog_bytes"] > args.max_backlog
    return EXIT_STALE if stale else EXIT_FRESH
