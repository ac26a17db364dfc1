"""`idled token`: mint an HMAC login token for a uid, gateway, observer or standby, or a bearer token for the HTTP
API."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from idled.ops.fatal import EXIT_USAGE
from idled.protocol import ROLES
from idled.protocol.tokens import API_ROLE, DEFAULT_TTL, SecretError, load_secret, mint


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--secret-file", required=True, type=Path, metavar="FILE",
                        help="file holding the shared HMAC secret (>= 16 bytes; a trailing newline is ignored)")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--uid", metavar="UID", help="mint a user token (uid 42 and \"42\" share a token)")
    who.add_argument("--gateway", metavar="NAME", help="mint a gateway token")
    who.add_argument("--observer", metavar="NAME", help="mint an observer token")
    who.add_argument("--standby", metavar="NAME",
                     help="mint a standby token: a standby core's replication link, the one role that may replicate "
                          "(a standby with --secret-file mints its own; docs/ha.md)")
    who.add_argument("--api", metavar="NAME", help="mint a bearer token for the HTTP API (docs/api.md); it cannot log in")
    parser.add_argument("--ttl", type=_positive_int, default=DEFAULT_TTL, metavar="SECONDS",
                        help=f"validity from now, in seconds (default {DEFAULT_TTL})")


def run(args: argparse.Namespace) -> int:
    """Print one token to stdout. Exit status 2 (usage or configuration, as for `idled serve`) with one line on
    stderr if the secret file or the name is unusable."""
    role = next(r for r in (*ROLES, API_ROLE) if getattr(args, r) is not None)
    try:
        secret = load_secret(args.secret_file)
        token = mint(secret, role, getattr(args, role), time.time() + args.ttl)
    except (SecretError, ValueError) as exc:
        print(f"idled token: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(token)
    return 0
