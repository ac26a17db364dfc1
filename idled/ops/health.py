"""Health for probes and operators: what /healthz, /readyz and /status on the metrics endpoint answer.

See `idled.ops.http` (the endpoint) and docs/operations.md (the probes). ``/readyz`` probes the event log's
directory with a real write -- create, lock, write, fsync, unlink a small file (`probe_directory`, which
`idled check-config` runs too), in a worker thread -- because
``os.access`` says nothing about a full disk, a read-only remount, an immutable or removed directory; the
answer is cached for ``cache_seconds`` so a probe storm costs one write per second. A server that runs
degraded (its event log's disk is full: ``idled.server.engine.degraded``) is not ready either, and says why first:
the probe's small write may fit where the log's next batch does not.

Who gets what (``Health.access``, given the request's ``Authorization`` header): with auth off (no ``secret``:
the endpoint is on loopback, or the operator said ``--insecure``) everyone gets everything. With auth on,
``/healthz``, ``/readyz`` and ``/metrics`` answer anyone -- a kubelet probe or a Prometheus scrape carries no
token -- but ``/readyz``'s reason has its paths scrubbed; ``/status`` without a token is the redacted document
(`idled.ops.redact`: how the daemon is, not who is online); ``/status/live`` (the last events, with uids)
needs the HTTP API's bearer token (role ``api``, ``idled token --api``), and so does the whole ``/status``. A
request that shows an ``Authorization`` header which does not check out (another secret, expired, a login
token, not ``Bearer``) is refused with 401 on both, so a client learns its token is no good instead of
reading a redacted document as if it were whole.

``uptime_seconds`` is the *process's* (its start time in ``/proc/self/stat``, counted on the boot-time clock,
read once): a core whose role changes -- promoted, elected, stepping down -- builds a new role with a new
``Health``, and its uptime must not start again at the role change. ``role_seconds`` is the role's own time.
A process with no event log (an edge: ``data_dir`` None) probes nothing: it is ready while it listens.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from idled import __version__
from idled.ops.redact import redact_status, scrub_paths
from idled.ops.statuspage import JSON_HEADERS, LIVE_PATH, live_query
from idled.protocol.tokens import BEARER_CHALLENGE, BEARER_REQUIRED, bearer_refusal

__all__ = ["PROBE_NAME", "Access", "Health", "health_response", "probe_directory", "process_uptime"]

PROBE_NAME = ".readyz-probe"  # the file /readyz writes and removes in the data directory
JSON_SEPARATORS = (",", ":")  # compact: the status page polls it every second
LIVE_PROBE_AGE = 5.0  # seconds: an open status page makes the readiness probe write at most this seldom


@dataclass(frozen=True, slots=True)
class Access:
    """What one request may read (see the module docstring): ``full`` (auth off, or a good token), or not;
    ``refused``: why the token it showed was refused (None: it showed none, or a good one); ``token``: it
    showed a good token (its connection counts as authenticated at the door's gate)."""

    full: bool
    refused: str | None = None
    token: bool = False


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


def process_uptime(stat: str = "/proc/self/stat") -> float | None:
    """Seconds since this process started (``stat``'s start time, in clock ticks since boot, against
    CLOCK_BOOTTIME: the clock it is counted on, so a wall-clock step does not move it); None where the file
    cannot be read (not Linux)."""
    try:
        with open(stat, "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()  # past the command name, which may hold spaces
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5); fields[0] is field 3
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Health:
    """What /healthz, /readyz and /status report (see the module docstring).

    ``data_dir``: the event log's directory, probed with a real write (None: a process without one, an edge). ``status``: the server's part of the
    status document, called on the event loop. ``listening``: whether the client listener is open (and the
    server not shutting down). ``vitals(after, since)``: the ``vitals`` part of ``/status/live`` (events with a
    seq above ``after``, samples newer than ``since``; see `idled.ops.statuspage`), called on the event loop.
    ``secret``: the HMAC secret API tokens are checked with (None: auth off, everything is open), at the time
    ``wall`` gives (the server's ``Clock.wall``). ``degraded``: why the server runs degraded (None: it does
    not), called on the event loop."""

    def __init__(
        self,
        data_dir: str | Path | None,
        *,
        status: Callable[[], Mapping[str, Any]],
        listening: Callable[[], bool],
        vitals: Callable[[int, float | None], Mapping[str, Any]] = lambda after, since: {},
        degraded: Callable[[], str | None] = lambda: None,
        version: str = __version__,
        cache_seconds: float = 1.0,
        secret: bytes | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.status_source = status
        self.listening = listening
        self.vitals_source = vitals
        self.degraded = degraded
        self.version = version
        self.cache_seconds = cache_seconds
        self.secret = secret
        self.wall = wall  # token expiry is judged on it: the server's wall clock, which never goes backwards
        self.role_started = time.monotonic()
        # The process's start on the same clock (see the module docstring); this role's, where it is unknown.
        self.started = self.role_started - (process_uptime() or 0.0)
        self._probed_at = -float("inf")
        self._log_problem: str | None = None
        self._lock: trio.Lock | None = None  # created on the loop, at the first probe
        self._known_paths: tuple[str, ...] | None = None

    def _probe_log(self) -> str | None:
        """In a worker thread: None if a file can be created, written, synced and removed in the directory."""
        if self.data_dir is None:
            return None
        problem = probe_directory(self.data_dir)
        return None if problem is None else f"event log directory {self.data_dir} is not writable: {problem}"

    def access(self, authorizations: Sequence[str]) -> Access:
        """What a request with these ``Authorization`` header values may read (two are one too many: refused,
        rather than one of them picked)."""
        if self.secret is None:
            return Access(full=True)
        if not authorizations:
            return Access(full=False)
        refusal = bearer_refusal(self.secret, authorizations, self.wall())
        return Access(full=False, refused=refusal) if refusal is not None else Access(full=True, token=True)

    def known_paths(self) -> tuple[str, ...]:
        """The paths a redacted answer must not show by name: the data directory, as given and resolved (looked
        up once, at the first unauthenticated answer: not a file-system walk per request)."""
        if self._known_paths is None:
            data = self.data_dir
            self._known_paths = () if data is None else (str(data), str(data.absolute()), str(data.resolve()))
        return self._known_paths

    def redacted(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """``document`` as an unauthenticated client may read it (`idled.ops.redact`)."""
        return redact_status(document, self.known_paths())

    async def log_problem(self, max_age: float = 0.0) -> str | None:
        """Why the event log cannot be written (None: it can), probed at most once per ``cache_seconds`` (or
        ``max_age``, if longer)."""
        if self.data_dir is None:
            return None
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
            "role_seconds": round(time.monotonic() - self.role_started, 3),
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


Headers = tuple[tuple[str, str], ...]


def _json(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, sort_keys=True, separators=JSON_SEPARATORS) + "\n").encode()


async def health_response(health: Health, path: str, query: str, access: Access) -> tuple[int, bytes, str, Headers]:
    """(status, body, content type, extra headers) for /healthz, /readyz, /status and /status/live (``query``:
    its query; ``access``: what the request may read, ``Health.access``)."""
    plain = "text/plain; charset=utf-8"
    if path == "/healthz":
        return 200, b"ok\n", plain, ()
    if path == "/readyz":
        ready, reason = await health.ready()
        if not access.full:
            reason = scrub_paths(reason, health.known_paths())
        return (200 if ready else 503), f"{reason}\n".encode(), plain, ()
    if access.refused is not None or (path == LIVE_PATH and not access.full):
        refusal = {"error": {"code": "unauthorized", "message": access.refused or BEARER_REQUIRED}}
        return 401, _json(refusal), "application/json", JSON_HEADERS + BEARER_CHALLENGE
    if path == LIVE_PATH:
        try:
            after, since = live_query(query)
        except ValueError as exc:
            return 400, f"{exc}\n".encode(), plain, ()
        document = await health.live(after, since)
    else:
        document = await health.status()
    document = {**document, "redacted": False} if access.full else health.redacted(document)
    return 200, _json(document), "application/json", JSON_HEADERS
