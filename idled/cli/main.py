"""The `idled` command line: one subcommand per module, each a pair of functions.

Every command module exposes `add_arguments(parser)` and `run(args) -> int`; this file only wires them up,
so `main(argv)` is the one place that reads argv (and tests call it directly).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module, one-line help). Modules are imported only when their command runs, so
# `idled serve` never imports pyspark or matplotlib.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("idled.cli.serve", "run the daemon"),
    "edge": ("idled.cli.edge", "terminate user connections and relay them to a core as a gateway"),
    "token": ("idled.cli.token", "mint an HMAC login token for a uid, gateway or observer"),
    "bench": ("idled.cli.bench", "benchmark every detector under simulated keepalive load (no network)"),
    "loadtest": ("idled.cli.loadtest", "drive a server with real connections and measure what users see"),
    "events": ("idled.cli.events", "print event-log records as JSON lines"),
    "pipeline": ("idled.cli.pipeline", "presence analytics on Spark over the event log"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (to add its flags), so ``idled serve`` never
    imports pyspark or matplotlib, and one broken optional extra cannot break the other commands."""
    parser = argparse.ArgumentParser(prog="idled", description="connection-idle (presence) detector daemon")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module_name).add_arguments(command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args))


if __name__ == "__main__":
    sys.exit(main())
