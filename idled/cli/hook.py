"""`idled hook`: post the daemon's presence events to a webhook URL, signed, in order, at least once.

The flags are read and checked here (a bad one is one line and status 2, before anything starts); the work is
`idled.hook` (docs/hook.md). The daemon-connection flags are `idled watch`'s (`idled.cli.clientflags`); with
``--secret-file`` a fresh observer token is minted for every (re)connection, so a hook running for weeks
never logs in with an expired one.

``--redrive`` posts the dead letters again and exits (`idled.hook.redrive`): 0 all sent and cleared (or a
signal), 1 one failed again for the whole retry budget, 5 as below.

Exit statuses: 0 after SIGTERM/SIGINT (the batch in flight gets ``--stop-grace`` seconds; a second signal
stops at once), 1 the daemon refused the login (or a bug), 2 a usage error or the checkpoint fell out of the
daemon's retention without ``--resync`` (systemd must not restart into the same gap), 4 the metrics port
cannot be bound, 5 the state directory is unusable (locked by another hook, unwritable, damaged checkpoint).
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import ssl
import sys
import time
from collections.abc import Callable

import trio

from idled.cli.clientflags import TOKEN_TTL, UsageError, add_client_arguments, describe, tls_context
from idled.cli.watch import watch_uids
from idled.client import ClientError
from idled.door.door import Door, Endpoint
from idled.hook.batch import Filter
from idled.hook.config import (
    DEFAULT_BATCH_BYTES, DEFAULT_BATCH_MAX, DEFAULT_BATCH_WAIT, DEFAULT_STOP_GRACE, DEFAULT_TIMEOUT, HookConfig,
)
from idled.hook.deliver import Shutdown
from idled.hook.redrive import REDRIVE_FILE, RedriveStopped, run_redrive
from idled.hook.retry import RetryPolicy
from idled.hook.runner import run_hook
from idled.hook.sign import GENERATE, parse_secret
from idled.hook.source import HookGone
from idled.hook.state import StateError
from idled.ops.fatal import EXIT_FAILURE, EXIT_LOG, EXIT_OK, EXIT_USAGE, Fatal, exception_leaves
from idled.ops.logs import setup_logging
from idled.protocol.tokens import SecretError, load_secret, mint

__all__ = ["add_arguments", "run", "build_config"]

PROG = "idled hook"
log = logging.getLogger("idled.hook")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the webhook: http:// or https:// URL to POST batches to")
    parser.add_argument("--state", required=True, metavar="DIR",
                        help="state directory: lock, checkpoint, dead-letter file (created if missing)")
    parser.add_argument("--from", dest="from_seq", type=int, default=None, metavar="SEQ",
                        help="without a checkpoint, start at this seq (1: everything retained; default: from now); "
                             "ignored once a checkpoint exists")
    parser.add_argument("--resync", action="store_true",
                        help="if the checkpoint fell out of the daemon's retention, log the gap and continue from "
                             "the oldest retained event (default: exit 2)")
    parser.add_argument("--filter", dest="filters", action="append", default=[], metavar="KEY=VALUE",
                        help="post only events with kind=online|offline or reason=R; repeat: OR within a key, "
                             "AND between keys (default: every event)")
    parser.add_argument("--uid", dest="uids", action="append", default=None, metavar="U",
                        help="only this uid's events (a watchlist: the daemon sends nothing else); repeat for more")
    parser.add_argument("--int", dest="int_uids", action="store_true",
                        help="send the --uid values as integers (default off)")
    parser.add_argument("--redrive", action="store_true",
                        help="post the dead letters of --state again, oldest first, clearing each once acknowledged, "
                             "then exit (stop the hook first: they share the state directory's lock)")
    parser.add_argument("--name", default="idled-hook", help="observer name to log in as (default idled-hook)")
    sign = parser.add_argument_group("signature (docs/hook.md#signatures)")
    sign.add_argument("--hook-secret-file", metavar="FILE",
                      help="the Standard Webhooks secret, whsec_<base64> (make one with: " + GENERATE.replace("%", "%%")
                      + "); required unless --insecure-unsigned")
    sign.add_argument("--insecure-unsigned", action="store_true",
                      help="post without a signature: receivers cannot tell our requests from forged ones")
    sign.add_argument("--hook-ca-file", metavar="FILE",
                      help="PEM CA certificates to verify an https:// URL with (default: the system's trust store)")
    _add_delivery_arguments(parser)
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus /metrics on this port (default: off)")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="address for --metrics-port (default 127.0.0.1); a non-loopback one needs --secret-file "
                             "or --insecure, as every idled listener does")
    parser.add_argument("--insecure", action="store_true",
                        help="allow --metrics-host beyond loopback without --secret-file")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="log verbosity on stderr (default info)")
    add_client_arguments(parser, follow=False)  # a service follows the leader as long as it runs


def _add_delivery_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("batching and retries")
    group.add_argument("--batch-max", type=int, default=DEFAULT_BATCH_MAX, metavar="N",
                       help=f"events per request at most (default {DEFAULT_BATCH_MAX})")
    group.add_argument("--batch-bytes", type=int, default=DEFAULT_BATCH_BYTES, metavar="BYTES",
                       help=f"request body size at most; a larger single event goes alone (default {DEFAULT_BATCH_BYTES})")
    group.add_argument("--batch-wait", type=float, default=DEFAULT_BATCH_WAIT, metavar="SECONDS",
                       help=f"wait this long after a batch's first event for more (default {DEFAULT_BATCH_WAIT:g})")
    group.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                       help=f"per-request deadline: connect, send, response (default {DEFAULT_TIMEOUT:g})")
    defaults = RetryPolicy()
    group.add_argument("--retry-for", type=float, default=defaults.retry_for, metavar="SECONDS",
                       help=f"dead-letter a batch that has failed for this long; 0: no time limit "
                            f"(default {defaults.retry_for:g}, a day)")
    group.add_argument("--max-attempts", type=int, default=defaults.max_attempts, metavar="N",
                       help="also dead-letter a batch after N failed attempts; 0: no count limit (the default)")
    group.add_argument("--backoff-base", type=float, default=defaults.base, metavar="SECONDS",
                       help=f"full-jitter backoff: uniform(0, min(cap, base * 2^(n-1))) (default {defaults.base:g})")
    group.add_argument("--backoff-cap", type=float, default=defaults.cap, metavar="SECONDS",
                       help=f"backoff ceiling (default {defaults.cap:g})")
    group.add_argument("--retry-after-cap", type=float, default=defaults.retry_after_cap, metavar="SECONDS",
                       help=f"honour a 429/503 Retry-After up to this long (default {defaults.retry_after_cap:g})")
    group.add_argument("--stop-grace", type=float, default=DEFAULT_STOP_GRACE, metavar="SECONDS",
                       help=f"on SIGTERM, let the request in flight finish this long (default {DEFAULT_STOP_GRACE:g})")


def _positive(value: float, flag: str) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"{flag} must be a positive number of seconds")


def _token_source(args: argparse.Namespace) -> Callable[[], str | None]:
    if args.token:
        token = str(args.token)
        return lambda: token
    if args.secret_file:
        try:
            secret = load_secret(args.secret_file)
        except SecretError as exc:
            raise UsageError(str(exc)) from None
        return lambda: mint(secret, "observer", args.name, time.time() + TOKEN_TTL)
    return lambda: None


def _hook_key(path: str) -> bytes:
    """The signing key from ``--hook-secret-file`` (whsec_<base64>); SecretError naming the file."""
    try:
        return parse_secret(load_secret(path))
    except ValueError as exc:
        raise SecretError(f"--hook-secret-file {path}: {exc}") from None


def _check_url(url: str) -> None:
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise UsageError(f"--url {url!r}: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(f"--url {url!r}: expected http://HOST[:PORT]/PATH or https://...")


def build_config(args: argparse.Namespace) -> HookConfig:
    """The `HookConfig` the flags ask for; UsageError (status 2) for anything unusable."""
    _check_url(args.url)
    if args.from_seq is not None and args.from_seq < 1:
        raise UsageError("--from must be at least 1")
    if args.hook_secret_file and args.insecure_unsigned:
        raise UsageError("--hook-secret-file and --insecure-unsigned exclude each other")
    if not args.hook_secret_file and not args.insecure_unsigned:
        raise UsageError("--hook-secret-file is required (or --insecure-unsigned, for tests)")
    if not 1 <= args.batch_max <= 100_000 or args.batch_bytes < 1024:
        raise UsageError("--batch-max must be in [1, 100000] and --batch-bytes at least 1024")
    for flag in ("batch_wait", "timeout", "backoff_base", "backoff_cap", "stop_grace"):
        _positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    try:
        retry = RetryPolicy(args.backoff_base, args.backoff_cap, args.max_attempts, args.retry_after_cap,
                            args.retry_for)
        filter = Filter.parse(args.filters)
        uids = watch_uids(args)
        secret = _hook_key(args.hook_secret_file) if args.hook_secret_file else None
    except (ValueError, SecretError) as exc:
        text = str(exc).replace("max_attempts", "--max-attempts").replace("retry_for", "--retry-for")
        raise UsageError(text) from None
    if args.hook_ca_file:
        try:
            ssl.create_default_context(cafile=args.hook_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--hook-ca-file {args.hook_ca_file}: {exc}") from None
    return HookConfig(
        url=args.url, state_dir=args.state, secret=secret, host=args.host, port=args.port,
        token=_token_source(args), ssl_context=tls_context(args), connect_timeout=args.connect_timeout,
        name=args.name, from_seq=args.from_seq, resync=args.resync, uids=None if uids is None else tuple(uids),
        filter=filter, batch_max=args.batch_max, batch_bytes=args.batch_bytes, batch_wait=args.batch_wait,
        timeout=args.timeout, retry=retry, ca_file=args.hook_ca_file, stop_grace=args.stop_grace,
    )


def _door(args: argparse.Namespace) -> Door | None:
    """The door of the hook's one listener, the metrics endpoint (None: no --metrics-port); its rule checked."""
    if args.metrics_port is None:
        return None
    door = Door([Endpoint("metrics", args.metrics_host, args.metrics_port)], secret=bool(args.secret_file),
                insecure=args.insecure, env={})
    door.check()
    return door


async def _main(config: HookConfig, door: Door | None, redrive: bool = False) -> int | None:
    """Run the hook (None) or the redrive (the number of dead letters sent) until done or a signal."""
    shutdown = Shutdown(config.stop_grace)
    sent: int | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            async def until_signal() -> None:
                async for signum in signals:
                    if shutdown.stopping:  # the second one: stop now
                        nursery.cancel_scope.cancel()
                        return
                    log.info("%s: stopping (the request in flight gets %g s)", signal.Signals(signum).name,
                             config.stop_grace)
                    shutdown.stop()

            async def hook() -> None:
                nonlocal sent
                if redrive:
                    sent = await run_redrive(config, shutdown)
                else:
                    await run_hook(config, shutdown, door=door)
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_signal)
            nursery.start_soon(hook)
    return sent


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
        door = _door(args)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Fatal as exc:
        return _line(str(exc), exc.status)
    setup_logging(args.log_level)
    for noisy in ("httpx", "httpcore"):  # a line per request (INFO) and per socket operation (DEBUG)
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        sent = trio.run(_main, config, door, args.redrive)
    except Exception as exc:  # each expected failure becomes one line and a status (_fatal); others re-raise
        return _fatal(exc, config)
    if args.redrive:
        log.info("redrive: %d dead letters sent again", sent or 0)
    log.info("stopped")
    return EXIT_OK


def _fatal(exc: BaseException, config: HookConfig) -> int:
    for leaf in exception_leaves(exc):
        if isinstance(leaf, RedriveStopped):
            return _line(f"redrive: {leaf}; it and the dead letters after it stay in {config.state_dir}/"
                         f"{REDRIVE_FILE} for the next --redrive", EXIT_FAILURE)
        if isinstance(leaf, StateError):
            return _line(f"state directory ({config.state_dir}): {leaf.reason}", EXIT_LOG)
        if isinstance(leaf, HookGone):
            return _line(f"event stream ({config.daemon}): {leaf}", EXIT_USAGE)
        if isinstance(leaf, ClientError):
            return _line(f"daemon ({config.daemon}): {describe(leaf)}", EXIT_FAILURE)
        if isinstance(leaf, Fatal):
            return _line(str(leaf), leaf.status)
    raise exc


def _line(text: str, status: int) -> int:
    print(f"{PROG}: fatal: {text}", file=sys.stderr)
    return status
