"""`idled promote`: make a hot standby the active core, by hand (``pg_ctl promote``'s model).

The standby is found by its data directory: the process holding the directory's lock (its pid is in the
lock file) is sent SIGUSR1, and its ``/status`` (on ``--metrics``) is polled until it reports the active role.
Only a standby run with ``--standby-of`` is promoted this way; under ``--election`` the leader is chosen in
etcd (stop the leader to hand over). Promote only a standby whose active is dead or cut off: nothing stops
two actives from writing (docs/ha.md, runbook).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from idled.cli.clientflags import endpoint
from idled.cli.status import fetch_status
from idled.log import dirlock
from idled.log.errors import LogLocked
from idled.ops.fatal import EXIT_FAILURE, EXIT_OK

__all__ = ["add_arguments", "run"]

PROG = "idled promote"
POLL = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", required=True, metavar="DIR", help="the standby's event-log directory")
    parser.add_argument("--metrics", default="127.0.0.1:9878", metavar="HOST:PORT", type=endpoint,
                        help="the standby's metrics endpoint, to confirm the promotion (default 127.0.0.1:9878)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="give up waiting for the active role after this long (default 30)")


def run(args: argparse.Namespace) -> int:
    pid = _holder(args.data_dir)
    if pid is None:
        return _fail(f"no running idled holds {args.data_dir} (its lock is free or names no process)")
    role = _role(args.metrics)
    if role in ("active", "leader"):
        print(f"{args.data_dir}: pid {pid} is already the {role} core")
        return EXIT_OK
    if role is None:
        return _fail(f"cannot read http://{args.metrics}/status: give the standby's --metrics HOST:PORT")
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as exc:
        return _fail(f"cannot signal pid {pid}: {exc.strerror}")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        time.sleep(POLL)
        if (role := _role(args.metrics)) in ("active", "leader"):
            print(f"{args.data_dir}: pid {pid} promoted: it is the {role} core")
            return EXIT_OK
    return _fail(f"pid {pid} did not become active within {args.timeout:g} s (under --election the leader is chosen "
                 "in etcd; see the daemon's log)")


def _holder(directory: str) -> int | None:
    """The pid holding ``directory``'s lock, None if nobody does."""
    if not os.path.isdir(directory):
        return None
    try:
        fd = dirlock.acquire(directory)
    except LogLocked as exc:
        return exc.pid
    os.close(fd)  # free: nothing runs there
    return None


def _role(metrics: str) -> str | None:
    try:
        role = fetch_status(metrics, timeout=2.0).get("role")
    except (OSError, ValueError):
        return None
    return str(role) if role is not None else None


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return EXIT_FAILURE
