"""`idled events`: print the presence event log, optionally following it like `tail -f`.

Reads the segment files directly (no server, no lock), so it works on a live log or a copied one. On a
terminal each record is one readable line (local time, seq, uid, kind, reason, and for an idle offline its
lateness); piped or redirected -- or with ``--json`` -- each record is one JSON object per line, keys in
record order, so scripts see what they always saw. `--follow` polls every `--poll-interval` seconds
for records appended to the active segment and for new segments, until Ctrl-C (exit status 0).

Damage is never silent: records lost to it are skipped (every good record after them is still printed) and
each damaged region is reported on stderr as it is found; `--strict` then exits 1. `--verify` prints no
records: it reports every segment's damage (like `redis-check-aof`) and changes nothing -- exit 0 clean,
1 damaged. The directory defaults to what `idled serve` uses: `$STATE_DIRECTORY`, else ./idled-data.
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

from idled.log.eventlog import LogTailer, SegmentReport, verify_log
from idled.ops.config import Config

__all__ = ["add_arguments", "run", "format_record", "human_line", "local_time", "verify"]

EXIT_DAMAGED = 1


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", metavar="DIR",
        help="event log directory (holds the *.seg files; default as for serve: $STATE_DIRECTORY, else ./idled-data)",
    )
    parser.add_argument(
        "--from", dest="from_seq", type=_non_negative_int, default=0, metavar="SEQ",
        help="first seq to print (default: oldest retained)",
    )
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new records until interrupted")
    parser.add_argument(
        "--poll-interval", type=float, default=0.2, metavar="SECONDS",
        help="with --follow, how often to look (default 0.2)",
    )
    parser.add_argument("--json", action="store_true",
                        help="JSON lines even on a terminal (default: JSON when piped, readable lines on a terminal)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if any damage was skipped")
    parser.add_argument(
        "--verify", action="store_true",
        help="print no records: report each segment's damage, change nothing; exit 0 clean, 1 damaged",
    )


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


class _Printer:
    """Prints what the tailer has now, and reports damage on stderr once per region."""

    def __init__(
        self, tailer: LogTailer, out: TextIO, err: TextIO, fmt: Callable[[dict[str, Any]], str] = format_record
    ) -> None:
        self.tailer = tailer
        self.out = out
        self.err = err
        self.fmt = fmt
        self.reported = 0

    def drain(self) -> int:
        printed = 0
        while True:
            records = self.tailer.poll()
            self._report()
            if not records:
                return printed
            self.out.write("".join(self.fmt(r) + "\n" for r in records))
            self.out.flush()
            printed += len(records)

    def _report(self) -> None:
        damage = self.tailer.damage
        while self.reported < len(damage):
            path, offset, length, records = damage[self.reported]
            print(
                f"idled events: damage in {path} at offset {offset}: {length} bytes skipped "
                f"(about {records} records lost)",
                file=self.err,
            )
            self.reported += 1

    def summary(self) -> None:
        tailer = self.tailer
        if tailer.damage:
            print(
                f"idled events: skipped {tailer.skipped_bytes} damaged bytes in {len(tailer.damage)} regions "
                f"(about {tailer.corrupt} records lost)",
                file=self.err,
            )
        pending = tailer.pending_bytes()
        if pending:
            print(
                f"idled events: {pending} bytes at the end of the newest segment are not a complete record "
                "(a torn tail, or a write in progress)",
                file=self.err,
            )


def _describe(report: SegmentReport) -> list[str]:
    lines = [
        f"  offset {offset}: {length} bytes damaged, about {records} records skipped"
        for offset, length, records in report.damage
    ]
    if report.tail_bytes:
        what = f"about {report.tail_records} damaged records" if report.tail_records else "an incomplete record"
        lines.append(f"  offset {report.tail_offset}: {report.tail_bytes} bytes after the last good record ({what})")
    return lines


def verify(directory: str, out: TextIO) -> int:
    """Report every segment's damage; change nothing. 0 clean, EXIT_DAMAGED damaged."""
    reports, damaged_snapshots = verify_log(directory)
    damaged = 0
    for report in reports:
        if not report.damaged:
            out.write(f"{report.path}: ok, {report.records} records, {report.size} bytes\n")
            continue
        damaged += 1
        out.write(f"{report.path}: DAMAGED, {report.records} good records, {report.size} bytes\n")
        out.write("".join(line + "\n" for line in _describe(report)))
    for path in damaged_snapshots:
        out.write(f"{path}: DAMAGED snapshot (checksum or shape)\n")
    total = damaged + len(damaged_snapshots)
    out.write(f"{len(reports)} segments, {total} damaged\n" if total else f"{len(reports)} segments, clean\n")
    out.flush()
    return EXIT_DAMAGED if total else 0


def run(args: argparse.Namespace) -> int:
    directory = os.fspath(args.data_dir or Config().resolved_data_dir(os.environ))
    if not os.path.isdir(directory):
        print(f"idled events: {directory}: no such directory", file=sys.stderr)
        return 2
    if args.poll_interval <= 0:
        print("idled events: --poll-interval must be > 0", file=sys.stderr)
        return 2
    if args.verify:
        return verify(directory, sys.stdout)
    out = sys.stdout
    fmt = format_record if getattr(args, "json", False) or not out.isatty() else human_line
    printer = _Printer(LogTailer(directory, args.from_seq), out, sys.stderr, fmt)
    try:
        printer.drain()
        while args.follow:
            time.sleep(args.poll_interval)
            printer.drain()
    except KeyboardInterrupt:
        pass
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
    printer.summary()
    return EXIT_DAMAGED if args.strict and printer.tailer.damage else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m idled.cli.events ...`: the same command without the idled CLI (used by tests)."""
    parser = argparse.ArgumentParser(prog="idled events", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
