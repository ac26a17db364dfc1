"""``POST /v1/kick``: end a user's sessions now -- every one, or one device's.

Each ended session is logged out as its owner would be (``PresenceTable.logout`` with the owner it has, reason
``kicked``), so the device rules hold: the user's offline (with the caller's text as ``note``, when given) is
published only when its last session ends; kicking one device while another lives emits nothing. Then the
owner is told (``release(key, "kicked", text)``): a direct connection gets the error frame and is closed; an
edge gets an ``ended`` notice (reason ``kicked``) through its gateway link and closes its user's connection --
the gateway protocol carries no text, so an edge's user reads the edge's own message.

While the server is degraded (its event log's disk is full: ``idled.server.engine.degraded``) a kick is refused with
``503 unavailable`` and ``Retry-After``: it would end sessions whose events could only wait in memory.

A user online only by the grace (its last connection is gone, its offline not yet due) has no session to end:
``not_online``, as for a user not online at all.
"""

from __future__ import annotations

import dataclasses

from idled.core.presence import SessionKey
from idled.protocol import ErrorCode, ProtocolError
from idled.server.api.backend import Backend
from idled.server.api.errors import ApiError
from idled.server.api.request import Kick

__all__ = ["kick"]


async def kick(backend: Backend, request: Kick) -> dict[str, int]:
    sessions = backend.sessions
    try:
        await sessions.admit()
    except ProtocolError as exc:
        retry = (("Retry-After", "1"),) if exc.code == ErrorCode.UNAVAILABLE else ()
        reason = exc.reason if retry else "the server is shutting down"
        raise ApiError("unavailable", reason, retry) from None
    presence = sessions.presence
    keys: tuple[SessionKey, ...] = presence.keys_of(request.uid)
    if request.device is not None:
        device_key = (request.uid, request.device)
        keys = (device_key,) if device_key in keys else ()
    if not keys:
        what = f"device {request.device!r} of uid" if request.device is not None else "uid"
        raise ApiError("not_online", f"{what} {request.uid!r} has no live session")
    now, wall = sessions.clock.now(), sessions.clock.wall()
    # The error frame's reason is the text after its code: clients print "kicked: <reason>", so the reason
    # must not say "kicked" again.
    message = request.note or "ended by the server's operator"
    ended = 0
    for key in keys:
        owner = presence.owner_of(key)
        if owner is None:
            continue
        event = presence.logout(key, owner, now, wall, "kicked")
        if event is not None and request.note:
            event = dataclasses.replace(event, note=request.note)
        sessions.publish(event)
        owner.release(key, ErrorCode.KICKED, message)
        ended += 1
    return {"ended": ended}
