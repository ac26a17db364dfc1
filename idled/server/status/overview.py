"""The parts of ``GET /status`` beyond the scrape-time sizes: a summary of the configuration, the workers, the
event rate and the lateness percentiles -- for ``idled status`` and the status page (``/`` on the metrics port).

Everything here is read on the event loop from what the server holds anyway (the frozen ``Config``, the
workers' view, the vitals' ring and histogram): a few microseconds a call. The configuration summary names
what shapes behaviour (tick, timeouts, fsync, limits) and nothing secret: no secret file, no key, no path but
the data directory the document already has.
"""

from __future__ import annotations

from typing import Any

from idled.ops.config import Config
from idled.server.election.fence import Fence
from idled.server.workers.edges import Workers
from idled.server.status.vitals import Vitals

__all__ = ["config_summary", "status_part", "workers_part"]

PERCENTILES = ("count", "mean", "p50", "p90", "p99", "p99_9")  # of the lateness summary, in /status


def config_summary(cfg: Config) -> dict[str, Any]:
    """The settings an operator wants beside the figures (see the module docstring)."""
    return {
        "tick": cfg.tick,
        "timeout": cfg.timeout,
        "max_timeout": cfg.max_timeout,
        "detector": cfg.detector_kind,
        "fsync": cfg.fsync,
        "fsync_interval": cfg.fsync_interval,
        "max_connections": cfg.max_connections,
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


def status_part(cfg: Config, workers: Workers | None, vitals: Vitals, fence: Fence | None = None) -> dict[str, Any]:
    """What ``Server.status()`` adds to the snapshot: config, workers (with ``--workers``), rate, lateness,
    the role (``leader`` under ``--election`` with the lease's seconds left, else ``active``)."""
    lateness = vitals.lateness()
    part: dict[str, Any] = {
        "config": config_summary(cfg),
        "events_per_second": vitals.rate(60.0),
        "lateness": None if lateness is None else {name: lateness[name] for name in PERCENTILES},
    }
    if workers is not None:
        part["workers"] = workers_part(workers)
    if fence is not None and cfg.election is not None:
        part["role"] = "leader"
        part["election"] = {"target": cfg.election, "advertise": cfg.advertised_address(),
                            "lease_left": fence.deadline_in()}
    else:
        part["role"] = "active"
    return part
