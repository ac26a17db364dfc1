"""The presence table: who is online, through which owner, until when; emits presence events.

Theory of operation
-------------------
A *session* is one online uid. It has an *owner* (the direct connection it logged in on, or the gateway
that attached it), a last-activity time and a timeout. The table owns an idle detector
(``idled.core.detector.Detector``) keyed by uid and turns its tick arithmetic into seconds:

* time comes in as ``now``: seconds on the server's pause-adjusted monotonic clock (never read here);
  event records need wall-clock times, so calls that emit events also take ``wall`` (``time.time()`` read
  once by the caller) and convert: ``wall - (now - t)``;
* the detector counts whole ticks from an activity tick; activity at ``now`` is recorded at the tick
  ``ceil((now + timeout) / tick) - ticks(timeout)``, so that activity tick + timeout ticks is exactly the
  first tick at or after the real deadline ``now + timeout`` -- also when the timeout is not a whole
  number of ticks (keepalive 1 s -> 1.5 s with a 1 s tick: activity at 0.2 is due at tick 2, where
  ``ceil(0.2) + ceil(1.5)`` would say 3); ``expire`` advances to ``floor(now / tick)``, so an offline is
  never before the deadline and at most one tick after it;
* ``next_due()`` returns a time ``t`` for which ``floor(t / tick)`` really is the due tick: ``43 * 0.1 / 0.1``
  is just below 43 in floating point, and a tick task woken at exactly ``43 * 0.1`` (a virtual clock does
  that) would otherwise find nothing due and spin.

Rules:

* login of a uid that is already online: newest wins. The session moves to the new owner, its deadline
  restarts, **no** offline/online pair is emitted, and the previous owner is returned so the caller can tell
  it (``kicked``).
* logout/close is honoured only from the current owner: a kicked connection closing late must not end the
  session that replaced it.
* every change gets the next ``seq``; events are returned, never sent from here.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from idled.core.detector import Detector, DetectorStats

Uid = Hashable


@dataclass(frozen=True, slots=True)
class PresenceEvent:
    """One presence change, as logged and as observers see it (times are wall-clock unix seconds)."""

    seq: int
    kind: str  # "online" | "offline"
    uid: Uid
    ts: float
    reason: str
    last_seen: float
    deadline: float
    timeout: float
    detector: str

    def record(self) -> dict[str, Any]:
        return {
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


def ticks_for(seconds: float, tick: float) -> int:
    """Whole ticks in a timeout, rounded up: a timeout is never shortened by the tick granularity. The
    server sizes the detector's default timeout with it, so it must match the table's own rounding."""
    return max(1, math.ceil(seconds / tick - 1e-9))


class PresenceTable:
    __slots__ = (
        "_detector",
        "_detector_name",
        "_tick",
        "_timeout",
        "_timeout_ticks",
        "_timeout_ticks_memo",
        "_max_timeout",
        "_owner",
        "_last_seen",
        "_timeouts",
        "_next_seq",
        "_tick_low",
        "_tick_high",
        "_tick_now",
    )

    def __init__(
        self,
        detector: Detector,
        *,
        tick: float,
        timeout: float,
        max_timeout: float,
        detector_name: str,
        first_seq: int = 1,
    ) -> None:
        self._detector = detector
        self._detector_name = detector_name
        self._tick = tick
        self._timeout = timeout
        self._timeout_ticks = self.ticks_for(timeout)
        self._timeout_ticks_memo: dict[float, int] = {}
        self._max_timeout = max_timeout
        self._owner: dict[Uid, Any] = {}
        self._last_seen: dict[Uid, float] = {}
        self._timeouts: dict[Uid, float] = {}  # sparse: sessions whose timeout isn't the default
        self._next_seq = first_seq
        # Cache of the current activity tick: one int object shared by every touch within a tick.
        self._tick_low = self._tick_high = math.inf
        self._tick_now = 0

    # -- rules ----------------------------------------------------------------------------------------

    def timeout_for(self, keepalive: float | None) -> float:
        """MQTT's rule: a client that promises a keepalive every k seconds is allowed 1.5 k of silence."""
        if keepalive is None:
            return self._timeout
        return min(max(1.5 * keepalive, self._tick), self._max_timeout)

    def ticks_for(self, seconds: float) -> int:
        return ticks_for(seconds, self._tick)

    def _activity_tick(self, now: float) -> int:
        """The detector's activity tick for a default-timeout session active at ``now`` (see the module doc)."""
        if self._tick_low < now <= self._tick_high:
            return self._tick_now
        due = self._due_tick(now, self._timeout)
        tick = due - self._timeout_ticks
        self._tick_now = tick
        # Activity in (low, high] is due at the same tick: one shared int for every touch in it.
        self._tick_high = due * self._tick - self._timeout
        self._tick_low = self._tick_high - self._tick
        return tick

    def _ticks_of_timeout(self, timeout: float) -> int:
        """``ticks_for`` of a session's own timeout, memoised: it is on the per-packet path of every session
        with a non-default timeout (10% of the loop at 1M gateway sessions, py-spy). Clients choose their
        keepalive, so the memo is bounded; past the bound it is computed."""
        ticks = self._timeout_ticks_memo.get(timeout)
        if ticks is None:
            ticks = self.ticks_for(timeout)
            if len(self._timeout_ticks_memo) < 1024:
                self._timeout_ticks_memo[timeout] = ticks
        return ticks

    def _due_tick(self, now: float, timeout: float) -> int:
        """The first tick at or after ``now + timeout`` (the same 1e-9 slack as ``ticks_for``)."""
        return math.ceil((now + timeout) / self._tick - 1e-9)

    def _tick_of(self, uid: Uid, now: float) -> int:
        timeouts = self._timeouts
        if timeouts and uid in timeouts:  # sparse: one truthiness test when every session has the default
            timeout = timeouts[uid]
            return self._due_tick(now, timeout) - self._ticks_of_timeout(timeout)
        return self._activity_tick(now)

    # -- changes ------------------------------------------------------------------------------------------

    def login(self, uid: Uid, owner: Any, now: float, wall: float, keepalive: float | None = None) -> tuple[Any, PresenceEvent | None]:
        """Start (or take over) ``uid``'s session. Returns (previous owner or None, online event or None)."""
        timeout = self.timeout_for(keepalive)
        previous = self._owner.get(uid)
        self._owner[uid] = owner
        self._last_seen[uid] = now
        if timeout == self._timeout:
            self._timeouts.pop(uid, None)
            self._detector.add(uid, self._activity_tick(now))
        else:
            self._timeouts[uid] = timeout
            self._detector.add(uid, self._tick_of(uid, now), self._ticks_of_timeout(timeout))
        if previous is not None:
            return previous, None  # newest wins, without an offline/online flap
        return None, self._event("online", uid, wall, "login", wall, timeout)

    def touch(self, uid: Uid, now: float) -> None:
        """Activity from ``uid``: the per-packet path, kept to two dict stores."""
        last_seen = self._last_seen
        if uid in last_seen:
            last_seen[uid] = now
            if self._timeouts and uid in self._timeouts:  # sparse: usually one truthiness test
                self._detector.touch(uid, self._tick_of(uid, now))
            else:
                self._detector.touch(uid, self._activity_tick(now))

    def touch_owned(self, uid: Uid, owner: Any, now: float) -> bool:
        """Activity reported by ``owner`` (a gateway) for ``uid``; ignored unless it owns the session."""
        if self._owner.get(uid) is not owner:
            return False
        self._last_seen[uid] = now
        self._detector.touch(uid, self._tick_of(uid, now))
        return True

    def logout(self, uid: Uid, owner: Any, now: float, wall: float, reason: str) -> PresenceEvent | None:
        """End ``uid``'s session if ``owner`` still owns it."""
        if self._owner.get(uid) is not owner:
            return None
        return self._end(uid, now, wall, reason)

    def _end(self, uid: Uid, now: float, wall: float, reason: str) -> PresenceEvent:
        del self._owner[uid]
        self._detector.remove(uid)
        return self._offline(uid, now, wall, reason)

    def _offline(self, uid: Uid, now: float, wall: float, reason: str) -> PresenceEvent:
        """The offline event of a session already out of the owner map and the detector."""
        last_seen = wall - (now - self._last_seen.pop(uid))
        timeout = self._timeouts.pop(uid, self._timeout)
        return self._event("offline", uid, wall, reason, last_seen, timeout)

    def expire(self, now: float, wall: float, limit: int | None = None) -> list[tuple[PresenceEvent, Any]]:
        """Offline events (reason ``idle``) for sessions whose deadline passed, with their owners."""
        expired = self._detector.advance(math.floor(now / self._tick), limit)
        return [(self._offline(uid, now, wall, "idle"), self._owner.pop(uid)) for uid in expired]

    def end_all(self, now: float, wall: float, reason: str) -> Iterator[tuple[PresenceEvent, Any]]:
        """End every session (shutdown), yielding as it goes so the caller can checkpoint."""
        while self._owner:
            # popitem, not next(iter(...)): iterating from the front steps over every entry deleted so far,
            # which made a 100k-session shutdown take 3.3 s (quadratic).
            uid, owner = self._owner.popitem()
            self._detector.remove(uid)
            yield self._offline(uid, now, wall, reason), owner

    def restart_event(self, record: dict[str, Any], wall: float) -> PresenceEvent:
        """The offline (``restart``) closing a session a previous run left online when it died."""
        return self._event(
            "offline", record["uid"], wall, "restart", record.get("last_seen", wall), record.get("timeout", self._timeout)
        )

    def _event(self, kind: str, uid: Uid, wall: float, reason: str, last_seen: float, timeout: float) -> PresenceEvent:
        seq = self._next_seq
        self._next_seq = seq + 1
        return PresenceEvent(seq, kind, uid, wall, reason, last_seen, last_seen + timeout, timeout, self._detector_name)

    # -- questions ------------------------------------------------------------------------------------

    def next_due(self) -> float | None:
        """The earliest time (server clock) at which ``expire`` could return something."""
        due = self._detector.next_due()
        if due is None:
            return None
        t = due * self._tick
        while math.floor(t / self._tick) < due:  # expire(t) must see tick `due` (see the module doc)
            t = math.nextafter(t, math.inf)
        return t

    def work_ahead(self, limit: int) -> int:
        """The detector's optional work before the next tick (see ``Detector.work_ahead``)."""
        return self._detector.work_ahead(limit)

    def owner_of(self, uid: Uid) -> Any:
        return self._owner.get(uid)

    def is_online(self, uid: Uid) -> bool:
        return uid in self._owner

    def timeout_of(self, uid: Uid) -> float:
        return self._timeouts.get(uid, self._timeout)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def __len__(self) -> int:
        return len(self._owner)

    def detector_stats(self) -> DetectorStats:
        return self._detector.stats()
