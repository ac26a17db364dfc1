"""`idled bench`'s modes that measure real processes -- a daemon, its clients, a receiver, a browser: ``--api``,
``--hook``, ``--standby``, ``--status-page`` and ``--core-kill`` (the machinery is in `idled.tools.bench`: ``api``,
``hook``, ``standby``, ``statuspage``, ``corekill``); and the small pieces every mode of `idled.cli.bench` shares:
the usage error, the one-flag-set-per-mode rule (`only`) and the report printer (`print_lines`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from idled.ops.fatal import EXIT_FAILURE, EXIT_OK

__all__ = ["UsageError", "add_arguments", "check_unused", "only", "print_lines", "run"]

DEFAULT_HOOK_EVENTS = 20_000
DEFAULT_HOOK_RATE = 5_000.0
DEFAULT_PAGES = 10
DEFAULT_ELECTION_TTL = 5


class UsageError(Exception):
    pass


def print_lines(lines: Iterator[str], failure: type[Exception]) -> int:
    """Print a mode's report lines as they come; Ctrl-C and ``failure`` end it with one line and a status."""
    try:
        for line in lines:
            print(line, flush=True)
    except KeyboardInterrupt:
        print("idled bench: interrupted", file=sys.stderr)
        return 130
    except failure as exc:
        print(f"idled bench: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def only(args: argparse.Namespace, defaults: Mapping[str, Any], allowed: tuple[str, ...], mode: str) -> None:
    """Refuse any flag given with ``mode`` that it does not take (``defaults``: every flag's default)."""
    extra = sorted(f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                   if k not in ("command", "quiet", *allowed) and v != defaults.get(k))
    if extra:
        takes = [f"--{k.replace('_', '-')}" for k in allowed if f"--{k.replace('_', '-')}" != mode]
        what = f"only {', '.join(takes[:-1])} and {takes[-1]}" if len(takes) > 1 else f"only {takes[0]}" if takes \
            else "no other flag"
        raise UsageError(f"{mode} takes {what}; drop {', '.join(extra)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    hook = parser.add_argument_group("webhook delivery (instead of the detectors)")
    hook.add_argument(
        "--hook",
        action="store_true",
        help="start idled serve, a local receiver and idled hook, make --hook-events events at --hook-rate per "
        "second through a gateway, and print delivery events/s, latency p50/p99/max and the hook's CPU",
    )
    hook.add_argument("--hook-events", type=int, default=DEFAULT_HOOK_EVENTS, metavar="N",
                      help="with --hook: events to make (default: %(default)s)")
    hook.add_argument("--hook-rate", type=float, default=DEFAULT_HOOK_RATE, metavar="N",
                      help="with --hook: events per second (default: %(default).0f)")
    parser.add_argument(
        "--api", action="store_true",
        help="HTTP presence API: POST /v1/presence queries/s per daemon CPU-second for batches of 1, 100 and "
        "10000 uids, 100000 users online, against a real idled serve (takes only --seconds)",
    )
    parser.add_argument(
        "--standby", action="store_true",
        help="an active idled serve at 3000 events/s for 5 x --seconds (default 10): its CPU per event and a durable "
        "observer's latency without, with (async) and again without a standby, then with --sync-standby without and "
        "with a sync standby; the standby's lag (takes only --seconds)",
    )
    page = parser.add_argument_group("status page (instead of the detectors)")
    page.add_argument(
        "--status-page", action="store_true",
        help="a loaded `idled serve` (--sizes sessions, default 5000), its CPU over --seconds (default 30) with no "
        "page open, then with --pages tabs of headless Chromium polling its status page: CPU per page and per poll",
    )
    page.add_argument("--pages", type=int, default=DEFAULT_PAGES, metavar="N",
                      help="with --status-page: tabs (default: %(default)s)")
    parser.add_argument(
        "--core-kill", type=int, nargs="?", const=3, metavar="RUNS",
        help="`idled serve --workers 2` with --sizes users (default 2000) pinging through its edges: SIGKILL the core "
        "RUNS times (default 3); users closed, and how long until it is back and a new login is recorded online",
    )

    fail = parser.add_argument_group("failover (instead of the detectors)")
    fail.add_argument(
        "--failover", type=int, nargs="?", const=20, metavar="RUNS",
        help="a real etcd and two `idled serve --election` cores at 3000 events/s: SIGKILL the leader RUNS times "
        "(default 20); kill -> first accepted login, the follower's lag, durable events lost",
    )
    fail.add_argument("--failover-flags", default="", metavar="FLAGS",
                      help="with --failover: more serve flags for both cores, e.g. '--sync-standby'")
    fail.add_argument("--election-ttl", type=int, default=DEFAULT_ELECTION_TTL, metavar="S",
                      help="with --failover: the lease ttl (default: %(default)s)")


def check_unused(args: argparse.Namespace) -> None:
    """The detector table's mode: none of these modes' own flags may be given."""
    if args.hook_events != DEFAULT_HOOK_EVENTS or args.hook_rate != DEFAULT_HOOK_RATE:
        raise UsageError("--hook-events and --hook-rate are for --hook")
    if args.pages != DEFAULT_PAGES:
        raise UsageError("--pages is for --status-page")
    if args.failover_flags or args.election_ttl != DEFAULT_ELECTION_TTL:
        raise UsageError("--failover-flags and --election-ttl are for --failover")


def run(args: argparse.Namespace, defaults: Mapping[str, Any]) -> int | None:
    """Run the process mode ``args`` asks for (its exit status), or None if it asks for none of them."""
    if args.api:
        from idled.tools.bench.api import DEFAULT_USERS, bench_api, format_rows
        print(format_rows(bench_api(seconds=args.seconds or 5.0), DEFAULT_USERS))
        return EXIT_OK
    if args.hook:
        return _hook(args, defaults)
    if args.status_page:
        return _status_page(args, defaults)
    if args.core_kill is not None:
        return _core_kill(args, defaults)
    if args.standby:
        return _standby(args, defaults)
    if args.failover is not None:
        return _failover(args, defaults)
    return None


def _failover(args: argparse.Namespace, defaults: Mapping[str, Any]) -> int:
    """`idled bench --failover [RUNS] [--failover-flags F] [--election-ttl S]`: SIGKILL the elected leader."""
    only(args, defaults, ("failover", "failover_flags", "election_ttl"), "--failover")
    if not 1 <= args.failover <= 200 or not 2 <= args.election_ttl <= 60:
        raise UsageError("--failover takes RUNS in [1, 200] and --election-ttl in [2, 60]")
    from idled.tools.bench import failover  # etcd and two cores: only for this mode

    return print_lines(failover.report_lines(args.failover, 3000.0, args.election_ttl, args.failover_flags.split()),
                       RuntimeError)


def _hook(args: argparse.Namespace, defaults: Mapping[str, Any]) -> int:
    """`idled bench --hook [--hook-events N] [--hook-rate R]`: webhook delivery with real processes."""
    only(args, defaults, ("hook", "hook_events", "hook_rate"), "--hook")
    if not 1 <= args.hook_events <= 10_000_000 or not 0 < args.hook_rate <= 1_000_000:
        raise UsageError("--hook-events must be in [1, 10000000] and --hook-rate in (0, 1000000]")
    from idled.tools.bench import hook  # subprocesses and an HTTP receiver: only for this mode

    return print_lines(hook.report_lines(args.hook_events, args.hook_rate), RuntimeError)


def _standby(args: argparse.Namespace, defaults: Mapping[str, Any]) -> int:
    """`idled bench --standby [--seconds S]`: what a standby costs the active, its lag, and what a sync standby
    adds to a durable observer's latency, at 3000 events/s."""
    only(args, defaults, ("standby", "seconds"), "--standby")
    seconds = 10.0 if args.seconds is None else args.seconds
    if not 1 <= seconds <= 3600:
        raise UsageError("--seconds must be in [1, 3600] for --standby")
    from idled.tools.bench import standby  # subprocesses: only for this mode

    return print_lines(standby.report_lines(seconds, 3000.0), RuntimeError)


def _status_page(args: argparse.Namespace, defaults: Mapping[str, Any]) -> int:
    """`idled bench --status-page [--sizes N] [--seconds S] [--pages P]`: what open status pages cost the daemon."""
    only(args, defaults, ("status_page", "sizes", "seconds", "pages"), "--status-page")
    sizes = [5000] if args.sizes == defaults["sizes"] else args.sizes
    seconds = 30.0 if args.seconds is None else args.seconds
    if len(sizes) != 1 or not 0 < seconds <= 3600 or not 1 <= args.pages <= 50:
        raise UsageError("--status-page takes one size, --seconds in (0, 3600] and --pages in [1, 50]")
    from idled.tools.bench import statuspage  # a daemon, a browser: only for this mode

    return print_lines(statuspage.report_lines(sizes[0], seconds, args.pages), RuntimeError)


def _core_kill(args: argparse.Namespace, defaults: Mapping[str, Any]) -> int:
    """`idled bench --core-kill [RUNS] [--sizes N]`: users closed by a core crash under --workers 2, and the wait."""
    only(args, defaults, ("core_kill", "sizes"), "--core-kill")
    sizes = [2000] if args.sizes == defaults["sizes"] else args.sizes
    if len(sizes) != 1 or not 1 <= sizes[0] <= 15_000 or not 1 <= args.core_kill <= 100:
        raise UsageError("--core-kill takes RUNS in [1, 100] and one size in [1, 15000]")
    import trio

    from idled.tools.bench import corekill  # a daemon and its users: only for this mode

    results = trio.run(corekill.measure, sizes[0], args.core_kill)
    return print_lines(corekill.report_lines(results, sizes[0]), RuntimeError)
