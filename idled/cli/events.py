"""`idled events`: print the presence event log, optionally following it like `tail -f`.

Reads the segment files directly (no server, no lock), so it works on a live log or a copied one. On a
terminal each record is one readable line (local time, seq, uid, kind, reason, and for an idle offline its
lateness); piped or redirected -- or with ``--json`` -- each record is one JSON object per line, keys in
record order, so scripts see what they always saw. `--follow` polls every `--poll-interval` seconds
for records appended to the active segment and for new segments, until Ctrl-C (exit status 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TextIO

from idled.log.eventlog import LogTailer

__all__ = ["add_arguments", "run", "format_record", "human_line", "local_time"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", required=True, metavar="DIR", help="event log directory (holds the *.seg files)")
    parser.add_argument(
        "--from", dest="from_seq", type=int, default=0, metavar="SEQ",
        help="first seq to print (default: oldest retained)",
    )
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new records until interrupted")
    parser.add_argument(
        "--poll-interval", type=float, default=0.2, metavar="SECONDS",
        help="with --follow, how often to look (default 0.2)",
    )
    parser.add_argument("--json", action="store_true",
                        help="JSON lines even on a terminal (default: JSON when piped, readable lines on a terminal)")


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return value.hex()  # msgpack bin: not produced by idled, but a log must stay printable
    return repr(value)


def format_record(record: dict[str, Any]) -> str:
    """One JSON line (no newline) for a record."""
    return json.dumps(record, ensure_ascii=False, default=_json_default)


def local_time(ts: Any) -> str:
    """Unix seconds as local time with milliseconds (``2026-11-03 14:02:07.215``); other values as given."""
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return str(ts)
    try:
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return str(ts)


def human_line(record: dict[str, Any]) -> str:
    """One readable line for an event record (from the wire or from the log)."""
    kind, reason = record.get("kind"), record.get("reason")
    line = f"{local_time(record.get('ts'))}  #{record.get('seq')}  {record.get('uid')!s}  {kind}  {reason}"
    ts, deadline = record.get("ts"), record.get("deadline")
    if kind == "offline" and reason == "idle" and isinstance(ts, (int, float)) and isinstance(deadline, (int, float)):
        line += f"  ({ts - deadline:.3f} s after the deadline"
        if isinstance(record.get("timeout"), (int, float)):
            line += f"; timeout {record['timeout']:g} s"
        line += ")"
    elif kind == "online" and isinstance(record.get("timeout"), (int, float)):
        line += f"  (timeout {record['timeout']:g} s)"
    return line


def _print_all(tailer: LogTailer, out: TextIO, fmt: Callable[[dict[str, Any]], str] = format_record) -> int:
    """Print everything the tailer has now; return how many records were printed."""
    printed = 0
    while True:
        records = tailer.poll()
        if not records:
            return printed
        out.write("".join(fmt(r) + "\n" for r in records))
        out.flush()
        printed += len(records)


def run(args: argparse.Namespace) -> int:
    directory = args.data_dir
    if not os.path.isdir(directory):
        print(f"idled events: {directory}: no such directory", file=sys.stderr)
        return 2
    if args.poll_interval <= 0:
        print("idled events: --poll-interval must be > 0", file=sys.stderr)
        return 2
    tailer = LogTailer(directory, max(0, args.from_seq))
    out = sys.stdout
    fmt = format_record if getattr(args, "json", False) or not out.isatty() else human_line
    try:
        _print_all(tailer, out, fmt)
        while args.follow:
            time.sleep(args.poll_interval)
            _print_all(tailer, out, fmt)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # `idled events | head`: the reader left. Point stdout at /dev/null so the interpreter's final flush
        # does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    except OSError as exc:  # e.g. the directory removed while following
        print(f"idled events: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m idled.cli.events ...`: the same command without the idled CLI (used by tests)."""
    parser = argparse.ArgumentParser(prog="idled events", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
