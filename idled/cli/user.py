"""`idled user UID`: log in as a user from the terminal and keep the session alive, printing what happens.

The session is the client library's (`idled.client.trio.open_session`): it sends a keepalive whenever it
has sent nothing for the interval its timeout calls for -- a ping once the last one is ``--ask-after``
seconds old, else the quiet keepalive -- and this command prints the welcome (with the timeout the daemon
granted), each ping, quiet keepalive and pong, and how the session ended. Ctrl-C logs out (``bye``: the daemon records
reason ``logout``) and exits 0.

``--silent`` logs in and then sends nothing at all, so the daemon marks the user offline after its timeout
(reason ``idle``) and closes the connection with ``idle_timeout``: the quickest way to watch an offline
happen. That ending is the expected one, so it exits 0; any other (refused login, connection lost) exits 1.

``--device D`` logs in as device D of the user: several ``idled user alice --device phone`` / ``--device
laptop`` sessions coexist, the user stays online while any of them lives, and a second one with the same
device replaces the first (``kicked``).

Given several cores (``--core A,B``) the session follows the leader across a failover (`idled.client.follow`,
through ``idled.cli.clientflags.follower`` as every command does): it logs in again on the new leader, saying
so on stderr, and exits 1 only if no core takes it within ``--failover-timeout`` seconds.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

import trio

from idled.cli.clientflags import (
    FOLLOW_BACKOFF, Interrupt, add_client_arguments, address_of, follower, run_command, seconds, tls_context,
    token_for,
)
from idled.client import IdleTimeout
from idled.client.core import check_device
from idled.client.follow import Following
from idled.client.link import Conn
from idled.client.session import Session
from idled.client.trio import TRIO, running
from idled.ops.fatal import EXIT_OK
from idled.protocol import PING_FRAME, QUIET_FRAME

__all__ = ["add_arguments", "run"]

PROG = "idled user"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uid", metavar="UID", help="the user to log in as")
    parser.add_argument("--keepalive", type=float, default=None, metavar="SECONDS",
                        help="keepalive to ask for: the daemon's timeout becomes min(1.5 x this, max_timeout) "
                             "(default none: the daemon's --timeout)")
    parser.add_argument("--device", type=_device, default=None, metavar="D",
                        help="log in as this device of the user (1..64 bytes): sessions of other devices of the "
                             "same uid stay; the same device again replaces this one (default none: the user's "
                             "one plain session)")
    parser.add_argument("--ask-after", type=seconds, default=None, metavar="SECONDS",
                        help="a keepalive asks for an answer (a ping) once the last ping is this old, else it is "
                             "the quiet keepalive (default: two timeouts; 0: every keepalive a ping)")
    parser.add_argument("--silent", action="store_true",
                        help="log in, then send nothing: wait for the idle timeout and exit 0 (default off)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="do not print each keepalive and pong (default off)")
    add_client_arguments(parser)


def _device(text: str) -> str:
    try:
        return check_device(text)  # type: ignore[return-value]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _now() -> str:
    return datetime.now().strftime("%H:%M:%S.%f")[:-3]


def say(text: str) -> None:
    print(f"{_now()}  {text}", flush=True)


class TerminalSession(Following, Session):
    """A session that reports its pings and pongs; with ``silent`` it never pings; given several cores it
    follows the leader (`idled.client.follow`)."""

    def __init__(self, *args: Any, silent: bool, quiet: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.silent = silent
        self.quiet = quiet

    def _sent(self, frame: bytes) -> None:
        super()._sent(frame)
        if not self.quiet and (frame is PING_FRAME or frame is QUIET_FRAME):
            say("ping" if frame is PING_FRAME else "keepalive (quiet)")

    async def _on_message(self, message: Any) -> None:
        await super()._on_message(message)
        if not self.quiet:
            say(type(message).__name__.lower())

    async def _background(self, conn: Conn) -> None:
        if self.silent:
            await trio.sleep_forever()  # no keepalive: let the daemon's detector end the session
        await super()._background(conn)


def run(args: argparse.Namespace) -> int:
    async def body(interrupt: Interrupt) -> int:
        token = token_for(args, "uid", args.uid)
        session = TerminalSession(TRIO, args.host, args.port, args.uid, token=token, keepalive=args.keepalive,
                                  device=args.device, ask_after=args.ask_after, reconnect=False,
                                  connect_timeout=args.connect_timeout,
                                  ssl_context=tls_context(args), silent=args.silent, quiet=args.quiet,
                                  backoff=FOLLOW_BACKOFF)
        session.follow = follower(args, PROG)
        who = repr(args.uid) if args.device is None else f"{args.uid!r} (device {args.device!r})"
        try:
            async with running(session):
                timeout = session.timeout
                say(f"logged in as {who} on {address_of(session)}; offline after {timeout:g} s of silence"
                    + (" (sending nothing: expect idle_timeout)" if args.silent else " (Ctrl-C logs out)"))
                await interrupt.wait(session.wait_done)
        except IdleTimeout as exc:
            say(f"idle_timeout: {exc.reason}")
            if args.silent:
                return EXIT_OK
            raise
        return EXIT_OK  # Ctrl-C: leaving the block said bye

    status = run_command(PROG, body)
    if status == EXIT_OK and not args.silent:
        say("logged out (bye)")  # Ctrl-C: the session said bye on its way out
    return status
