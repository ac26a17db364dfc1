"""What the protocol-speaking commands (`idled user`, `watch`, `query`) share: flags, tokens, errors, Ctrl-C.

Every one of them takes ``--host/--port`` (default 127.0.0.1:7878) -- ``--host`` (alias ``--core``) may list
several cores, ``A:PORT,B:PORT``, among which the client finds the leader (``idled.client.leader``), and
follows it across a failover (`follower`: ``idled.client.follow``, one line on stderr per step, giving up
``--failover-timeout`` seconds after the loss) -- and either ``--token`` or
``--secret-file`` (a token is then minted for the identity, valid one hour); prints what went wrong as one
line on stderr; with ``--tls`` (``--ca-file``, ``--cert-file``/``--key-file`` for a certificate login,
``--insecure-skip-verify`` for tests only) connects over TLS; and maps the outcome onto the exit-status
table of `idled.cli.main`: 0 ok (Ctrl-C included),
1 runtime failure (daemon unreachable, refused login, connection lost), 2 usage (an unusable secret file).

Ctrl-C is a signal receiver, not a KeyboardInterrupt raised at an arbitrary checkpoint: the first one cancels
only what the command waits in (`Interrupt.wait`), so the client's context manager still runs its exit and
says ``bye`` on a live connection -- the daemon records a logout, not a dropped connection. Cancelling the
whole command instead would close the connection under the ``bye``. A second Ctrl-C cancels everything.
"""

from __future__ import annotations

import argparse
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from idled.client import ClientError, ConnectFailed, TLSRequired
from idled.client.core import Backoff
from idled.client.follow import Follow
from idled.client.link import Link
from idled.ops.config import ConfigError, parse_port
from idled.ops.fatal import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, exception_leaves
from idled.protocol.address import AddressError, format_address, parse_address, parse_addresses
from idled.protocol.tokens import SecretError, load_secret, mint

__all__ = [
    "add_client_arguments", "address_of", "endpoint", "follower", "UsageError", "Interrupt", "token_for",
    "tls_context", "run_command", "seconds", "TOKEN_TTL", "FAILOVER_TIMEOUT", "FOLLOW_BACKOFF",
]

T = TypeVar("T")
TOKEN_TTL = 3600.0  # seconds a token minted from --secret-file is valid
FAILOVER_TIMEOUT = 60.0  # seconds a command looks for the leader after losing its core (several cores)
# A following command's backoff between rounds: short (an operator is watching), so a new leader is found
# within ~2 s of its election and a give-up comes at most ~2 s after --failover-timeout.
FOLLOW_BACKOFF = Backoff(base=0.1, cap=2.0)


class UsageError(Exception):
    """A flag's value is unusable (exit status 2)."""


def add_client_arguments(parser: argparse.ArgumentParser, *, follow: bool = True) -> None:
    """The connection flags; ``follow``: with ``--failover-timeout`` (the interactive tools; a service such as
    `idled hook` follows the leader for as long as it runs)."""
    parser.add_argument("--host", "--core", dest="host", default="127.0.0.1", type=_hosts, metavar="HOST[:PORT][,...]",
                        help="daemon address (default 127.0.0.1); several cores comma-separated, the leader is found "
                             "among them (a member without a port takes --port)")
    parser.add_argument("--port", type=_port, default=7878, help="daemon client port (default 7878)")
    if follow:
        parser.add_argument("--failover-timeout", type=seconds, default=FAILOVER_TIMEOUT, metavar="SECONDS",
                            help="with several cores: after losing the connection, look for the leader this long "
                                 f"before giving up with status 1 (default {FAILOVER_TIMEOUT:g}; 0: never)")
    auth = parser.add_mutually_exclusive_group()
    auth.add_argument("--token", metavar="TOKEN",
                      help="login token from idled token (default none: for a daemon with auth off)")
    auth.add_argument("--secret-file", metavar="FILE",
                      help="mint the login token from the daemon's HMAC secret (default none)")
    parser.add_argument("--connect-timeout", type=float, default=5.0, metavar="SECONDS",
                        help="give up connecting or logging in after this long (default 5)")
    tls = parser.add_argument_group("TLS (docs/tls.md)")
    tls.add_argument("--tls", action="store_true", help="connect over TLS, verifying the daemon's certificate")
    tls.add_argument("--ca-file", metavar="FILE",
                     help="PEM CA certificates to verify the daemon with (default the system's trust store)")
    tls.add_argument("--cert-file", metavar="FILE",
                     help="client certificate (PEM), for a gateway/observer login by certificate (default none)")
    tls.add_argument("--key-file", metavar="FILE", help="private key of --cert-file (default: in --cert-file)")
    tls.add_argument("--insecure-skip-verify", action="store_true",
                     help="TLS without verifying the daemon's certificate: for tests only, never in production")


def _hosts(text: str) -> str:
    try:
        parse_addresses(text, 7878)  # checked here (exit status 2), used as given (the client parses it again)
    except AddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def endpoint(text: str) -> str:
    """argparse type of a flag naming one HTTP endpoint (``--metrics HOST:PORT``): the one address grammar's
    ``HOST:PORT`` / ``[IPV6]:PORT``, as it is written in a URL (exit status 2 otherwise)."""
    try:
        return format_address(parse_address(text))
    except AddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds(text: str) -> float:
    """An argparse type: seconds, 0 or more (finite)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def follower(args: argparse.Namespace, prog: str) -> Follow | None:
    """How a command's link follows the leader (`idled.client.follow`): None with one core (every failure is
    final, said at once: exit 1), else a `Follow` saying each step on stderr and giving up
    ``--failover-timeout`` seconds after a loss."""
    if len(parse_addresses(args.host, args.port)) < 2:
        return None

    def say(text: str) -> None:
        print(f"{prog}: {text}", file=sys.stderr, flush=True)

    return Follow(say, give_up_after=args.failover_timeout or None)


def address_of(link: Link) -> str:
    """The core a client is connected to (of several: the one it found), for an operator's message."""
    return format_address((link.host, link.port))


def _port(text: str) -> int:
    try:
        return parse_port(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context the flags ask for (None: plaintext); UsageError for a file that does not load."""
    if not (args.tls or args.ca_file or args.cert_file or args.insecure_skip_verify):
        return None
    try:
        ctx = ssl.create_default_context(cafile=args.ca_file)
        if args.cert_file:
            ctx.load_cert_chain(args.cert_file, args.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"TLS: {exc}") from None
    if args.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["idled/1"])
    return ctx


def token_for(args: argparse.Namespace, role: str, name: str, ttl: float = TOKEN_TTL) -> str | None:
    """The token to log in with: ``--token``, one minted from ``--secret-file`` (valid ``ttl`` seconds), or
    None (auth off). UsageError for a secret file that cannot be used."""
    if args.token:
        return str(args.token)
    if args.secret_file:
        try:
            return mint(load_secret(args.secret_file), role, name, time.time() + ttl)
        except (SecretError, ValueError) as exc:
            raise UsageError(str(exc)) from None
    return None


class Interrupt:
    """Ctrl-C as seen by a command's body: ``await interrupt.wait(fn)`` returns fn's result, or None once
    interrupted (fn is cancelled; the code around it, e.g. a client's logout, still runs)."""

    def __init__(self) -> None:
        self.fired = False
        self._scopes: set[trio.CancelScope] = set()

    async def wait(self, fn: Callable[[], Awaitable[T]]) -> T | None:
        if self.fired:
            return None
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                return await fn()
            finally:
                self._scopes.discard(scope)
        return None

    def fire(self) -> None:
        self.fired = True
        for scope in self._scopes:
            scope.cancel()


def run_command(prog: str, body: Callable[[Interrupt], Awaitable[int]]) -> int:
    """Run ``body`` under trio until it returns, Ctrl-C/SIGTERM ending it with status 0 (see the module
    docstring); a ClientError is one line on stderr and status 1, a UsageError status 2."""

    async def main() -> int:
        status = EXIT_OK
        interrupt = Interrupt()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                async def until_signal() -> None:
                    async for _ in signals:
                        if interrupt.fired:  # the second one: stop everything now
                            nursery.cancel_scope.cancel()
                            return
                        interrupt.fire()

                async def run_body() -> None:
                    nonlocal status
                    status = await body(interrupt)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until_signal)
                nursery.start_soon(run_body)
        return status

    try:
        return trio.run(main)
    except UsageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClientError as exc:
        print(f"{prog}: {describe(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except BaseExceptionGroup as group:  # trio wraps a task's failure when another task ended too
        for leaf in exception_leaves(group):
            if isinstance(leaf, UsageError):
                print(f"{prog}: {leaf}", file=sys.stderr)
                return EXIT_USAGE
            if isinstance(leaf, ClientError):
                print(f"{prog}: {describe(leaf)}", file=sys.stderr)
                return EXIT_FAILURE
        raise



def describe(exc: ClientError) -> str:
    """One line for an operator: what failed, and the server's code when it sent one."""
    if isinstance(exc, ConnectFailed):
        hint = " (is it running? start it with: idled serve)" if exc.refused else ""
        return f"cannot reach the daemon: {exc.reason}{hint}"
    if exc.code == "connection_lost":
        return f"lost the daemon: {exc.reason}"
    if isinstance(exc, TLSRequired):
        return (f"{exc.code}: the daemon speaks TLS on this port: give --tls (and --ca-file FILE if its "
                "certificate is from a private CA)")
    return f"{exc.code}: {exc.reason}"
