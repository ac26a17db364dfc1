"""`idled query UID...`: ask a running daemon whether users are online; one ``UID online|offline`` line each.

An observer login that does not subscribe, one `query`, one `status` reply (`Observer.query` of the client
library). Uids are sent as strings (``42`` asks for the str uid "42"; apps that log in with integer uids
need ``--int``). ``--json`` prints one JSON object ``{uid: true|false}``.

Given several cores (``--core A,B``) the first login tries each in turn, and a connection lost before the
answer is followed to the leader and the query asked again (``idled.cli.clientflags.follower``).

``--last-seen`` also asks when each user was last active (the query's ``last_seen`` flag; a daemon older
than it refuses the query): ``bob offline, last seen 5 min ago``, ``alice online`` (with its devices in
parentheses, if it named any), ``carol offline, last seen unknown`` (never seen, or longer ago than the
daemon's ``last_seen_horizon``). With ``--json``: ``{uid: {"online": bool, "last_seen": unix seconds or null,
"devices": [...]}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from idled.cli.clientflags import (
    FOLLOW_BACKOFF, Interrupt, add_client_arguments, follower, run_command, tls_context, token_for,
)
from idled.client import ConnectionLost, UserStatus
from idled.client.follow import Following
from idled.client.observer import Observer
from idled.client.trio import TRIO, running
from idled.ops.fatal import EXIT_OK, EXIT_USAGE

__all__ = ["add_arguments", "run", "ago", "describe"]

PROG = "idled query"
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uids", nargs="+", metavar="UID", help="the users to ask about")
    parser.add_argument("--int", dest="as_int", action="store_true",
                        help="send the uids as integers (for apps that log in with integer uids; default off)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines (default off)")
    parser.add_argument("--last-seen", action="store_true",
                        help="also say when each user was last active, e.g. 'bob offline, last seen 5 min ago' "
                             "(needs a daemon that knows the query's last_seen flag; default off)")
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


def ago(seconds: float) -> str:
    """A duration in the past, rounded down to its largest unit: 'just now', '42 s ago', '5 min ago'..."""
    if seconds < 1:
        return "just now"
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''} ago"
    return f"{int(seconds)} s ago"


def describe(uid: object, status: UserStatus, now: float) -> str:
    """One line of ``--last-seen`` output."""
    if status.online:
        return f"{uid} online" + (f" ({', '.join(status.devices)})" if status.devices else "")
    if status.last_seen is None:
        return f"{uid} offline, last seen unknown"
    return f"{uid} offline, last seen {ago(now - status.last_seen)}"


class QueryObserver(Following, Observer):
    """The query's observer: given several cores, it follows the leader (`idled.client.follow`)."""


async def _asked(observer: QueryObserver, ask: Callable[[], Awaitable[T]]) -> T:
    """``ask()``'s answer; a query whose connection was lost before its reply is asked again on the next one
    (a query changes nothing), while the observer follows the leader."""
    while True:
        try:
            return await ask()
        except ConnectionLost:
            if observer.follow is None or observer.done:
                raise


def run(args: argparse.Namespace) -> int:
    try:
        uids = _uids(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def body(interrupt: Interrupt) -> int:
        token = token_for(args, "observer", args.name)
        statuses: dict[str | int, UserStatus] | None = None
        online: dict[str | int, bool] | None = None
        observer = QueryObserver(TRIO, args.host, args.port, args.name, token=token, subscribe=False,
                                 reconnect=False, connect_timeout=args.connect_timeout, backoff=FOLLOW_BACKOFF,
                                 ssl_context=tls_context(args))
        observer.follow = follower(args, PROG)
        async with running(observer):
            if args.last_seen:
                statuses = await interrupt.wait(lambda: _asked(observer, lambda: observer.query(uids, last_seen=True)))
            else:
                online = await interrupt.wait(lambda: _asked(observer, lambda: observer.query(uids)))
        if args.last_seen:
            if statuses is None:
                return EXIT_OK  # Ctrl-C before the answer
            if args.json:
                print(json.dumps({str(uid): {"online": status.online, "last_seen": status.last_seen,
                                             "devices": list(status.devices)} for uid, status in statuses.items()}))
            else:
                now = time.time()
                for uid in uids:
                    print(describe(uid, statuses.get(uid, UserStatus(False)), now))
            return EXIT_OK
        if online is None:
            return EXIT_OK  # Ctrl-C before the answer
        if args.json:
            print(json.dumps({str(uid): bool(online.get(uid)) for uid in uids}))
        else:
            for uid in uids:
                print(f"{uid} {'online' if online.get(uid) else 'offline'}")
        return EXIT_OK

    return run_command(PROG, body)
