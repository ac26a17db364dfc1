"""Fatal errors: one line that says what failed and where, and an exit status per kind of failure.

An operator reading `journalctl -u idled` after a failed start wants one line -- ``idled: fatal: cannot
listen (0.0.0.0:7878): Address already in use`` -- not a 56-line ExceptionGroup traceback, and a supervisor
wants a status it can act on (``RestartPreventExitStatus=2`` stops systemd from restarting into a bad
configuration forever). The code that knows the context (the address being bound, the data directory) raises
`Fatal`; `describe()` turns whatever ended the daemon into the line and the status. The traceback is logged
only at debug level.

Exit statuses (documented in docs/operations.md and in `idled --help`):

====  =====================================================================================================
0     ok
1     runtime failure not otherwise classified (a bug: run with --log-level debug for the traceback)
2     usage or configuration error (bad flag, config file, secret file, insecure listener)
3     ran, but a target FAILED (`idled bench`, `idled loadtest`)
4     cannot listen: address in use, permission denied, address not available (client or metrics port)
5     event log unusable: permission denied, locked by another daemon, fsync failed, damaged state (a full
      disk degrades the daemon instead: idled.server.engine.degraded; only a data directory it cannot create ends it)
6     out of resources: open-file limit (EMFILE/ENFILE) or memory
130   interrupted (a second Ctrl-C during shutdown)
====  =====================================================================================================
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final


from idled.log.eventlog import EventLogError, LogLocked

__all__ = [
    "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_TARGET_FAILED", "EXIT_LISTEN", "EXIT_LOG", "EXIT_RESOURCES",
    "EXIT_INTERRUPTED", "Fatal", "fatal_on_oserror", "fatal_on_log_error", "describe", "exception_leaves",
]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_TARGET_FAILED: Final = 3
EXIT_LISTEN: Final = 4
EXIT_LOG: Final = 5
EXIT_RESOURCES: Final = 6
EXIT_INTERRUPTED: Final = 130

_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
# Errors that can only mean the disk: an OSError with one of these, wherever it was raised, is the log's.
_DISK_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class Fatal(Exception):
    """An expected operational failure that ends the daemon."""

    def __init__(self, what: str, where: str, reason: str, status: int) -> None:
        super().__init__(f"{what} ({where}): {reason}")
        self.what, self.where, self.reason, self.status = what, where, reason, status


@contextmanager
def fatal_on_oserror(what: str, where: str, status: int) -> Iterator[None]:
    """Turn an OSError inside the block into a `Fatal` naming ``what`` and ``where`` (out of descriptors or
    memory keeps its own status, whatever the block was doing)."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise Fatal(what, where, reason, EXIT_RESOURCES if exc.errno in _RESOURCE_ERRNOS else status) from exc


@contextmanager
def fatal_on_log_error(where: str) -> Iterator[None]:
    """Turn the event log's failures inside the block -- an `EventLogError`, or an OSError on its files --
    into a `Fatal` naming the log's directory ``where``, with the operating system's words for the reason
    (``event log (/var/lib/idled): No space left on device``)."""
    try:
        yield
    except (EventLogError, OSError) as exc:
        raise Fatal("event log", where, *_log_reason(exc)) from exc


def _log_reason(exc: EventLogError | OSError) -> tuple[str, int]:
    if isinstance(exc, LogLocked):
        return f"locked by another writer, {holder(exc.pid)}; stop it, or give this one another data_dir", EXIT_LOG
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    if not isinstance(cause, OSError):
        assert isinstance(exc, EventLogError)
        return exc.reason, EXIT_LOG
    if cause.errno == errno.EEXIST and isinstance(exc, FileExistsError):
        reason = "exists and is not a directory"  # os.makedirs on a file
    else:
        reason = cause.strerror or str(cause)
    if isinstance(exc, EventLogError) and exc.code not in ("eventlog", "write_failed"):
        reason = f"{exc.code.replace('_', ' ')}: {reason}"  # e.g. "fsync failed: Input/output error"
    return reason, EXIT_RESOURCES if cause.errno in _RESOURCE_ERRNOS else EXIT_LOG


def holder(pid: int | None) -> str:
    """Who holds a lock, for the one who cannot have it: ``pid 4242 (idled serve --port 7878), listening on
    127.0.0.1:7878, 127.0.0.1:9878`` -- the pid from the lock file, the rest read from the process (and its
    edge children) if it is ours to see."""
    if pid is None:
        return "pid unknown"
    import psutil  # here: every idled command imports this module, and only this rare message needs psutil

    try:
        process = psutil.Process(pid)
        argv = process.cmdline()
        listening = sorted({
            f"{conn.laddr.ip}:{conn.laddr.port}"
            for each in (process, *process.children(recursive=True))
            for conn in each.net_connections("inet")
            if conn.status == psutil.CONN_LISTEN
        })
    except psutil.Error:
        return f"pid {pid}"
    # The interpreter and script by their names: "python3 idled serve ..." rather than two venv paths.
    command = " ".join([*(arg.rsplit("/", 1)[-1] for arg in argv[:2]), *argv[2:]])
    return f"pid {pid}" + (f" ({command})" if command else "") + (f", listening on {', '.join(listening)}" if listening else "")


def exception_leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside trio's (possibly nested) ExceptionGroups, in order; ``exc`` itself if none."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from exception_leaves(inner)
    else:
        yield exc


def describe(exc: BaseException) -> tuple[str, int]:
    """The one line (without the ``idled: fatal: `` prefix) and the exit status for what ended the daemon.

    Trio wraps a failing task's exception in ExceptionGroups; the first `Fatal` inside wins, then the first
    OSError (classified by errno), then anything else (status 1, a bug)."""
    leaves = list(exception_leaves(exc))
    for leaf in leaves:
        if isinstance(leaf, Fatal):
            return str(leaf), leaf.status
    for leaf in leaves:
        if isinstance(leaf, EventLogError):
            cause = leaf.__cause__
            short = isinstance(cause, OSError) and cause.errno in _RESOURCE_ERRNOS
            return f"event log: {leaf}", EXIT_RESOURCES if short else EXIT_LOG
    for leaf in leaves:
        if isinstance(leaf, OSError):
            where = f" ({leaf.filename})" if leaf.filename else ""
            status = (EXIT_RESOURCES if leaf.errno in _RESOURCE_ERRNOS
                      else EXIT_LOG if leaf.errno in _DISK_ERRNOS else EXIT_FAILURE)
            return f"{leaf.strerror or leaf}{where}", status
    first = leaves[0] if leaves else exc
    return f"{type(first).__name__}: {first}", EXIT_FAILURE
