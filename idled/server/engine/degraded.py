"""Degraded mode: the server runs, but cannot take new work, because something it must write cannot be written.

Theory of operation
-------------------
A full disk (ENOSPC, or a quota: EDQUOT) does not end the daemon. The parts that write -- the event log's
writer (``idled.log.writer``: it holds the events it cannot write and retries every second), the seq
reservation (``idled.server.engine.seqs``: it issues no seq it has not reserved durably, and retries), the closing of
the sessions a previous run left online (which waits for both) -- each ``set(source, reason)`` when they
cannot go on and ``clear(source)`` when they can again. While any reason stands the server is *degraded*:

* new work is refused with ``unavailable`` ("retry later"; clients treat it like ``busy``): user logins and
  gateway attaches that would bring a user online (``refuse``, in ``Sessions.refuse_if_unavailable``; for a
  gateway an ``ended`` notice with reason ``unavailable`` per session key, ``idled.server.roles.gateways``), API kicks;
* a login or attach of a user online already is taken: another connection of the same session key (a phone
  that changed networks), another device, a user within its offline grace. It adds no event -- newest wins
  without a flap, events are per user, the grace is continued -- and refusing it would turn into a false
  offline once the old connection closes (``idled.server.engine.sessions``, *A login that adds nothing*);
* what is online stays online: keepalives, gateway touches, observers go on; expiries and logouts still
  happen and their events wait in memory, in seq order, bounded (``EventBus.max_backlog``: then the tick task
  waits, which makes expiries late, never early, and a logout is left to its deadline);
* ``/readyz`` answers 503 with the reason, ``/status`` says it (``degraded``, ``events_held``), and the
  metrics ``idled_eventlog_degraded`` and ``idled_eventlog_held_events`` show it.

Since no user comes online while degraded, the events held are bounded by the users online when the disk
filled: one offline each. A login taken meanwhile does not change that: it adds no event now, and its user
stays one user online, with at most the one offline it would have had anyway.

One WARNING line when the server becomes degraded, one when it recovers (never one per retry); ``reason`` joins
the standing reasons, oldest first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from idled.log.errors import DiskFull
from idled.log.writer import Held
from idled.protocol import ErrorCode, ProtocolError
from idled.server.engine.bus import EventBus

__all__ = ["Degraded", "LogHold"]

log = logging.getLogger("idled.server.engine.degraded")


class Degraded:
    """The standing reasons, by source (see the module docstring). ``clock``: seconds, for the duration logged."""

    __slots__ = ("reasons", "since", "clock")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.reasons: dict[str, str] = {}
        self.since: float | None = None  # when the current episode began
        self.clock = clock

    @property
    def reason(self) -> str | None:
        """Why new work is refused now (None: it is not)."""
        return "; ".join(self.reasons.values()) if self.reasons else None

    def set(self, source: str, reason: str) -> None:
        if not self.reasons:
            self.since = self.clock()
            log.warning("degraded: %s; logins and attaches of users not online, and kicks, are refused "
                        "(unavailable) until it clears; sessions online are kept, their events held in memory",
                        reason)
        self.reasons[source] = reason

    def clear(self, source: str) -> None:
        if self.reasons.pop(source, None) is not None and not self.reasons:
            took = self.clock() - self.since if self.since is not None else 0.0
            self.since = None
            log.warning("no longer degraded after %.1f s: new work is taken again", took)

    def refuse(self) -> None:
        """Raise ``ProtocolError(UNAVAILABLE)`` while degraded."""
        if self.reasons:
            raise ProtocolError(ErrorCode.UNAVAILABLE, f"the server cannot take new work now ({self.reason}); retry later")


class LogHold:
    """The event log's side of it: the writer's ``on_degraded`` and ``held`` (``idled.log.writer``), and what
    the server reports of them -- ``/status``'s part, the metrics snapshot's, ``/readyz``'s reason."""

    __slots__ = ("degraded", "bus", "held")

    SOURCE = "log"

    def __init__(self, degraded: Degraded, bus: EventBus) -> None:
        self.degraded = degraded
        self.bus = bus
        self.held = Held()

    def on_degraded(self, exc: DiskFull | None) -> None:
        """The writer's report: the disk filled (``exc``) or the events it held are written (None)."""
        self.bus.log_stalled = exc is not None  # nothing waits for the writer to catch up meanwhile
        if exc is None:
            self.degraded.clear(self.SOURCE)
        else:
            cause = exc.__cause__
            self.degraded.set(self.SOURCE, f"event log: {getattr(cause, 'strerror', None) or exc.reason}")

    def events(self) -> int:
        """Events not written yet: the writer's held batch and what waits in the channel."""
        return self.held.events + self.bus.backlog()

    def status(self) -> dict[str, Any]:
        return {"degraded": self.degraded.reason, "events_held": self.events()}

    def snapshot(self) -> dict[str, Any]:
        return {"eventlog_degraded": int(bool(self.degraded.reasons)), "eventlog_held_events": self.events()}

    def abandoned(self) -> None:
        """The writer ended (fatal, or cancelled at the end of a shutdown's grace): say what it never wrote."""
        if held := self.events():
            log.error("event log: %d events were never written (%s): the next start closes their sessions", held,
                      self.held.reason or "the writer stopped")

    def readiness(self) -> str | None:
        """/readyz's reason while degraded (None: not degraded)."""
        reason = self.degraded.reason
        if reason is None:
            return None
        return (f"degraded: {reason}; {self.events()} events held in memory; logins of users not online "
                "refused (unavailable) until it clears")
