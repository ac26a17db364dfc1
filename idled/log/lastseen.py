"""Last seen: uid -> the wall time an offline user was last active, kept by the event log.

Theory of operation
-------------------
A query may ask when a user was last seen (``{"op":"query","last_seen":true}``). For an online user the
presence table knows (its sessions' activity); for an offline one the answer is the ``last_seen`` of its last
``offline`` record -- and that record may sit in a segment retention has deleted. So the log keeps the answer
itself, as it keeps the open sessions (`idled.log.snapshot.OpenSessions`): `LastSeen` maps each uid whose last
record is an offline to that record's ``last_seen``, updated as records are appended (an online record
removes the uid: the user is the presence table's again), written into every snapshot beside the open
sessions, and rebuilt by recovery from the newest snapshot plus the records after it. A uid is in at most one
of the two maps.

Bounded by a *horizon* (``last_seen_horizon``, seconds; 0 disables the store): an entry older than the
horizon is never answered (`get` reads it as unknown) and is dropped when a snapshot is written (`prune`,
in the writer's thread, which is the only one that changes the map: the event loop only reads it, one
``dict.get`` at a time). The horizon is measured from ``last_seen``, on the wall clock.

Memory: one dict entry per uid and the record's own float (no copy); the uid object is the record's, which
the presence table no longer holds once the user is offline. `idled bench --last-seen` measures it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from idled.log.snapshot import Uid

__all__ = ["DEFAULT_LAST_SEEN_HORIZON", "LastSeen"]

DEFAULT_LAST_SEEN_HORIZON: Final = 30 * 86400.0


class LastSeen:
    """uid -> last_seen (wall unix seconds) of each user whose last record is an offline, within ``horizon``.
    Changed by one thread at a time (the log writer); `get` may be called from another."""

    __slots__ = ("seen", "horizon")

    def __init__(self, horizon: float = DEFAULT_LAST_SEEN_HORIZON, seen: dict[Uid, float] | None = None) -> None:
        if not horizon >= 0:
            raise ValueError("horizon must be >= 0 seconds (0 disables the store)")
        self.horizon = horizon
        self.seen: dict[Uid, float] = {} if seen is None or not horizon else seen

    def __len__(self) -> int:
        return len(self.seen)

    @property
    def enabled(self) -> bool:
        return self.horizon > 0

    def note(self, event: Mapping[str, Any]) -> None:
        """The append path: an offline record stores its last_seen, an online one forgets the uid."""
        if not self.horizon:
            return
        kind = event.get("kind")
        if kind == "offline":
            last_seen = event.get("last_seen")
            if type(last_seen) is float or type(last_seen) is int:
                self.seen[event.get("uid")] = last_seen  # type: ignore[index]
            else:  # a foreign record without it: unknown, not an older answer
                self.seen.pop(event.get("uid"), None)  # type: ignore[arg-type]
        elif kind == "online":
            self.seen.pop(event.get("uid"), None)  # type: ignore[arg-type]

    def get(self, uid: Uid, now: float) -> float | None:
        """``uid``'s last_seen, or None if unknown or older than the horizon at wall time ``now``."""
        value = self.seen.get(uid)
        if value is None or now - value > self.horizon:
            return None
        return float(value)

    def prune(self, now: float) -> int:
        """Drop entries older than the horizon at wall time ``now``; returns how many. The map is rebuilt (a
        new dict replaces the old one in one store), so a reader on another thread never sees it mid-change
        and the memory of the dropped entries is given back."""
        cutoff = now - self.horizon
        seen = self.seen
        stale = sum(1 for value in seen.values() if value < cutoff)
        if stale:
            self.seen = {uid: value for uid, value in seen.items() if value >= cutoff}
        return stale
