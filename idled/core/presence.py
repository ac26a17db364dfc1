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

Storage: one record per session (``SessionEntry``: owner, last activity, timeout, and the detector's own fields),
in one uid-keyed map -- the detector's ``entries``, shared (see ``idled.core.detector``). Six parallel maps
(owner, last seen, timeouts here; bucket, last seen, timeouts in the wheel) used to grow in the same login,
each copying itself: 65-160 ms event-loop stalls at ~350k and ~700k sessions.

Rules:

* login of a uid that is already online: newest wins. The session moves to the new owner, its deadline
  restarts, **no** offline/online pair is emitted, and the previous owner is returned so the caller can tell
  it (``kicked``).
* logout/close is honoured only from the current owner: a kicked connection closing late must not end the
  session that replaced it.
* every change gets the next ``seq``; events are returned, never sent from here.
* an owner that reports watermarks (``track_owner``: an edge) loses a session to ``idle`` only once its
  watermark has passed the session's deadline; until then the session is *held*: online, out of the
  detector, back in it at its next touch (``idled.core.watermarks``). Every question below (``is_online``,
  ``owner_of``, ``len``) and every change (login, logout, ``end_all``) sees held sessions like any other.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from idled.core.detector import Detector, DetectorStats, Entry
from idled.core.timeouts import timeout_for
from idled.core.watermarks import Holds

Uid = Hashable


class Owner(Protocol):
    """Whoever a session belongs to: a user's connection, or the gateway (an edge) that attached it. The table
    only stores owners and compares them by identity; it returns them with the events that end their sessions
    (``expire``, ``end_all``) and a replaced one from ``login``, and the caller tells them with ``release``."""

    def release(self, uid: Uid, code: str, reason: str) -> None:
        """The server ended ``uid``'s session (``code``: the protocol's error code, e.g. ``idle_timeout``)."""


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


class SessionEntry(Entry):
    """One online uid: the detector's entry for it (activity tick, timeout in ticks, its bucket) plus the
    table's own fields, in one record under one map (see ``idled.core.detector``)."""

    __slots__ = ("owner", "seen", "seconds")

    owner: Owner
    seen: float  # last activity, server clock
    seconds: float  # the timeout; the table's default float object itself when it is the default

    def __init__(self, owner: Owner, seen: float, seconds: float) -> None:
        self.owner = owner
        self.seen = seen
        self.seconds = seconds


class PresenceTable:
    __slots__ = (
        "_detector",
        "_sessions",
        "_plain_touch",
        "_touch_entry",
        "_detector_name",
        "_tick",
        "_timeout",
        "_timeout_ticks",
        "_max_timeout",
        "_next_seq",
        "_tick_low",
        "_tick_high",
        "_tick_now",
        "_ending",
        "holds",
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
        if len(detector):
            raise ValueError("the presence table needs a detector of its own, empty")
        self._detector = detector
        # The one uid-keyed map: the detector's entries, which are this table's SessionEntry records.
        self._sessions: dict[Uid, SessionEntry] = detector.entries  # type: ignore[assignment]
        self._plain_touch = detector.plain_touch
        self._touch_entry = detector.touch_entry
        self._detector_name = detector_name
        self._tick = tick
        self._timeout = timeout
        self._timeout_ticks = self.ticks_for(timeout)
        self._max_timeout = max_timeout
        self._next_seq = first_seq
        # Cache of the current activity tick: one int object shared by every touch within a tick.
        self._tick_low = self._tick_high = math.inf
        self._tick_now = 0
        self._ending: list[Uid] = []  # end_all's snapshot of the uids still to end
        # Sessions due while their owner's watermark lagged (see idled.core.watermarks).
        self.holds: Holds[SessionEntry] = Holds()

    # -- rules ----------------------------------------------------------------------------------------

    def timeout_for(self, keepalive: float | None) -> float:
        """The timeout rule (``idled.core.timeouts``) with this table's default, tick and cap."""
        return timeout_for(keepalive, self._timeout, self._tick, self._max_timeout)

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

    def _due_tick(self, now: float, timeout: float) -> int:
        """The first tick at or after ``now + timeout`` (the same 1e-9 slack as ``ticks_for``)."""
        return math.ceil((now + timeout) / self._tick - 1e-9)

    def _own_tick(self, session: SessionEntry, now: float) -> int:
        """The activity tick of a session whose timeout is not the default."""
        return self._due_tick(now, session.seconds) - session.timeout

    # -- changes ------------------------------------------------------------------------------------------

    def login(
        self, uid: Uid, owner: Owner, now: float, wall: float, keepalive: float | None = None
    ) -> tuple[Owner | None, PresenceEvent | None]:
        """Start (or take over) ``uid``'s session. Returns (previous owner or None, online event or None)."""
        timeout = self.timeout_for(keepalive)
        old = self._sessions.get(uid)
        if old is None and self.holds.held:
            old = self.holds.take(uid)
        session = SessionEntry(owner, now, self._timeout if timeout == self._timeout else timeout)
        self._file(uid, session, now)
        if old is not None:
            return old.owner, None  # newest wins, without an offline/online flap
        return None, self._event("online", uid, wall, "login", wall, timeout)

    def touch(self, uid: Uid, now: float) -> None:
        """Activity from ``uid``: the per-packet path, one dict lookup and two stores."""
        session = self._sessions.get(uid)
        if session is not None:
            session.seen = now
            # The default timeout is the table's own float object: one identity test, then the shared tick.
            if session.seconds is self._timeout:
                tick = self._activity_tick(now)
            else:
                tick = self._own_tick(session, now)
            if self._plain_touch:
                session.tick = tick
            else:
                self._touch_entry(session, tick)

    def _file(self, uid: Uid, session: SessionEntry, now: float) -> None:
        """Put ``session`` (active at ``now``) in the detector, replacing whatever it held for ``uid``."""
        session.seen = now
        if session.seconds is self._timeout:
            self._detector.add(uid, self._activity_tick(now), None, session)
        else:
            ticks = self.ticks_for(session.seconds)
            self._detector.add(uid, self._due_tick(now, session.seconds) - ticks, ticks, session)

    def touch_owned(self, uid: Uid, owner: Owner, now: float) -> bool:
        """Activity reported by ``owner`` (a gateway) for ``uid``; ignored unless it owns the session."""
        session = self._sessions.get(uid)
        if session is None:
            held = self.holds.held.get(uid)
            if held is None or held.owner is not owner:
                return False
            self.holds.take(uid)
            self._file(uid, held, now)  # it spoke before its deadline after all
            return True
        if session.owner is not owner:
            return False
        session.seen = now
        tick = self._activity_tick(now) if session.seconds is self._timeout else self._own_tick(session, now)
        if self._plain_touch:
            session.tick = tick
        else:
            self._touch_entry(session, tick)
        return True

    def logout(self, uid: Uid, owner: Owner, now: float, wall: float, reason: str) -> PresenceEvent | None:
        """End ``uid``'s session if ``owner`` still owns it."""
        session = self._sessions.get(uid)
        if session is None:
            held = self.holds.held.get(uid)
            if held is None or held.owner is not owner:
                return None
            self.holds.take(uid)
            return self._offline(held, now, wall, reason)
        if session.owner is not owner:
            return None
        self._detector.remove(uid)
        return self._offline(session, now, wall, reason)

    def _offline(self, session: SessionEntry, now: float, wall: float, reason: str) -> PresenceEvent:
        """The offline event of a session already out of the detector."""
        last_seen = wall - (now - session.seen)
        return self._event("offline", session.key, wall, reason, last_seen, session.seconds)

    def expire(self, now: float, wall: float, limit: int | None = None) -> list[tuple[PresenceEvent, Owner]]:
        """Offline events (reason ``idle``) for sessions whose deadline passed, with their owners: held sessions
        their owner's watermark has now passed, then the detector's due ones -- except those it holds."""
        holds = self.holds
        expired: list[SessionEntry] = holds.release(limit) if holds.ready else []
        if limit is not None:
            limit -= len(expired)
            if limit <= 0:
                return [(self._offline(session, now, wall, "idle"), session.owner) for session in expired]
        due: list[SessionEntry] = self._detector.advance_entries(  # type: ignore[assignment]  # entries are ours
            math.floor(now / self._tick), limit
        )
        if holds.tracking:
            hold = holds.hold
            due = [session for session in due if not hold(session)]
        expired += due
        return [(self._offline(session, now, wall, "idle"), session.owner) for session in expired]

    def end_all(
        self, now: float, wall: float, reason: str, limit: int | None = None
    ) -> list[tuple[PresenceEvent, Owner]]:
        """End up to ``limit`` sessions (None: all), held ones last, with their owners (shutdown). Call it
        again, with the time then, until it returns nothing: the caller checkpoints between two calls."""
        sessions, holds, ending = self._sessions, self.holds, self._ending
        ended: list[tuple[PresenceEvent, Owner]] = []
        while limit is None or len(ended) < limit:
            if not ending:
                # A snapshot of the uids, popped from the end, not next(iter(...)) per session: iterating from
                # the front steps over every entry deleted so far (a 100k-session shutdown took 3.3 s).
                ending = self._ending = list(sessions or holds.held)
                if not ending:
                    break
            uid = ending.pop()
            session: SessionEntry | None = sessions.get(uid)
            if session is not None:
                self._detector.remove(uid)
            elif uid in holds.held:
                session = holds.take(uid)
            if session is not None:  # (else it ended since the snapshot was taken)
                ended.append((self._offline(session, now, wall, reason), session.owner))
        return ended

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
        """The earliest time (server clock) at which ``expire`` could return something (-inf: now)."""
        if self.holds.ready:
            return -math.inf
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

    def _session(self, uid: Uid) -> SessionEntry | None:
        session = self._sessions.get(uid)
        return self.holds.held.get(uid) if session is None else session

    def owner_of(self, uid: Uid) -> Owner | None:
        session = self._session(uid)
        return None if session is None else session.owner

    def is_online(self, uid: Uid) -> bool:
        return uid in self._sessions or uid in self.holds.held

    def seen_of(self, uid: Uid) -> float | None:
        """Last activity of ``uid``'s session (server clock), None if it has none."""
        session = self._session(uid)
        return None if session is None else session.seen

    def timeout_of(self, uid: Uid) -> float:
        session = self._session(uid)
        return self._timeout if session is None else session.seconds

    # -- owners that report watermarks (idled.core.watermarks) -------------------------------------------------

    def track_owner(self, owner: Owner, now: float) -> None:
        """``owner`` (a gateway that answers marks, owning no session yet) will report watermarks: hold its
        sessions until they pass."""
        self.holds.track(owner, now)

    def untrack_owner(self, owner: Owner) -> None:
        self.holds.untrack(owner)

    def mark(self, owner: Owner, t: float) -> bool:
        """``owner`` has forwarded its users' activity up to ``t``; True if held sessions are due now."""
        return self.holds.mark(owner, t)

    @property
    def tick(self) -> float:
        return self._tick

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def __len__(self) -> int:
        return len(self._sessions) + len(self.holds.held)

    def detector_stats(self) -> DetectorStats:
        return self._detector.stats()
