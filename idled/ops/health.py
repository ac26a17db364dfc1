"""Health for probes and operators: what /healthz, /readyz and /status on the metrics endpoint answer.

See `idled.ops.metrics` (the endpoint) and docs/operations.md (the probes). ``/readyz`` probes the event log's
directory with a real write -- create, lock, write, fsync, unlink a small file (`probe_directory`, which
`idled check-config` runs too), in a worker thread -- because
``os.access`` says nothing about a full disk, a read-only remount, an immutable or removed directory; the
answer is cached for ``cache_seconds`` so a probe storm costs one write per second. A server that runs
degraded (its event log's disk is full: ``idled.server.degraded``) is not ready either, and says why first:
the probe's small write may fit where the log's next batch does not.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from idled import __version__
from idled.ops.statuspage import LIVE_PATH, live_query

__all__ = ["PROBE_NAME", "Health", "health_response", "probe_directory"]

PROBE_NAME = ".readyz-probe"  # the file /readyz writes and removes in the data directory
JSON_SEPARATORS = (",", ":")  # compact: the status page polls it every second
LIVE_PROBE_AGE = 5.0  # seconds: an open status page makes the readiness probe write at most this seldom


def probe_directory(directory: Path) -> str | None:
    """None if a file can be created, flock'ed (the log locks its directory), written, synced and removed in
    ``directory``; else the operating system's reason. Blocking I/O."""
    path = directory / PROBE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, b"ok\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


class Health:
    """What /healthz, /readyz and /status report (see the module docstring).

    ``data_dir``: the event log's directory, probed with a real write. ``status``: the server's part of the
    status document, called on the event loop. ``listening``: whether the client listener is open (and the
    server not shutting down). ``vitals(after, since)``: the ``vitals`` part of ``/status/live`` (events with a
    seq above ``after``, samples newer than ``since``; see `idled.ops.statuspage`), called on the event loop.
    ``degraded``: why the server runs degraded (None: it does not), called on the event loop."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        status: Callable[[], Mapping[str, Any]],
        listening: Callable[[], bool],
        vitals: Callable[[int, float | None], Mapping[str, Any]] = lambda after, since: {},
        degraded: Callable[[], str | None] = lambda: None,
        version: str = __version__,
        cache_seconds: float = 1.0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.status_source = status
        self.listening = listening
        self.vitals_source = vitals
        self.degraded = degraded
        self.version = version
        self.cache_seconds = cache_seconds
        self.started = time.monotonic()
        self._probed_at = -float("inf")
        self._log_problem: str | None = None
        self._lock: trio.Lock | None = None  # created on the loop, at the first probe

    def _probe_log(self) -> str | None:
        """In a worker thread: None if a file can be created, written, synced and removed in the directory."""
        problem = probe_directory(self.data_dir)
        return None if problem is None else f"event log directory {self.data_dir} is not writable: {problem}"

    async def log_problem(self, max_age: float = 0.0) -> str | None:
        """Why the event log cannot be written (None: it can), probed at most once per ``cache_seconds`` (or
        ``max_age``, if longer)."""
        if self._lock is None:
            self._lock = trio.Lock()
        async with self._lock:  # concurrent probes share one write
            if trio.current_time() - self._probed_at >= max(max_age, self.cache_seconds):
                self._log_problem = await trio.to_thread.run_sync(self._probe_log)
                self._probed_at = trio.current_time()
        return self._log_problem

    async def ready(self, max_age: float = 0.0) -> tuple[bool, str]:
        """(ready?, reason) for /readyz (``max_age``: see ``log_problem``)."""
        if not self.listening():
            return False, "not listening for clients (starting or shutting down)"
        if (degraded := self.degraded()) is not None:
            return False, degraded
        problem = await self.log_problem(max_age)
        if problem is not None:
            return False, problem
        return True, "ready"

    async def status(self, max_age: float = 0.0) -> dict[str, Any]:
        """The /status document."""
        ready, reason = await self.ready(max_age)
        document: dict[str, Any] = {
            "version": self.version,
            "uptime_seconds": round(time.monotonic() - self.started, 3),
            "ready": ready,
            "ready_reason": reason,
        }
        document.update(self.status_source())
        return document

    async def live(self, after: int = 0, since: float | None = None) -> dict[str, Any]:
        """The /status/live document: /status and what changed in the vitals (see `idled.ops.statuspage`)."""
        document = await self.status(LIVE_PROBE_AGE)
        document["vitals"] = self.vitals_source(after, since)
        return document


async def health_response(health: Health, path: str, query: str = "") -> tuple[int, bytes, str]:
    """(status, body, content type) for /healthz, /readyz, /status and /status/live (``query``: its query)."""
    plain = "text/plain; charset=utf-8"
    if path == "/healthz":
        return 200, b"ok\n", plain
    if path == "/readyz":
        ready, reason = await health.ready()
        return (200 if ready else 503), f"{reason}\n".encode(), plain
    if path == LIVE_PATH:
        try:
            after, since = live_query(query)
        except ValueError as exc:
            return 400, f"{exc}\n".encode(), plain
        document = await health.live(after, since)
    else:
        document = await health.status()
    return 200, (json.dumps(document, sort_keys=True, separators=JSON_SEPARATORS) + "\n").encode(), "application/json"
