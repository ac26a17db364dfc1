"""`idled query UID...`: ask a running daemon whether users are online; one ``UID online|offline`` line each.

An observer login that does not subscribe, one `query`, one `status` reply (`Observer.query` of the client
library). Uids are sent as strings (``42`` asks for the str uid "42"; apps that log in with integer uids
need ``--int``). ``--json`` prints one JSON object ``{uid: true|false}``.
"""

from __future__ import annotations

import argparse
import json
import sys

from idled.cli.clientflags import Interrupt, add_client_arguments, run_command, tls_context, token_for
from idled.client.trio import open_observer
from idled.ops.fatal import EXIT_OK, EXIT_USAGE

__all__ = ["add_arguments", "run"]

PROG = "idled query"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uids", nargs="+", metavar="UID", help="the users to ask about")
    parser.add_argument("--int", dest="as_int", action="store_true",
                        help="send the uids as integers (for apps that log in with integer uids; default off)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines (default off)")
    parser.add_argument("--name", default="idled-query", help="observer name to log in as (default idled-query)")
    add_client_arguments(parser)


def _uids(args: argparse.Namespace) -> list[str | int]:
    if not args.as_int:
        return list(args.uids)
    out: list[str | int] = []
    for uid in args.uids:
        try:
            out.append(int(uid))
        except ValueError:
            raise ValueError(f"--int: not an integer: {uid!r}") from None
    return out


def run(args: argparse.Namespace) -> int:
    try:
        uids = _uids(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def body(interrupt: Interrupt) -> int:
        token = token_for(args, "observer", args.name)
        async with open_observer(args.host, args.port, args.name, token=token, subscribe=False, reconnect=False,
                                 connect_timeout=args.connect_timeout, ssl_context=tls_context(args)) as observer:
            online = await interrupt.wait(lambda: observer.query(uids))
        if online is None:
            return EXIT_OK  # Ctrl-C before the answer
        if args.json:
            print(json.dumps({str(uid): bool(online.get(uid)) for uid in uids}))
        else:
            for uid in uids:
                print(f"{uid} {'online' if online.get(uid) else 'offline'}")
        return EXIT_OK

    return run_command(PROG, body)
