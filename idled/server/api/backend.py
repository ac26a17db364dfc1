"""What the API reads and changes, handed over by the server: the API never sees the ``Server`` itself.

The presence table, ``Sessions`` (the one way to change presence), the observer role's ``Queries`` (the
answers an observer's ``query`` with ``last_seen`` gets), the event log (``online_since``), and the server's
status, vitals and worker view for ``GET /v1/stats``; the observer role, for the event stream (``GET /v1/events``). All of it is read and changed on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from idled.log.eventlog import EventLog
from idled.server.engine.queries import Queries
from idled.server.engine.sessions import Sessions
from idled.server.roles.observers import Observers
from idled.server.status.vitals import Vitals

__all__ = ["Backend"]


@dataclass(frozen=True, slots=True)
class Backend:
    sessions: Sessions
    queries: Queries
    log: EventLog
    vitals: Vitals
    status: Callable[[], dict[str, Any]]  # Server.status: sizes, connections, next_seq, stopping
    workers: Callable[[], list[tuple[str, int | None, int, int, int]]] | None  # Supervisor.view, with --workers
    started: float  # time.monotonic() when the server started (uptime)
    observers: Observers | None = None  # the observer role, whose event path GET /v1/events follows
