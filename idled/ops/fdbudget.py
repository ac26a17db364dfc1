"""The descriptor budget: how many client connections fit in the open-file limit.

Theory of operation
-------------------
Every connection holds one descriptor, and so does everything else the daemon keeps open: stdin/stdout/stderr,
its listening sockets, the event log (the current segment, the next one opened ahead of a roll, the lock file,
the directory while it is fsync'ed, the seq-reservation file while it is rewritten, segments a replay or
retention scan opens in a worker thread), the metrics endpoint (its listener and the scrapes in progress), and
trio's own (the epoll descriptor, the wake-up socket pair), plus systemd's notify socket. If connections could
take every descriptor, the first of those to need one at the wrong moment -- typically the log's roll to a
new segment -- would fail with EMFILE and take the daemon down with every user on it.

So the budget keeps ``RESERVE`` descriptors (plus one per listener) out of the connections' reach, and the
server never lets more connections in than the budget: a connection past it is accepted and closed at once
with a ``busy`` error frame (a client learns why and backs off; a connection left in the kernel's backlog
would hang until its own timeout). ``--max-connections`` above the budget is capped to it, with a warning
at start (and when SIGHUP reloads it).

Measured (``ls /proc/PID/fd`` of an idle ``idled serve --metrics-port 0``): 12 descriptors -- stdio 3, the
listener, the log's lock, trio's epoll and wake-up pair, the stdlib's /dev/null pair and signal pipe. Add the
metrics listener and its 16 scrapes, the log's segments around a roll and its fsyncs, the accept loop's spare
(``idled.door.accept``), one replay per observer reading old segments: ~40 at worst, so 64 leaves room.

What an operator is shown (the start-up line, ``idled check-config``, ``/status``, ``idled status``, the
status page) is the limit in force, ``ConnectionLimit.effective``: with the configured value beside it and the
budget's arithmetic when the budget capped it -- never only the configured ``max_connections``, which the
daemon may not honour.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Final

__all__ = ["RESERVE", "Budget", "ConnectionLimit", "connection_budget", "edge_budget", "open_file_limit"]

# stdio 3 + log ~6 (segment, next segment, lock, dir, reservation tmp, one reader) + the metrics listener and
# its 16 concurrent scrapes + trio 3 + notify 1 = ~30; the rest is headroom for threads' transient opens.
RESERVE: Final = 64


def open_file_limit() -> int:
    """The soft RLIMIT_NOFILE in force (raise it first: `idled.ops.systemd.raise_nofile_limit`)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_budget(nofile: int, *, listeners: int, http: int = 0) -> int:
    """Connections that fit under an open-file limit of ``nofile`` beside ``listeners`` listening sockets, the
    ``http`` connections the HTTP endpoints (API, metrics) may hold at once, and the reserve; at least 1, so a
    tiny limit still serves (and refuses) someone."""
    return max(1, nofile - RESERVE - listeners - http)


@dataclass(frozen=True, slots=True)
class Budget:
    """The budget with its terms, so a log line can show the arithmetic an operator can check."""

    nofile: int
    listeners: int
    connections: int
    http: int = 0

    @classmethod
    def of(cls, nofile: int, *, listeners: int, http: int = 0) -> Budget:
        return cls(nofile, listeners, connection_budget(nofile, listeners=listeners, http=http), http)

    def __str__(self) -> str:
        http = f" - {self.http} HTTP connection(s)" if self.http else ""
        return (f"open-file limit {self.nofile} - reserve {RESERVE} - {self.listeners} listener(s){http} "
                f"= {self.connections} connections")


def edge_budget(nofile: int, listeners: int) -> Budget:
    """An edge's budget: its listeners (at least one) and its link to the core, which holds a descriptor too."""
    return Budget.of(nofile, listeners=max(1, listeners) + 1)


@dataclass(frozen=True, slots=True)
class ConnectionLimit:
    """``max_connections`` as configured and as in force (``effective``); ``why``: the budget's arithmetic when
    it capped the configured value (None: not capped)."""

    configured: int
    effective: int
    why: str | None = None

    @classmethod
    def of(cls, max_connections: int, budget: Budget | None) -> ConnectionLimit:
        """The configured value capped to ``budget`` (None: not known yet, not capped)."""
        if budget is None or max_connections <= budget.connections:
            return cls(max_connections, max_connections)
        return cls(max_connections, budget.connections, str(budget))

    @classmethod
    def shared(cls, max_connections: int, edges: int, budget: Budget) -> ConnectionLimit:
        """``max_connections`` of a daemon whose ``edges`` edges (``--workers``) each hold at most ``budget``."""
        total = edges * budget.connections
        if max_connections <= total:
            return cls(max_connections, max_connections)
        return cls(max_connections, total, f"{edges} workers x ({budget})")

    def text(self, unit: str = "", *, grouped: bool = False) -> str:
        """``19935 connections (10000000 configured; capped: open-file limit ...)``, or ``100000 connections``
        when not capped (``unit``: " connections"; ``grouped``: 19,935)."""
        number = "{:,}" if grouped else "{}"
        shown = number.format(self.effective) + unit
        if self.why is None:
            return shown
        return f"{shown} ({number.format(self.configured)} configured; capped: {self.why})"

    def fields(self) -> dict[str, int | str]:
        """For a status document: ``max_connections`` (in force), and the configured value and why when capped."""
        if self.why is None:
            return {"max_connections": self.effective}
        return {"max_connections": self.effective, "max_connections_configured": self.configured,
                "max_connections_why": self.why}
