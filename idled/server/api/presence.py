"""``GET``/``POST /v1/presence``: who of these uids is online, since when, last seen when, on which devices.

The answer is the observer ``query`` with ``last_seen`` (``Queries.status_with_last_seen``: grace counts as
online), once the log writer has appended every event published before the request (``Queries.written``), so
that ``since`` and an offline user's ``last_seen`` are current. ``since`` -- when the user came online -- is
read off the event log's open-session map (``EventLog.online_since``): the writer keeps each online user's
open ``online`` record there anyway, and its ``last_seen`` is the login's wall time. A device joining, a
newest-wins take-over or a return within the grace emit no event, so they leave ``since`` alone, as they
should. It costs the presence table nothing per session (see docs/api.md).
"""

from __future__ import annotations

from typing import Any

from idled.protocol import Uid
from idled.server.api.backend import Backend

__all__ = ["presence"]


async def presence(backend: Backend, uids: tuple[Uid, ...]) -> dict[str, Any]:
    queries = backend.queries
    await queries.written(queries.bus.next_seq)
    status = queries.status_with_last_seen(uids)
    online, last_seen, devices = status.online, status.last_seen or {}, status.devices or {}
    since = backend.log.online_since
    users: list[dict[str, Any]] = []
    for uid in uids:
        is_online = online[uid]
        user: dict[str, Any] = {"uid": uid, "online": is_online, "since": since(uid) if is_online else None,
                                "last_seen": last_seen.get(uid)}
        names = devices.get(uid)
        if names:
            user["devices"] = list(names)
        users.append(user)
    return {"users": users}
