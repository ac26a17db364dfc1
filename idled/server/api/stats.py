"""``GET /v1/stats``: the daemon at a glance, as JSON: sizes, connections, events, rates, lateness, workers.

Everything is read off what the server keeps anyway: ``Server.status`` (the scrape-time snapshot and the seq
counter), ``Vitals`` (event rates over the sampled history, and the offline-lateness histogram with its
bucket-bound percentiles), ``Supervisor.view`` with ``--workers``.
"""

from __future__ import annotations

import time
from typing import Any

from idled import __version__
from idled.server.api.backend import Backend

__all__ = ["stats"]


def stats(backend: Backend, api_connections: int) -> dict[str, Any]:
    status = backend.status()
    vitals = backend.vitals
    connections = {role: int(n) for role, n in status["connections"].items()}
    connections["api"] = api_connections
    document: dict[str, Any] = {
        "version": __version__,
        "uptime": max(0.0, time.monotonic() - backend.started),
        "ready": bool(status["ports"]) and not status["stopping"],
        "stopping": bool(status["stopping"]),
        "sessions_online": status["sessions_online"],
        "users_online": status["users_online"],
        "connections": connections,
        "next_seq": status["next_seq"],
        "rates": {"events_per_second_1m": vitals.rate(60.0), "events_per_second_10s": vitals.rate(10.0)},
        "lateness": vitals.lateness(),
        "workers": None,
    }
    if backend.workers is not None:
        document["workers"] = [
            {"name": name, "pid": pid, "up": pid is not None, "restarts": restarts, "sessions": sessions,
             "connections": held}
            for name, pid, restarts, sessions, held in backend.workers()
        ]
    return document
