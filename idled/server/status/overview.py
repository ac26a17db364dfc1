"""The parts of ``GET /status`` beyond the scrape-time sizes: the settings in force, the role and its leader,
the workers, the event rate and the lateness percentiles -- for ``idled status`` and the status page (``/``
on the metrics port).

Everything here is read on the event loop from what the server holds anyway (the frozen ``Config``, the
descriptor budget, the workers' view, the vitals' ring and histogram): a few microseconds a call.
``settings_part`` (``/status``'s ``config``; the start-up line is ``idled.ops.logs.summary_line``) names what
shapes behaviour (tick, timeouts, fsync, limits) and nothing secret: no secret file, no key, no path but the
data directory the document already has. Its ``max_connections`` is the limit in force -- capped to the
descriptor budget, with the configured value and the arithmetic beside it when capped
(``idled.ops.fdbudget.ConnectionLimit``) -- not a configured value the daemon does not honour.
"""

from __future__ import annotations

from typing import Any

from idled.ops.config import Config
from idled.ops.fdbudget import Budget, ConnectionLimit, edge_budget, open_file_limit
from idled.server.election.fence import Fence
from idled.server.status.vitals import Vitals
from idled.server.workers.edges import Workers

__all__ = ["connection_limit_of", "settings_part", "status_part", "workers_part"]

PERCENTILES = ("count", "mean", "p50", "p90", "p99", "p99_9")  # of the lateness summary, in /status


def connection_limit_of(cfg: Config, budget: Budget | None, workers: Workers | None) -> ConnectionLimit:
    """The connection limit in force: ``max_connections`` capped to this core's descriptor budget, or with
    ``--workers`` to its edges' budgets together (each edge caps itself to its own, ``edge_budget``, and they
    all run under the open-file limit the root raised)."""
    if workers is None:
        return ConnectionLimit.of(cfg.max_connections, budget)
    return ConnectionLimit.shared(cfg.max_connections, max(1, cfg.workers),
                                  edge_budget(open_file_limit(), len(workers.public)))


def settings_part(cfg: Config, limit: ConnectionLimit | None = None) -> dict[str, Any]:
    """The settings an operator wants beside the figures (see the module docstring); ``limit``: the connection
    limit in force (None: not judged yet, as configured)."""
    limit = limit or ConnectionLimit.of(cfg.max_connections, None)
    return {
        "tick": cfg.tick,
        "timeout": cfg.timeout,
        "max_timeout": cfg.max_timeout,
        "detector": cfg.detector_kind,
        "fsync": cfg.fsync,
        "fsync_interval": cfg.fsync_interval,
        **limit.fields(),
        "max_devices": cfg.max_devices,
        "max_frame": cfg.max_frame,
        "login_timeout": cfg.login_timeout,
        "offline_grace": cfg.offline_grace,
        "workers": cfg.workers,
        "auth": bool(cfg.secret_file),  # logins need a token (no secret: auth off, allowed on loopback)
        "tls": cfg.tls_cert is not None,
        "proxy_protocol": cfg.proxy_protocol,
    }


def workers_part(workers: Workers) -> list[dict[str, Any]]:
    """Per edge worker: name, pid (None: down), up, restarts, sessions and connections it holds."""
    return [
        {"name": name, "pid": pid, "up": pid is not None, "restarts": restarts, "sessions": sessions,
         "connections": connections}
        for name, pid, restarts, sessions, connections in workers.view()
    ]


def status_part(cfg: Config, workers: Workers | None, vitals: Vitals, fence: Fence | None = None,
                budget: Budget | None = None) -> dict[str, Any]:
    """What ``Server.status()`` adds to the snapshot: config (with the connection limit ``budget`` allows),
    workers (with ``--workers``), rate, lateness, the role (``leader`` under ``--election`` with the lease's
    seconds left and itself as the ``leader``, else ``active``)."""
    lateness = vitals.lateness()
    part: dict[str, Any] = {
        "config": settings_part(cfg, connection_limit_of(cfg, budget, workers)),
        "events_per_second": vitals.rate(60.0),
        "lateness": None if lateness is None else {name: lateness[name] for name in PERCENTILES},
    }
    if workers is not None:
        part["workers"] = workers_part(workers)
    if fence is not None and cfg.election is not None:
        part["role"] = "leader"
        part["leader"] = cfg.advertised_address()
        part["election"] = {"target": cfg.election, "advertise": cfg.advertised_address(),
                            "lease_left": fence.deadline_in()}
    else:
        part["role"] = "active"
    return part
