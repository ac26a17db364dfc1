"""The doorway as a process assembles it: its role table, its counts, its user plane, its limits and their reload.

Theory of operation
-------------------
The core and an edge take connections through the same ``Doorway`` (``idled.server.roles.doorway``); they
differ in what stands behind it (the presence table, or the link to the core). What they build it from lives
here, once:

* ``connection_counts``: the open connections by role label, plus ``pending`` (still logging in); the
  doorway, the user plane and the status lines all read and write this one dict;
* ``roles``: the doorway's table, login role -> handler. Users run the shared user loop
  (``idled.server.roles.users.run_user``) on the process's ``UserSink``; gateways, observers and standbys get the
  process's own handler (the core serves them, an edge relays them);
* ``user_plane``: the one thread (and task) serving every logged-in plain TCP user; a connection it closes
  gives its count back;
* ``connection_limit``: ``max_connections`` capped to the descriptor budget (``idled.ops.fdbudget``), with a
  warning giving the arithmetic, so descriptors never run out under the log's (or the link's) feet;
* ``reload_door``: a SIGHUP's new configuration (``idled.server.runtime.reload``) handed to the doorway: the
  ``DOOR_RELOADABLE`` settings, the new limit, and the TLS certificate files read again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from idled.ops.config import Config
from idled.ops.fdbudget import Budget, ConnectionLimit
from idled.server.roles.doorway import ROLE_LABELS, Doorway, Role
from idled.server.roles.plane import UserPlane
from idled.server.roles.users import UserSink, run_user

__all__ = [
    "DOOR_RELOADABLE", "connection_counts", "connection_limit", "reload_door", "roles", "user_plane",
]

# Settings the doorway reads per connection or per reload: a SIGHUP applies them to core and edge alike.
DOOR_RELOADABLE = ("log_level", "max_connections", "max_pending_per_address", "login_timeout", "max_frame",
                   "ws_origins")


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
