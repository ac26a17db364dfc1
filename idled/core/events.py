"""Presence events: what the presence table emits, one value per change, as logged and as observers see it.

Theory of operation
-------------------
The presence table (``idled.core.presence``) returns a `PresenceEvent` for every user-level change -- an
``online`` when a user's first session key comes, an ``offline`` when its last goes -- numbered by ``seq``;
it sends nothing itself. The server hands the event to the bus, which logs ``record()`` (the event log's
record, ``docs/event-log.md``) and shows it to observers. Times are wall-clock unix seconds: ``ts`` when it
happened, ``last_seen`` the session's last activity, ``deadline`` = ``last_seen + timeout``.

Three fields are optional and appear in the record only when set, so a client that never sends a device, on a
daemon without ``offline_grace``, produces the very records it did before any existed:

* ``device``: the device whose login or end caused the event (None: a plain key's);
* ``grace``: on an offline that waited out the grace (``idled.core.grace``), the grace in seconds (its ``ts``
  is when the connection closed, not when the grace ran out);
* ``note``: on an offline with reason ``kicked`` that the HTTP API ended (``POST /v1/kick``), the free text
  its caller gave, if any.

A frozen value (``slots=True, frozen=True``). Its ``__init__`` is written out rather than generated: a frozen
dataclass's own looks up ``object.__setattr__`` once per field, and the two optional fields made every event
~0.2 us dearer to build (a login's online, every offline); bound once, as a default, it builds eleven fields
as fast as the nine took before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from idled.core.devices import Uid

__all__ = ["PresenceEvent"]


@dataclass(frozen=True, slots=True)
class PresenceEvent:
    """One presence change, as logged and as observers see it (times are wall-clock unix seconds).

    ``device``: the device whose login or end caused the event (None: a plain key's, and then absent from the
    record); ``grace``: the grace in seconds an offline waited for (only on a grace offline); ``note``: a kick's
    free text (only on an offline the HTTP API kicked with one)."""

    seq: int
    kind: str  # "online" | "offline"
    uid: Uid
    ts: float
    reason: str
    last_seen: float
    deadline: float
    timeout: float
    detector: str
    device: str | None = None
    grace: float | None = None
    note: str | None = None

    # Written out rather than generated: see the module docstring.
    def __init__(self, seq: int, kind: str, uid: Uid, ts: float, reason: str, last_seen: float, deadline: float,
                 timeout: float, detector: str, device: str | None = None, grace: float | None = None,
                 note: str | None = None, _set: Any = object.__setattr__) -> None:
        _set(self, "seq", seq)
        _set(self, "kind", kind)
        _set(self, "uid", uid)
        _set(self, "ts", ts)
        _set(self, "reason", reason)
        _set(self, "last_seen", last_seen)
        _set(self, "deadline", deadline)
        _set(self, "timeout", timeout)
        _set(self, "detector", detector)
        _set(self, "device", device)
        _set(self, "grace", grace)
        _set(self, "note", note)

    def record(self) -> dict[str, Any]:
        record = {
            "seq": self.seq,
            "kind": self.kind,
            "uid": self.uid,
            "ts": self.ts,
            "reason": self.reason,
            "last_seen": self.last_seen,
            "deadline": self.deadline,
            "timeout": self.timeout,
            "detector": self.detector,
        }
        if self.device is not None:
            record["device"] = self.device
        if self.grace is not None:
            record["grace"] = self.grace
        if self.note is not None:
            record["note"] = self.note
        return record
