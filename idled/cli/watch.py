"""`idled watch`: subscribe to a running daemon and print presence events as they happen.

One line per event, readable: local time, seq, uid, kind, reason, and for an idle offline how late it fired
(``ts - deadline``: never negative, at most one tick). ``--json`` prints JSON lines instead, the same keys
as `idled events` (and the event log). ``--from SEQ`` replays from that seq (``--from 1``: everything the
daemon retains) before following; without it the watch starts from now. ``--count N`` exits 0 after N
events; Ctrl-C exits 0. ``--uid U`` (repeatable) watches only those uids (a watchlist observer: the daemon
sends nothing else); they are strings unless ``--int`` is given, as in `idled query`.

Built on the client library's observer (`idled.client.observer.Observer`). Given one daemon, without
reconnects: if it goes away the command says so and exits 1, rather than retrying silently at a terminal.
Given several cores (``--core A,B``) it follows the leader across a failover (`idled.client.follow`, through
``idled.cli.clientflags.follower`` as every command does): one line on stderr per step, the events resumed
from the last seq printed on whichever core takes it, exit 1 only if none does within ``--failover-timeout``.
"""

from __future__ import annotations

import argparse
import json
import sys

from idled.cli.clientflags import (
    FOLLOW_BACKOFF, Interrupt, add_client_arguments, follower, run_command, tls_context, token_for,
)
from idled.cli.events import human_line
from idled.client import ClientError, Gone
from idled.client.follow import Following
from idled.client.observer import Observer
from idled.client.trio import TRIO, running
from idled.ops.fatal import EXIT_FAILURE, EXIT_OK

__all__ = ["add_arguments", "run"]

PROG = "idled watch"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="from_seq", type=int, default=None, metavar="SEQ",
                        help="replay from this seq, then follow (1: everything retained; default: from now)")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of text (default off)")
    parser.add_argument("--count", type=int, default=None, metavar="N",
                        help="exit 0 after N events (default: until Ctrl-C)")
    parser.add_argument("--name", default="idled-watch", help="observer name to log in as (default idled-watch)")
    parser.add_argument("--uid", dest="uids", action="append", default=None, metavar="U",
                        help="watch only this uid's events; repeat for more (default: every event)")
    parser.add_argument("--int", dest="int_uids", action="store_true",
                        help="send the --uid values as integers (for apps that log in with integer uids; default off)")
    add_client_arguments(parser)


class WatchObserver(Following, Observer):
    """The watch's observer: given several cores, it follows the leader (`idled.client.follow`). A core that
    answers ``gone`` while it follows lacks events the watch expected next -- they never reached it (a
    failover loses what the old leader had not replicated) or were never issued (a new leader's seqs begin
    past a reserved block) --: the watch says which seqs and goes on from the oldest there."""

    _bridged: ClientError | None = None  # the `gone` whose gap was skipped (the link may ask twice about it)
    banner: str | None = None  # said once subscribed: which core, from where (not at a welcome it then refused)

    def _on_settled(self) -> None:
        super()._on_settled()
        if self.settled == 1 and self.banner is not None:
            print(f"{PROG}: watching {self.where} {self.banner} (Ctrl-C to stop)", file=sys.stderr, flush=True)

    def _retryable(self, exc: ClientError) -> bool:
        follow, cursor = self.follow, self.cursor
        if exc is self._bridged:
            return True
        if (isinstance(exc, Gone) and follow is not None and self.settled > 0 and exc.oldest_seq is not None
                and cursor.last is not None and exc.oldest_seq > cursor.last + 1):
            follow.say(f"seqs {cursor.last + 1}..{exc.oldest_seq - 1} are not on {self.where} (not replicated "
                       f"before the failover, or never issued): going on from seq {exc.oldest_seq}")
            cursor.last, self._bridged = exc.oldest_seq - 1, exc
            return True
        return super()._retryable(exc)


def watch_uids(args: argparse.Namespace) -> list[str | int] | None:
    """The watchlist from ``--uid`` (None: every event); ValueError for a bad ``--int`` value."""
    if args.uids is None:
        if args.int_uids:
            raise ValueError("--int needs --uid")
        return None
    if not args.int_uids:
        return list(args.uids)
    try:
        return [int(uid) for uid in args.uids]
    except ValueError:
        raise ValueError(f"--int: not an integer among {args.uids!r}") from None


def run(args: argparse.Namespace) -> int:
    if args.from_seq is not None and args.from_seq < 1:
        print(f"{PROG}: --from must be at least 1", file=sys.stderr)
        return 2
    if args.count is not None and args.count < 1:
        print(f"{PROG}: --count must be at least 1", file=sys.stderr)
        return 2
    try:
        uids = watch_uids(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2

    async def body(interrupt: Interrupt) -> int:
        token = token_for(args, "observer", args.name)
        after = None if args.from_seq is None else args.from_seq - 1
        seen = 0
        # durable=False: a terminal watch keeps no state, so it wants events as they happen even with --from
        # (the client's default for a given `after` is the durable view, for checkpointing applications).
        observer = WatchObserver(TRIO, args.host, args.port, args.name, token=token, after=after, durable=False,
                                 reconnect=False, connect_timeout=args.connect_timeout, backoff=FOLLOW_BACKOFF,
                                 ssl_context=tls_context(args), uids=uids)
        observer.follow = follower(args, PROG)
        where = "from now" if after is None else f"from seq {args.from_seq}"
        if uids is not None:
            where += f", {len(uids)} uid{'s' if len(uids) != 1 else ''} only"
        observer.banner = where
        async with running(observer):

            async def follow() -> bool:
                nonlocal seen
                async for event in observer:
                    record = event.record()
                    line = json.dumps(record, ensure_ascii=False, default=repr) if args.json else human_line(record)
                    print(line, flush=True)
                    seen += 1
                    if args.count is not None and seen >= args.count:
                        return True
                return False

            if await interrupt.wait(follow) is not False:  # --count reached, or Ctrl-C
                return EXIT_OK
        if observer.error is not None:
            raise observer.error
        print(f"{PROG}: the daemon closed the event stream", file=sys.stderr)
        return EXIT_FAILURE

    return run_command(PROG, body)
