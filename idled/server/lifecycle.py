"""What the core (``idled.server.app``) and an edge (``idled.server.edge.app``) share of their lifecycle.

Theory of operation
-------------------
Both processes take connections through the same ``Doorway`` (``idled.server.conn``) and reload on SIGHUP;
they differ in what stands behind the door (the presence table, or the link to the core) and in what else
they run. The parts they agree on live here, once:

* ``connection_counts``: the open connections by role label, plus ``pending`` (still logging in); the
  doorway, the user plane and the status lines all read and write this one dict;
* ``roles``: the doorway's table, login role -> handler. Users run the shared user loop
  (``idled.server.users.run_user``) on the process's ``UserSink``; gateways, observers and standbys get the
  process's own handler (the core serves them, an edge relays them);
* ``user_plane``: the one task serving every logged-in plain TCP user; a connection it closes gives its
  count back;
* ``connection_limit``: ``max_connections`` capped to the descriptor budget (``idled.ops.fdbudget``), with a
  warning giving the arithmetic, so descriptors never run out under the log's (or the link's) feet;
* ``reload``: SIGHUP. Re-read the configuration, keep the running value of every setting that needs a
  restart (named in the log line), hand the result to the process's ``apply`` -- which passes it on to the
  doorway with ``DOOR_RELOADABLE`` (``reload_door``: the new limits, and the TLS certificate files read
  again) -- and set the log level. A configuration that does not load changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from idled.ops import systemd
from idled.ops.config import Config, ConfigError
from idled.ops.fdbudget import Budget, ConnectionLimit
from idled.server.conn import ROLE_LABELS, Doorway, Role
from idled.server.plane import UserPlane
from idled.server.users import UserSink, run_user

__all__ = [
    "DOOR_RELOADABLE", "connection_counts", "connection_limit", "reload", "reload_door", "roles", "user_plane",
]

# Settings the doorway reads per connection or per reload: a SIGHUP applies them to core and edge alike.
DOOR_RELOADABLE = ("log_level", "max_connections", "max_pending_per_address", "login_timeout", "max_frame")


def connection_counts() -> dict[str, int]:
    """Open connections by role label (``ROLE_LABELS``), and ``pending``: accepted, not logged in yet."""
    return {**{label: 0 for label in ROLE_LABELS.values()}, "pending": 0}


def roles(users: UserSink[Any], *, gateway: Role, observer: Role, standby: Role) -> dict[str, Role]:
    """The doorway's role table: users run the shared user loop on ``users``; the others their handler."""
    return {"uid": functools.partial(run_user, users), "gateway": gateway, "observer": observer, "standby": standby}


def user_plane(users: UserSink[Any], connections: dict[str, int], reject: Callable[[str], None]) -> UserPlane:
    """The user plane for ``users``'s logged-in plain TCP connections (set as ``users.plane``); each it
    closes leaves ``connections`` (the doorway counted it in). ``reject`` counts a frame it refused."""

    def closed() -> None:
        connections["user"] -= 1

    plane = UserPlane(users, release=closed, reject=reject)
    users.plane = plane
    return plane


def connection_limit(max_connections: int, budget: Budget | None, log: logging.Logger, *, shared: bool = False) -> int:
    """``max_connections`` capped to ``budget`` (None: not known yet, uncapped), with a warning giving the
    arithmetic (``ConnectionLimit``: what the status shows). ``shared``: ``max_connections`` is the whole
    daemon's, over several edges (checked against their total elsewhere), so this process's own limit is just
    its budget."""
    limit = ConnectionLimit.of(max_connections, budget)
    if limit.why is None:
        log.info("connections limited to %d (descriptor budget: %s)", max_connections, budget)
        return max_connections
    if shared:
        return limit.effective
    log.warning("max_connections %d is more than the descriptors allow (%s): capped to %d",
                max_connections, limit.why, limit.effective)
    return limit.effective


def reload_door(door: Doorway, previous: Config, config: Config, limit: Callable[[int], int]) -> None:
    """Hand a reloaded ``config`` to ``door`` (TLS certificates re-read); ``limit(max_connections)`` gives its
    connection limit when ``max_connections`` changed."""
    door.reload(config)
    if config.max_connections != previous.max_connections:
        door.limit = limit(config.max_connections)


def reload(
    current: Config,
    source: Callable[[], Config] | None,
    reloadable: Sequence[str],
    apply: Callable[[Config], None],
    log: logging.Logger,
    *,
    env: Mapping[str, str] | None = None,
) -> None:
    """SIGHUP (see the module docstring). ``env``: tell systemd we are reloading (the core; an edge's
    supervisor speaks for it). Logs go to stderr (journald), so there is no log file to reopen."""
    if source is None:
        log.info("SIGHUP: no configuration source to reload")
        return
    if env is not None:
        systemd.notify(systemd.RELOADING, env=env)
    try:
        new = source()
    except ConfigError as exc:
        log.error("SIGHUP: configuration not reloaded: %s", exc)
        return
    finally:
        if env is not None:
            systemd.notify(systemd.READY, env=env)
    applied = {name: getattr(new, name) for name in reloadable if getattr(new, name) != getattr(current, name)}
    ignored = [field.name for field in dataclasses.fields(new)
               if field.name not in reloadable and getattr(new, field.name) != getattr(current, field.name)]
    apply(dataclasses.replace(current, **applied))
    if "log_level" in applied:
        logging.getLogger().setLevel(str(applied["log_level"]).upper())
    log.info(
        "SIGHUP: reloaded %s%s",
        ", ".join(f"{k}={v}" for k, v in applied.items()) or "nothing changed",
        f"; needs a restart: {', '.join(ignored)}" if ignored else "",
    )
