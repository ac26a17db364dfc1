"""The `idled` command line: one subcommand per module, each a pair of functions.

Every command module exposes `add_arguments(parser)` and `run(args) -> int`; this file only wires them up,
so `main(argv)` is the one place that reads argv (and tests call it directly). It also gives every command
the same `--version` flag and the same exit-status table in its `--help`, and makes a usage error one line
on stderr (status 2), as every other failure of every command is.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from idled import __version__
from idled.ops.fatal import EXIT_USAGE

# subcommand -> (module, one-line help). Modules are imported only when their command runs, so
# `idled serve` never imports pyspark or matplotlib.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("idled.cli.serve", "run the daemon"),
    "edge": ("idled.cli.edge", "terminate user connections and relay them to a core as a gateway"),
    "check-config": ("idled.cli.check_config", "validate the daemon's configuration and print it, without starting"),
    "user": ("idled.cli.user", "log in as a user from the terminal and keep the session alive (or let it idle)"),
    "watch": ("idled.cli.watch", "print presence events from a running daemon as they happen"),
    "hook": ("idled.cli.hook", "post presence events to a webhook URL: signed batches, in order, at least once"),
    "query": ("idled.cli.query", "ask a running daemon whether uids are online"),
    "promote": ("idled.cli.promote", "make a hot standby (--standby-of) the active core, by hand"),
    "status": ("idled.cli.status", "what a running daemon holds: sessions, connections, next seq, uptime"),
    "token": ("idled.cli.token", "mint an HMAC login token for a uid, gateway, observer or standby"),
    "events": ("idled.cli.events", "print event-log records (readable on a terminal, JSON lines when piped)"),
    "bench": ("idled.cli.bench", "benchmark every detector under simulated keepalive load (no network)"),
    "loadtest": ("idled.cli.loadtest", "drive a server with real connections and measure what users see"),
    "pipeline": ("idled.cli.pipeline", "presence analytics on Spark over the event log"),
}

# The one exit-status table (idled.ops.fatal defines the numbers; docs/operations.md repeats this table and
# a test checks both against every command's real failures).
EXIT_STATUS_HELP = """\
exit status (the same table for every idled command):
  0    ok (also: interrupted with Ctrl-C by design, e.g. idled watch, idled user, idled events --follow)
  1    runtime failure: daemon unreachable, connection lost, refused login, I/O error (or a bug)
  2    usage or configuration error: bad flag, config file, secret file, insecure listener
  3    ran, but a target FAILED (idled bench, idled loadtest)
  4    idled serve: cannot listen (address in use, permission denied)
  5    idled serve: event log unusable (permission denied, locked, fsync failed; a full disk only degrades it)
  6    idled serve: out of resources (open-file limit, memory)
  130  interrupted: a second Ctrl-C during idled serve's shutdown; Ctrl-C during idled bench or loadtest"""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (status 2): ``idled watch: error: ... (see idled watch --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"idled {__version__}",
                        help="print the version and exit")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (to add its flags), so ``idled serve`` never
    imports pyspark or matplotlib, and one broken optional extra cannot break the other commands."""
    parser = Parser(prog="idled", description="connection-idle (presence) detector daemon",
                    epilog=EXIT_STATUS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text,
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_version(command_parser)
        if name == command:
            importlib.import_module(module_name).add_arguments(command_parser)
        # The command's own epilog (serve: where settings come from) stays, then the one exit-status table.
        own = command_parser.epilog
        command_parser.epilog = (own + "\n\n" if own else "") + EXIT_STATUS_HELP
        command_parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args))


if __name__ == "__main__":
    sys.exit(main())
