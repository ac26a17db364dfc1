"""The presence table: who is online, through which owner, until when; emits presence events.

Theory of operation
-------------------
A *session* is one online *session key*: a plain uid (a login without device: the one session a user
had before devices) or the tuple ``(uid, device)``. It has an *owner* (the direct connection it logged in
on, or the gateway that attached it), a last-activity time and a timeout. The table owns an idle detector
(``idled.core.detector.Detector``) keyed by session key and turns its tick arithmetic into seconds:

* time comes in as ``now``: seconds on the server's pause-adjusted monotonic clock (never read here);
  event records need wall-clock times, so calls that emit events also take ``wall`` (read once by the
  caller from the server's wall clock, which never goes backwards: ``idled.core.wallclock``) and convert:
  ``wall - (now - t)``;
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
in one key-keyed map -- the detector's ``entries``, shared (``idled.core.detector``; six parallel maps used to
grow in the same login: 65-160 ms stalls at ~350k sessions). A keepalive is ``touch(key, now)``, one lookup
whatever the key, or -- a direct user's, whose connection keeps its record -- ``touch_session``, none.

*Users and their devices.* Events are about users, not sessions: a user is online while at least one of its
keys lives. Which keys each user holds is ``idled.core.devices.UserKeys`` (``_user_keys``), touched only on
login and end, never on a keepalive, and holding nothing for a user with only its plain key (today's users
cost exactly what they did); the offlines waiting out the grace are ``idled.core.grace.GraceQueue``
(``_grace_queue``). The table keeps a reference to each one's map (``_users``, ``_grace``) and only reads
it: a plain login tests both for emptiness, as it did when they were the table's own.

Rules:

* login of a key that is already online: newest wins. The session moves to the new owner, its deadline
  restarts, **no** offline/online pair is emitted, and the previous owner is returned with the key so the
  caller can tell it (``kicked``). The key becomes the user's newest.
* login of a new key for a user that already holds ``max_devices`` keys: its oldest key's session ends
  (returned with its owner like a replaced one: ``kicked``), no event -- the user stays online.
* ``online`` only when a user's first key comes, ``offline`` only when its last goes (that session's reason,
  last activity, deadline and timeout). A key that joins or leaves while another key of the user lives emits
  nothing. An event caused by a device session carries ``device``; one caused by a plain key does not, so a
  client that never sends a device produces the very records it did before devices.
* *grace* (``offline_grace`` seconds, 0: none; ``idled.core.grace``): a user whose last session ends
  ``closed`` stays online until ``end + grace``; a login of any of its keys meanwhile continues it with no
  event, else ``expire`` emits the offline then, with its ORIGINAL ``ts`` and ``grace``. ``next_due``
  accounts for the queue's front, ``end_all`` emits every pending one at once.
* logout/close is honoured only from the current owner of the key: a kicked connection closing late must not
  end the session that replaced it.
* every change gets the next ``seq``; events are returned, never sent from here. A session that ends --
  expired, ended by ``end_all`` -- is returned as ``(key, owner, event or None)``: its owner must be told
  even when the user's other keys keep it online (no event). A grace offline has no owner (its connection is
  gone): ``(uid, None, event)``.
* an owner that reports watermarks (``track_owner``: an edge) loses a session to ``idle`` only once its
  watermark has passed the session's deadline; until then the session is *held*: online, out of the
  detector, back in it at its next touch (``idled.core.watermarks``, which keys its holds by session key).
  Every question below (``is_online``, ``owner_of``, ``len``) and every change (login, logout, ``end_all``)
  sees held sessions like any other.
* ``restart_event`` stays per uid: the event log is user-level (one open ``online`` per user).

Questions: ``len(table)`` counts sessions (held ones too), ``users()`` online users (grace too); ``is_online``,
``in_grace``, ``keys_of`` (oldest first), ``devices_of``, ``last_activity`` are per uid, ``owner_of``, ``timeout_of``
per key.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from idled.core.detector import Detector, DetectorStats, Entry
from idled.core.devices import DEFAULT_MAX_DEVICES, MAX_DEVICES_LIMIT, SessionKey, Uid, UserKeys, uid_of
from idled.core.events import PresenceEvent
from idled.core.grace import MAX_OFFLINE_GRACE, GraceQueue, Pending
from idled.core.timeouts import SharedTimeouts, ticks_for, timeout_for
from idled.core.watermarks import Holds

__all__ = [
    "Uid", "SessionKey", "uid_of", "DEFAULT_MAX_DEVICES", "MAX_DEVICES_LIMIT", "MAX_OFFLINE_GRACE", "Owner",
    "PresenceEvent", "Ending", "ticks_for", "SessionEntry", "PresenceTable",
]


class Owner(Protocol):
    """Whoever a session belongs to: a user's connection, or the gateway (an edge) that attached it. The table
    only stores owners and compares them by identity; it returns them with the sessions it ends
    (``expire``, ``end_all``, a replaced or capped one from ``login``), and the caller tells them with
    ``release``."""

    def release(self, uid: SessionKey, code: str, reason: str) -> None:
        """The server ended the session of this key (``code``: the protocol's error code, e.g. ``idle_timeout``)."""


# What ``expire`` and ``end_all`` return per ended session: its key, its owner to tell (None for a grace
# offline: its connection is gone) and the user-level event (None while another key of the user lives).
Ending = tuple[SessionKey, Owner | None, PresenceEvent | None]


class SessionEntry(Entry):
    """One online session key: the detector's entry for it (activity tick, timeout in ticks, its bucket) plus the
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
        "_detector", "_sessions", "_plain_touch", "_touch_entry", "_detector_name",  # the detector and its map
        "_tick", "_timeout", "_timeout_ticks", "_max_timeout", "_next_seq",
        "_tick_low", "_tick_high", "_tick_now",  # the activity-tick cache
        "_timeouts", "_own_tick_now",  # what sessions of the same non-default timeout share
        "_ending", "_user_keys", "_users", "_grace_queue", "_grace", "holds",
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
        max_devices: int = DEFAULT_MAX_DEVICES,
        offline_grace: float = 0.0,
    ) -> None:
        if len(detector):
            raise ValueError("the presence table needs a detector of its own, empty")
        self._user_keys = UserKeys(max_devices)  # (both check their argument)
        self._grace_queue = GraceQueue(offline_grace)
        # Read-only references to their maps: a plain login tests each for emptiness (see the module doc).
        self._users = self._user_keys.users
        self._grace = self._grace_queue.pending
        self._detector = detector
        # The one key-keyed map: the detector's entries, which are this table's SessionEntry records.
        self._sessions: dict[SessionKey, SessionEntry] = detector.entries  # type: ignore[assignment]
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
        self._timeouts = SharedTimeouts(timeout)  # and _own_tick_now: 24 + 32 bytes a session would hold else
        self._own_tick_now = 0
        self._ending: list[SessionKey] = []  # end_all's snapshot of the keys still to end
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

    def _own_tick(self, now: float, seconds: float, ticks: int) -> int:
        """The activity tick of a session with its own timeout (``seconds``; ``ticks``): the last one's int if equal."""
        tick = self._due_tick(now, seconds) - ticks
        if tick != self._own_tick_now:
            self._own_tick_now = tick
        return self._own_tick_now

    # -- changes ------------------------------------------------------------------------------------------

    def login(
        self, key: SessionKey, owner: Owner, now: float, wall: float, keepalive: float | None = None
    ) -> tuple[tuple[SessionKey, Owner] | None, PresenceEvent | None]:
        """Start (or take over) the session of ``key`` (a uid, or (uid, device)). Returns (the session this
        login ended -- the same key's previous one (newest wins), or the user's oldest key past
        ``max_devices`` -- as (key, owner) for the caller to tell ``kicked``, or None; the online event or
        None)."""
        timeout = self.timeout_for(keepalive)
        session = SessionEntry(owner, now, self._timeouts.share(timeout))
        old = self._sessions.get(key)
        if old is None and self.holds.held:
            old = self.holds.take(key)
        if old is not None:
            self._file(key, session, now)
            if self._users:
                self._user_keys.renew(uid_of(key), key)  # it is the user's newest key now
            return (key, old.owner), None  # newest wins, without an offline/online flap
        if type(key) is tuple:
            uid, device = key
            plain = uid in self._sessions or uid in self.holds.held  # its plain key lives
        else:
            uid, device, plain = key, None, False
            if not self._users or uid not in self._users:  # today's login: a plain key alone (no bookkeeping)
                self._file(key, session, now)
                if self._grace and self._grace_queue.cancel(uid):
                    return None, None  # back within the grace: the user never went offline
                return None, self._event("online", uid, wall, "login", wall, timeout)
        count, oldest = self._user_keys.admit(uid, key, plain)
        replaced: tuple[SessionKey, Owner] | None = None
        if oldest is not None:  # the oldest key makes room, without an event: the user stays online
            victim = self._take(oldest)
            assert victim is not None, "a listed key has a session"
            replaced = (oldest, victim.owner)
        self._file(key, session, now)
        if count:
            return replaced, None
        if self._grace and self._grace_queue.cancel(uid):
            return replaced, None  # back within the grace: the user never went offline
        return replaced, self._event("online", uid, wall, "login", wall, timeout, device)

    def touch(self, key: SessionKey, now: float) -> None:  # activity from ``key``
        self.touch_session(self._sessions.get(key), now)

    def touch_session(self, session: SessionEntry | None, now: float) -> None:
        """Activity of a session record (``session_of``): a direct user's per-packet path, no lookup of its key (a
        cold map and key cost ~1 us a keepalive here). A record out of the detector (no ``place``: replaced, ended,
        or held -- only a gateway's is, which touches by key: ``touch_owned``) is left alone."""
        if session is not None and session.place is not None:
            session.seen = now
            # The default timeout is the table's own float object: one identity test, then the shared tick.
            if session.seconds is self._timeout:
                tick = self._activity_tick(now)
            else:
                tick = self._own_tick(now, session.seconds, session.timeout)
            if self._plain_touch:
                session.tick = tick
            else:
                self._touch_entry(session, tick)

    def _file(self, key: SessionKey, session: SessionEntry, now: float) -> None:
        """Put ``session`` (active at ``now``) in the detector, replacing whatever it held for ``key``."""
        session.seen = now
        if session.seconds is self._timeout:
            self._detector.add(key, self._activity_tick(now), None, session)
        else:
            ticks = self.ticks_for(session.seconds)
            self._detector.add(key, self._own_tick(now, session.seconds, ticks), ticks, session)

    def _take(self, key: SessionKey) -> SessionEntry | None:
        """Take ``key``'s session out of the detector (or the holds), whoever owns it."""
        session = self._sessions.get(key)
        if session is not None:
            self._detector.remove(key)
            return session
        return self.holds.take(key) if self.holds.held else None

    def touch_owned(self, key: SessionKey, owner: Owner, now: float) -> bool:
        """Activity reported by ``owner`` (a gateway) for ``key`` at ``now`` (maybe before the session's last
        activity: ``Touch.ago``; it stands); ignored unless it owns the session."""
        session = self._sessions.get(key)
        if session is None:
            held = self.holds.held.get(key)
            if held is None or held.owner is not owner:
                return False
            self.holds.take(key)
            self._file(key, held, max(now, held.seen))  # it spoke before its deadline after all
            return True
        if session.owner is not owner or now <= session.seen:  # not its own, or no later than what it has
            return session.owner is owner
        self.touch_session(session, now)
        return True

    def logout(self, key: SessionKey, owner: Owner, now: float, wall: float, reason: str) -> PresenceEvent | None:
        """End ``key``'s session if ``owner`` still owns it. The user's offline event, or None: not the owner,
        another key of the user lives, or the offline waits out the grace (reason ``closed``)."""
        session = self._sessions.get(key)
        if session is None:
            held = self.holds.held.get(key)
            if held is None or held.owner is not owner:
                return None
            self.holds.take(key)
            return self._ended(held, now, wall, reason)
        if session.owner is not owner:
            return None
        self._detector.remove(key)
        return self._ended(session, now, wall, reason)

    def _ended(self, session: SessionEntry, now: float, wall: float, reason: str) -> PresenceEvent | None:
        """A session already out of the detector has ended: the user's offline if it was its last key."""
        key = session.key
        if type(key) is tuple:
            uid, device = key
            if self._user_keys.remove(uid, key):
                return None
        else:
            uid, device = key, None
            if self._users and self._user_keys.remove(uid, key):
                return None
        last_seen = wall - (now - session.seen)
        if reason == "closed" and self._grace_queue.seconds:
            self._grace_queue.wait(uid, now, wall, last_seen, session.seconds, device)
            return None
        return self._event("offline", uid, wall, reason, last_seen, session.seconds, device)

    def _graced(self, pending: Pending) -> Ending:
        """The offline a user's grace ended in: its original time and session, and the grace; no owner."""
        return pending.uid, None, self._event("offline", pending.uid, pending.ts, "closed", pending.last_seen,
                                              pending.timeout, pending.device, self._grace_queue.seconds)

    def expire(self, now: float, wall: float, limit: int | None = None) -> list[Ending]:
        """Sessions ended now, as (key, owner, event or None): first the grace offlines that came due (no
        owner), then ``idle`` ones -- held sessions their owner's watermark has now passed, then the detector's
        due ones, except those it holds. At most ``limit`` in all (None: no limit)."""
        out = [self._graced(pending) for pending in self._grace_queue.pop_due(now, limit)]
        if out and limit is not None:
            limit -= len(out)
            if limit <= 0:
                return out
        holds = self.holds
        expired: list[SessionEntry] = holds.release(limit) if holds.ready else []
        if limit is not None:
            limit -= len(expired)
            if limit <= 0:
                out += [(session.key, session.owner, self._ended(session, now, wall, "idle")) for session in expired]
                return out
        due: list[SessionEntry] = self._detector.advance_entries(  # type: ignore[assignment]  # entries are ours
            math.floor(now / self._tick), limit
        )
        if holds.tracking:
            hold = holds.hold
            due = [session for session in due if not hold(session)]
        expired += due
        out += [(session.key, session.owner, self._ended(session, now, wall, "idle")) for session in expired]
        return out

    def end_all(self, now: float, wall: float, reason: str, limit: int | None = None) -> list[Ending]:
        """End up to ``limit`` sessions (None: all) as (key, owner, event or None): first every pending grace
        offline (original time, no owner), then live sessions, held ones last (shutdown). Call it again, with
        the time then, until it returns nothing: the caller checkpoints between two calls."""
        sessions, holds = self._sessions, self.holds
        ended = [self._graced(pending) for pending in self._grace_queue.pop_due(math.inf, limit)]
        ending = self._ending
        while limit is None or len(ended) < limit:
            if not ending:
                # A snapshot of the keys, popped from the end, not next(iter(...)) per session: iterating from
                # the front steps over every entry deleted so far (a 100k-session shutdown took 3.3 s).
                ending = self._ending = list(sessions or holds.held)
                if not ending:
                    break
            key = ending.pop()
            session: SessionEntry | None = sessions.get(key)
            if session is not None:
                self._detector.remove(key)
            elif key in holds.held:
                session = holds.take(key)
            if session is not None:  # (else it ended since the snapshot was taken)
                ended.append((key, session.owner, self._ended(session, now, wall, reason)))
        return ended

    def restart_event(self, record: dict[str, Any], wall: float) -> PresenceEvent:
        """The offline (``restart``) closing a user's session a previous run left online when it died (the log
        is user-level: one per uid, whatever keys it had)."""
        return self._event(
            "offline", record["uid"], wall, "restart", record.get("last_seen", wall), record.get("timeout", self._timeout)
        )

    def _event(self, kind: str, uid: Uid, wall: float, reason: str, last_seen: float, timeout: float,
               device: str | None = None, grace: float | None = None) -> PresenceEvent:
        seq = self._next_seq
        self._next_seq = seq + 1
        return PresenceEvent(seq, kind, uid, wall, reason, last_seen, last_seen + timeout, timeout, self._detector_name,
                             device, grace)

    # -- questions ------------------------------------------------------------------------------------

    def next_due(self) -> float | None:
        """The earliest time (server clock) at which ``expire`` could return something (-inf: now)."""
        if self.holds.ready:
            return -math.inf
        grace_due = self._grace_queue.next_due()
        due = self._detector.next_due()
        if due is None:
            return grace_due
        t = due * self._tick
        while math.floor(t / self._tick) < due:  # expire(t) must see tick `due` (see the module doc)
            t = math.nextafter(t, math.inf)
        return t if grace_due is None else min(t, grace_due)

    def work_ahead(self, limit: int) -> int:
        """The detector's optional work before the next tick (see ``Detector.work_ahead``)."""
        return self._detector.work_ahead(limit)

    def _session(self, key: SessionKey) -> SessionEntry | None:
        session = self._sessions.get(key)
        return self.holds.held.get(key) if session is None else session

    def session_of(self, key: SessionKey, owner: Owner) -> SessionEntry | None:
        """``key``'s session record if ``owner`` owns it (what ``touch_session`` takes), else None."""
        session = self._sessions.get(key)
        return session if session is not None and session.owner is owner else None

    def owner_of(self, key: SessionKey) -> Owner | None:
        """The owner of ``key``'s session (None: no such session)."""
        session = self._session(key)
        return None if session is None else session.owner

    def is_online(self, uid: Uid) -> bool:
        """Is the user online: any of its keys lives, or its offline waits out the grace?"""
        return uid in self._sessions or uid in self._users or uid in self.holds.held or uid in self._grace

    def in_grace(self, uid: Uid) -> bool:
        """Is the user online only because its offline waits out the grace?"""
        return uid in self._grace

    def grace_last_seen(self, uid: Uid) -> float | None:
        """The wall-clock ``last_seen`` of the offline a user in grace waits to get (None: not in grace)."""
        return self._grace_queue.last_seen(uid)

    def keys_of(self, uid: Uid) -> tuple[SessionKey, ...]:
        """The user's live session keys, oldest login first (empty: none; a user in grace has none)."""
        return self._user_keys.keys(uid, uid in self._sessions or uid in self.holds.held)

    def devices_of(self, uid: Uid) -> tuple[str, ...]:
        """The devices of the user's live device keys, oldest first (its plain key is not listed)."""
        return self._user_keys.devices(uid)

    def last_activity(self, uid: Uid) -> float | None:
        """The user's latest activity over its live keys (server clock), None without a live key (a user in grace
        has none: its offline-to-be holds the wall-clock ``last_seen``)."""
        latest = None
        for key in self.keys_of(uid):
            session = self._session(key)
            if session is not None and (latest is None or session.seen > latest):
                latest = session.seen
        return latest

    def timeout_of(self, key: SessionKey) -> float:
        """The timeout of ``key``'s session (the default when it has none)."""
        session = self._session(key)
        return self._timeout if session is None else session.seconds

    def users(self) -> int:
        """Online users: users with a live key, plus those whose offline waits out the grace."""
        return len(self._sessions) + len(self.holds.held) - self._user_keys.spare + len(self._grace)

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

    @property
    def max_devices(self) -> int:
        return self._user_keys.max_devices

    @property
    def offline_grace(self) -> float:
        return self._grace_queue.seconds

    def __len__(self) -> int:
        """Sessions: live keys (held ones included). ``users()`` counts users."""
        return len(self._sessions) + len(self.holds.held)

    def detector_stats(self) -> DetectorStats:
        return self._detector.stats()
