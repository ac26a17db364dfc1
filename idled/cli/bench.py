"""`idled bench`: every idle detector under the same simulated keepalive load (no network); with
``--growth``, the presence table grown from 0 to N sessions with every login timed; with ``--devices``, the
keepalive, parse and login cost and the memory of (uid, device) session keys against plain uids, in one run;
with ``--writer``, the event-log writer's throughput and latency under each fsync policy; with ``--last-seen``,
what the event log's last-seen map costs per offline user (memory, snapshot bytes, write and load time); with
``--status-page``, what open status pages cost a loaded daemon in CPU (`idled.tools.bench.statuspage`); with
``--core-kill``, what a core crash under ``--workers 2`` costs its users (`idled.tools.bench.corekill`). The
modes that start real processes (``--api``, ``--hook``, ``--standby``, ``--status-page``, ``--core-kill``) are
read and run by `idled.cli.benchprocs`.

The machinery is in `idled.tools.bench` (`schedule`, `detectors`, `table`; `growth`; `devices`; `writer`); this module reads
the flags, checks them -- and the output files, and matplotlib for ``--plot`` -- before minutes of
benchmarking, runs, prints, and returns the exit status of the one table (`idled.ops.fatal`, shown in `--help`):
3 when a target FAILED (a detector expired a key early, late or never at any size; a performance target
missed at the target size).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from pathlib import Path

from idled.cli import benchprocs
from idled.cli.benchprocs import UsageError, print_lines
from idled.core.detector import DEFAULT_CHUNK
from idled.core.factory import DETECTOR_KINDS
from idled.ops.fatal import EXIT_FAILURE, EXIT_OK, EXIT_TARGET_FAILED, EXIT_USAGE
from idled.tools.bench.detectors import (
    CLOCKS, DEFAULT_SECONDS, DEFAULT_SILENT_FRACTION, DEFAULT_SIZES, DEFAULT_SLOTS, DEFAULT_TIMEOUT, SizeReport,
    bench_size,
)
from idled.tools.bench.table import failed, format_table, json_rows, number, plot, target_checks

__all__ = ["add_arguments", "run"]

DEFAULT_WRITER_SECONDS = 3.0
DEFAULT_GROWTH_SIZES = [1_000_000]
DEFAULT_GROWTH_DETECTORS = ["ring-lazy"]  # the server's default
DEFAULT_LOGIN_RATE = 50_000.0
DEFAULT_DEVICES_SIZES = [100_000]
DEFAULT_DEVICES_ROUNDS = 15


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError("sizes must be positive")
    return sizes


def _kinds(text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in DETECTOR_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"detectors must be among {', '.join(DETECTOR_KINDS)}")
    return kinds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--sizes", type=_sizes, default=list(DEFAULT_SIZES), help="comma-separated key counts (default: %(default)s)"
    )
    parser.add_argument(
        "--pings-per-timeout",
        type=float,
        default=1.0,
        metavar="K",
        help="keepalives each live key sends per timeout, >= 1 (default: 1)",
    )
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help="timeout in ticks (default: %(default)s)")
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS, help="ring slots (default: %(default)s)")
    parser.add_argument(
        "--seconds",
        type=float,
        metavar="N",
        help=f"measured simulated seconds, a whole number, after a warm-up of one timeout (default: {DEFAULT_SECONDS}); "
        f"with --writer: seconds per writer run (default: {DEFAULT_WRITER_SECONDS:g})",
    )
    parser.add_argument(
        "--login-spread",
        type=float,
        metavar="TICKS",
        help="keys log in over this many ticks (default: one timeout, the steady state; "
        "one keepalive period or less simulates a reconnect storm)",
    )
    parser.add_argument(
        "--silent-fraction",
        type=float,
        default=DEFAULT_SILENT_FRACTION,
        help="fraction of keys that go silent and must expire (default: %(default)s)",
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=DEFAULT_CHUNK,
        help="advance() limit, as the server uses it; 0 = unchunked (default: %(default)s)",
    )
    parser.add_argument(
        "--detectors",
        type=_kinds,
        default=list(DETECTOR_KINDS),
        help=f"comma-separated subset of {','.join(DETECTOR_KINDS)} (default: all)",
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: thread CPU time, immune to preemption on a shared machine; wall: perf_counter (default: cpu)",
    )
    parser.add_argument(
        "--wake",
        choices=("tick", "due"),
        default="tick",
        help="tick: advance at every tick boundary, then while next_due() <= now; "
        "due: only while next_due() <= now (default: tick)",
    )
    parser.add_argument("--seed", type=int, default=1, help="schedule random seed (default: %(default)s)")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass (bytes_per_key = 0)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the result rows as JSON")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="plot tick_max and CPU against size")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    _add_mode_arguments(parser)
    benchprocs.add_arguments(parser)


def _add_mode_arguments(parser: argparse.ArgumentParser) -> None:
    """The two other modes: --growth and --writer."""
    growth = parser.add_argument_group("growth of the presence table (instead of the detector table)")
    growth.add_argument(
        "--growth",
        action="store_true",
        help="attach --sizes sessions (default: 1000000) one by one to the server's presence table, with "
        "keepalives and ticks, and time every login: the stall when its map grows (--detectors default: "
        "ring-lazy; takes --timeout as seconds, --slots, --chunk, --clock, --seed, --no-memory, --quiet)",
    )
    growth.add_argument(
        "--login-rate",
        type=float,
        default=DEFAULT_LOGIN_RATE,
        metavar="N",
        help="with --growth: attaches per simulated second (default: %(default).0f)",
    )
    growth.add_argument(
        "--keepalive",
        type=float,
        metavar="S",
        help="with --growth: the sessions' keepalive in seconds (default: none, i.e. the default timeout)",
    )
    devices = parser.add_argument_group("session keys with devices (instead of the detector table)")
    devices.add_argument(
        "--devices",
        action="store_true",
        help="the presence table's keepalive (touch), a touch frame's key validation and a login, with plain uid "
        "keys and with (uid, device) keys, alternating in one run, and the memory per session of each "
        f"(--sizes default: {DEFAULT_DEVICES_SIZES[0]}; takes --clock, --no-memory and --rounds)",
    )
    devices.add_argument(
        "--rounds", type=int, default=DEFAULT_DEVICES_ROUNDS, metavar="N",
        help="with --devices: timed rounds per kind of key, the best kept (default: %(default)s)",
    )
    writer = parser.add_argument_group("event-log writer (instead of the detectors)")
    writer.add_argument(
        "--writer",
        action="store_true",
        help="measure run_writer's durable events/s, batch sizes and fsync latency under each fsync policy, "
        "on a real directory (--seconds per run; takes only --seconds and --dir)",
    )
    writer.add_argument("--dir", metavar="DIR",
                        help="with --writer or --last-seen: where the temporary logs go (default: $TMPDIR)")
    last_seen = parser.add_argument_group("last-seen map (instead of the detectors)")
    last_seen.add_argument(
        "--last-seen",
        action="store_true",
        help="fill the event log's last-seen map with --sizes offline users (default: 1000000), str and int uids: "
        "memory per user (RSS and tracemalloc), snapshot bytes on disk, snapshot write/load time (takes only "
        "--sizes and --dir)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        status = benchprocs.run(args, vars(_defaults()))
        if status is not None:
            return status
        if args.writer:
            return _writer(args)
        if args.last_seen:
            return _last_seen(args)
        if args.growth:
            return _growth(args)
        if args.devices:
            return _devices(args)
        _check(args)
    except UsageError as exc:
        print(f"idled bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    k = args.pings_per_timeout
    seconds = DEFAULT_SECONDS if args.seconds is None else int(args.seconds)
    chunk = args.chunk or None
    spread = args.timeout if args.login_spread is None else args.login_spread
    warmup = max(args.timeout, math.ceil(spread))
    header = (
        f"idled bench: timeout {args.timeout} ticks, {args.slots} slots, {number(k)} ping(s) per timeout, "
        f"{args.silent_fraction:.1%} silent, logins over {number(spread)} ticks, "
        f"warm-up {warmup} + {seconds} measured ticks, chunk {chunk or 'none'}, {args.clock} clock, "
        f"advance {'every tick' if args.wake == 'tick' else 'only when due'}, seed {args.seed}"
    )
    try:
        reports = [_bench_one_size(args, size, seconds, chunk) for size in args.sizes]
        print(format_table(reports, header))
        if args.json is not None:
            args.json.write_text(json.dumps(json_rows(reports), indent=2) + "\n")
        if args.plot is not None:
            plot(reports, args.plot, header.removeprefix("idled bench: "))
    except KeyboardInterrupt:
        print("idled bench: interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError, MemoryError) as exc:  # RuntimeError: a detector that never stops being due
        print(f"idled bench: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    bad = failed(target_checks(reports))
    if bad:
        print(f"idled bench: FAILED: {'; '.join(c.label for c in bad)}", file=sys.stderr)
        return EXIT_TARGET_FAILED
    return EXIT_OK


def _bench_one_size(args: argparse.Namespace, size: int, seconds: int, chunk: int | None) -> SizeReport:
    return bench_size(
        size,
        kinds=args.detectors,
        timeout=args.timeout,
        slots=args.slots,
        pings_per_timeout=args.pings_per_timeout,
        seconds=seconds,
        silent_fraction=args.silent_fraction,
        chunk=chunk,
        seed=args.seed,
        login_spread=args.login_spread,
        memory=not args.no_memory,
        clock=CLOCKS[args.clock],
        wake=args.wake,
        progress=None if args.quiet else sys.stderr,
    )


def _check(args: argparse.Namespace) -> None:
    """Every flag, and the output files, before the first schedule is built."""
    k = args.pings_per_timeout
    if not (k >= 1 and math.isfinite(k)):
        raise UsageError("--pings-per-timeout must be >= 1 (else live keys would expire)")
    if not 1 <= args.timeout <= 100_000 or args.slots < 1 or args.chunk < 0:
        raise UsageError("--timeout, --slots must be positive and --chunk >= 0")
    if args.dir is not None:
        raise UsageError("--dir is for --writer and --last-seen")
    if args.keepalive is not None or args.login_rate != DEFAULT_LOGIN_RATE:
        raise UsageError("--keepalive and --login-rate are for --growth")
    if args.rounds != DEFAULT_DEVICES_ROUNDS:
        raise UsageError("--rounds is for --devices")
    benchprocs.check_unused(args)
    if args.seconds is not None and not float(args.seconds).is_integer():
        raise UsageError(f"--seconds must be a whole number of ticks here, got {args.seconds:g}")
    seconds = DEFAULT_SECONDS if args.seconds is None else int(args.seconds)
    if seconds < args.timeout + 2:
        raise UsageError(
            f"--seconds must be at least timeout + 2 = {args.timeout + 2} "
            "(silent keys must go silent and expire inside the measured window)"
        )
    if args.login_spread is not None and not 0 < args.login_spread <= 100_000:
        raise UsageError("--login-spread must be positive")
    if not 0 <= args.silent_fraction < 1:
        raise UsageError("--silent-fraction must be in [0, 1)")
    if args.json is not None:
        _check_writable(args.json, "--json")
    if args.plot is not None:
        try:
            importlib.import_module("matplotlib")  # imported, not just found: a broken install fails here too
        except ImportError as exc:
            raise UsageError(f"--plot needs matplotlib ({exc}): pip install matplotlib (the plot extra), or drop --plot") from None
        _check_writable(args.plot, "--plot")


def _check_writable(path: Path, flag: str) -> None:
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    ok = os.access(path, os.W_OK) if path.exists() else os.access(path.absolute().parent, os.W_OK | os.X_OK)
    if not ok:
        raise UsageError(f"{flag} {path}: cannot write there")


# ------------------------------------------------------------------------------------------ --growth


def _growth(args: argparse.Namespace) -> int:
    """`idled bench --growth [--sizes N] [--detectors K] [--login-rate R] [--keepalive S] ...`."""
    _only(args, ("growth", "sizes", "detectors", "timeout", "slots", "chunk", "clock", "seed", "no_memory",
                 "login_rate", "keepalive"), "--growth")
    if args.login_rate <= 0 or not math.isfinite(args.login_rate):
        raise UsageError("--login-rate must be positive")
    if args.keepalive is not None and not 0 < args.keepalive <= 3600:
        raise UsageError("--keepalive must be in (0, 3600] seconds")
    if not 1 <= args.timeout <= 3600 or args.slots < 1 or args.chunk < 0:
        raise UsageError("--timeout must be in [1, 3600] seconds with --growth, --slots positive, --chunk >= 0")
    defaults = _defaults()
    sizes = DEFAULT_GROWTH_SIZES if args.sizes == defaults.sizes else args.sizes
    kinds = DEFAULT_GROWTH_DETECTORS if args.detectors == defaults.detectors else args.detectors
    from idled.tools.bench import growth  # the presence table and the GC policy: only for this mode

    lines = growth.report_lines(
        sizes, kinds, rate=args.login_rate, timeout=float(args.timeout), keepalive=args.keepalive,
        slots=args.slots, chunk=args.chunk or None, clock_name=args.clock, seed=args.seed, memory=not args.no_memory,
    )
    return print_lines(lines, MemoryError)


def _only(args: argparse.Namespace, allowed: tuple[str, ...], mode: str) -> None:
    benchprocs.only(args, vars(_defaults()), allowed, mode)


# ------------------------------------------------------------------------------------------ --devices


def _devices(args: argparse.Namespace) -> int:
    """`idled bench --devices [--sizes N] [--rounds R] [--clock C] [--no-memory]`."""
    _only(args, ("devices", "sizes", "rounds", "clock", "no_memory"), "--devices")
    if not 1 <= args.rounds <= 1000:
        raise UsageError("--rounds must be in [1, 1000]")
    sizes = DEFAULT_DEVICES_SIZES if args.sizes == _defaults().sizes else args.sizes
    from idled.tools.bench import devices  # msgpack and the protocol's parser: only for this mode

    return print_lines(devices.report_lines(sizes, rounds=args.rounds, clock_name=args.clock,
                                             memory=not args.no_memory), MemoryError)


# ------------------------------------------------------------------------------------------ --writer


def _writer(args: argparse.Namespace) -> int:
    """`idled bench --writer [--seconds S] [--dir DIR]`: run_writer's figures per fsync policy."""
    _only(args, ("writer", "seconds", "dir"), "--writer")
    seconds = DEFAULT_WRITER_SECONDS if args.seconds is None else args.seconds
    if not (0 < seconds <= 3600):
        raise UsageError("--seconds must be in (0, 3600] with --writer")
    if args.dir is not None and not (os.path.isdir(args.dir) and os.access(args.dir, os.W_OK | os.X_OK)):
        raise UsageError(f"--dir {args.dir}: not a writable directory")
    from idled.tools.bench import writer  # trio and the event log: only for this mode

    return print_lines(writer.report_lines(seconds, args.dir), OSError)


def _last_seen(args: argparse.Namespace) -> int:
    """`idled bench --last-seen [--sizes N] [--dir DIR]`: the last-seen map's cost per offline user."""
    _only(args, ("last_seen", "sizes", "dir"), "--last-seen")
    if args.dir is not None and not (os.path.isdir(args.dir) and os.access(args.dir, os.W_OK | os.X_OK)):
        raise UsageError(f"--dir {args.dir}: not a writable directory")
    sizes = DEFAULT_GROWTH_SIZES if args.sizes == _defaults().sizes else args.sizes
    from idled.tools.bench import lastseen

    return print_lines(lastseen.report_lines(sizes, args.dir), OSError)


def _defaults() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([])
