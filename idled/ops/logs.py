"""Logging: the stderr setup, the start-up configuration line, and rate-limited per-peer debug lines.

Theory of operation
-------------------
``setup_logging`` sends lines to stderr; under journald (``JOURNAL_STREAM`` set) with sd-daemon priority
prefixes and no timestamps, since the journal stamps each line itself.

``summary_line(cfg, limit=...)`` is the one line an operator reads first after a start (and what ``idled
check-config`` prints, through the same ``idled.cli.serve.startup_summary``): version, listen address, data
directory, detector, timeout/tick, auth, fsync policy and limits -- the connection limit in force, with the
configured one and why when the descriptor budget caps it (``idled.ops.fdbudget.ConnectionLimit``). Not to be
confused with ``idled.server.status.overview.settings_part``, the same settings as ``/status``'s ``config`` mapping.

``PeerLog`` writes the debug lines about individual peers (login, bye, offline, reject, each with the peer
address when there is one). A flood of garbage connections must not fill the disk, so each *kind* of line
is limited to ``per_second`` lines per one-second window; the lines beyond are counted, and the first line
of a later window is preceded by ``suppressed N <kind> lines``. A window is a wall of ``per_second`` lines
at most, so the cost of a flood is bounded at ``kinds x per_second`` lines per second. When the logger is
not enabled for debug, every call returns after one ``isEnabledFor`` check (a cached dict lookup): the
login and reject paths pay nothing measurable with the default level.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from idled.ops.fdbudget import ConnectionLimit
from idled.protocol.address import format_address

if TYPE_CHECKING:
    from idled.ops.config import Config

__all__ = ["setup_logging", "summary_line", "plural", "peer_address", "PeerLog"]


def setup_logging(level: str, env: dict[str, str] | None = None) -> None:
    """Log lines to stderr; under journald (JOURNAL_STREAM set) with sd-daemon priority prefixes, no timestamps."""
    env = dict(os.environ) if env is None else env
    if env.get("JOURNAL_STREAM"):
        formatter: logging.Formatter = _JournalFormatter("%(name)s: %(message)s")
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx (the etcd election, idled hook) logs every request at info: a line per lease renewal.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))


class _JournalFormatter(logging.Formatter):
    _PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record: logging.LogRecord) -> str:
        return f"<{self._PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 session``, ``2 sessions`` (``words``: an irregular plural)."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def summary_line(
    cfg: Config, *, limit: ConnectionLimit | None = None, version: str | None = None, data_dir: str | None = None,
    listen: str | None = None,
) -> str:
    """The effective configuration in one line (the start-up line, and `idled check-config`). ``limit``: the
    connection limit in force (None: ``max_connections`` as configured, not yet judged against a budget).
    ``listen`` overrides ``host:port`` (e.g. for inherited sockets, whose bound addresses the server logs once
    adopted)."""
    if version is None:
        from idled import __version__ as version
    if data_dir is None:
        data_dir = str(cfg.resolved_data_dir())
    auth = f"on (secret {cfg.secret_file})" if cfg.secret_file else ("off, insecure" if cfg.insecure else "off")
    fsync = cfg.fsync + (f" {cfg.fsync_interval:g}s" if cfg.fsync == "interval" else "")
    metrics = format_address((cfg.metrics_host, cfg.metrics_port)) if cfg.metrics_port else "off"
    return (
        f"idled {version}: listen {listen or format_address((cfg.host, cfg.port))}, metrics {metrics}, data dir {data_dir}, "
        f"detector {cfg.detector_kind} ({cfg.slots} slots), timeout {cfg.timeout:g}s, tick {cfg.tick:g}s, "
        f"max timeout {cfg.max_timeout:g}s, auth {auth}, fsync {fsync}, "
        f"limits: {(limit or ConnectionLimit.of(cfg.max_connections, None)).text(' connections')}, "
        f"frame {_size(cfg.max_frame)} "
        f"(gateway {_size(cfg.max_gateway_frame)}), login {cfg.login_timeout:g}s; "
        f"segments {_size(cfg.segment_bytes)}, retention {_size(cfg.retention_bytes)} / {cfg.retention_seconds:g}s; "
        f"log level {cfg.log_level}"
    )


def peer_address(stream: Any) -> str:
    """``host:port`` of a socket stream's peer, ``-`` for anything else (memory streams in tests)."""
    sock = getattr(stream, "socket", None)
    try:
        peer = sock.getpeername() if sock is not None else None
    except OSError:
        return "-"
    if isinstance(peer, tuple) and len(peer) >= 2:
        return format_address((str(peer[0]), int(peer[1])))
    return "-"


class PeerLog:
    """Debug lines about peers, at most ``per_second`` per kind per second (see the module docstring)."""

    __slots__ = ("logger", "per_second", "clock", "_windows")

    def __init__(
        self, logger: logging.Logger, *, per_second: int = 20, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if per_second < 1:
            raise ValueError("per_second must be at least 1")
        self.logger = logger
        self.per_second = per_second
        self.clock = clock
        # kind -> [window start, lines written in it, lines suppressed since the last summary]
        self._windows: dict[str, list[float]] = {}

    def debug(self, kind: str, message: str, *args: object) -> None:
        logger = self.logger
        if not logger.isEnabledFor(logging.DEBUG):
            return
        now = self.clock()
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = [now, 0, 0]
        elif now - window[0] >= 1.0:
            if window[2]:
                logger.debug("suppressed %d %s lines in the last %.0f s", window[2], kind, now - window[0])
            window[:] = [now, 0, 0]
        if window[1] >= self.per_second:
            window[2] += 1
            return
        window[1] += 1
        logger.debug(message, *args)

    def event(self, event: Any) -> None:
        """One line per presence event (a ``PresenceEvent``): kind, uid, reason, seq, and for an offline its
        lateness (fired time minus deadline)."""
        if not self.logger.isEnabledFor(logging.DEBUG):
            return
        if event.kind == "offline" and event.reason == "idle":
            self.debug("offline", "offline %r: %s (seq %d, %.3f s after the deadline)", event.uid, event.reason,
                       event.seq, event.ts - event.deadline)
        else:
            self.debug(event.kind, "%s %r: %s (seq %d)", event.kind, event.uid, event.reason, event.seq)

    def suppressed(self, kind: str) -> int:
        """Lines of ``kind`` dropped in the current window (not yet summarised)."""
        window = self._windows.get(kind)
        return int(window[2]) if window else 0
