"""Offline grace: the offlines that wait ``offline_grace`` seconds for the user to come back.

Theory of operation
-------------------
When a user's last session ends ``closed`` (a connection that dropped without bye, a gateway's ``detach``
saying ``closed``) and the grace is on, the presence table (``idled.core.presence``) does not emit the offline:
it files it here (``wait``) with everything its event will need -- the original wall time, the session's last
activity, timeout and device -- due ``grace`` seconds later on the server's clock. The user stays online
meanwhile (``pending`` holds it). A login of any of its keys before then ``cancel``\\ s it: the user never went
offline, no event at all. Otherwise the table takes it back when it comes due (``pop_due``) and emits the
offline then, with the original ``ts``, reason ``closed`` and the ``grace``.

Pure, like the rest of ``core``: time is an argument, nothing is sent from here. Never used for ``idle``,
``logout``, ``kicked``, ``detach``, ``gateway_lost`` or ``shutdown``: only the table decides what waits.

The grace is one constant, so pending offlines come due in the order they were filed: a FIFO, not a heap,
beside the uid -> pending map. A cancelled one is only removed from the map; its FIFO entry is *stale* and is
dropped when it reaches the front (``front``): O(1) per offline either way. Worked by hand with a grace of 5::

    wait(a) at 1.0    pending {a}      fifo [a@6.0]
    wait(b) at 2.0    pending {a, b}   fifo [a@6.0, b@7.0]
    cancel(a) at 3.0  pending {b}      fifo [a@6.0 (stale), b@7.0]
    pop_due(6.5)      -> []            fifo [b@7.0]          (the stale front dropped; b not due)
    pop_due(7.0)      -> [b]           fifo []

A user in grace again (gone, back, gone) has a new entry; the old one is stale (the map names the new one).
So the FIFO holds at most one live entry per pending user plus the stale ones not yet reached; ``next_due``
(the front's time) lets the server's tick task sleep until the first one is due.
"""

from __future__ import annotations

from collections import deque

from idled.core.devices import Uid

__all__ = ["MAX_OFFLINE_GRACE", "Pending", "GraceQueue"]

MAX_OFFLINE_GRACE = 3600.0


class Pending:
    """A user's offline waiting out the grace: everything its event needs."""

    __slots__ = ("uid", "due", "ts", "last_seen", "timeout", "device")

    def __init__(self, uid: Uid, due: float, ts: float, last_seen: float, timeout: float, device: str | None) -> None:
        self.uid = uid
        self.due = due  # server clock
        self.ts = ts  # wall clock: when the session ended
        self.last_seen = last_seen  # wall clock
        self.timeout = timeout
        self.device = device


class GraceQueue:
    """The pending offlines of one presence table (see the module docstring)."""

    __slots__ = ("seconds", "pending", "_fifo")

    def __init__(self, seconds: float) -> None:
        if not 0.0 <= seconds <= MAX_OFFLINE_GRACE:  # (NaN fails too)
            raise ValueError(f"offline_grace must be 0..{MAX_OFFLINE_GRACE:g} seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.pending: dict[Uid, Pending] = {}  # users whose offline waits out the grace
        self._fifo: deque[Pending] = deque()  # the same, in the order they come due (may hold stale ones)

    def __len__(self) -> int:
        """Entries in the FIFO, stale ones included (``pending`` counts the users)."""
        return len(self._fifo)

    def wait(self, uid: Uid, now: float, ts: float, last_seen: float, timeout: float, device: str | None) -> None:
        """The user's last session ended ``closed`` at ``now`` (server clock), ``ts`` (wall): its offline waits."""
        pending = Pending(uid, now + self.seconds, ts, last_seen, timeout, device)
        self.pending[uid] = pending
        self._fifo.append(pending)

    def cancel(self, uid: Uid) -> bool:
        """A login of the user: True if it was in grace (then it never went offline, and no event is due)."""
        return self.pending.pop(uid, None) is not None

    def front(self) -> Pending | None:
        """The oldest offline still pending (stale ones -- users back meanwhile -- are dropped)."""
        fifo, pending = self._fifo, self.pending
        while fifo:
            first = fifo[0]
            if pending.get(first.uid) is first:
                return first
            fifo.popleft()
        return None

    def pop_due(self, now: float, limit: int | None = None) -> list[Pending]:
        """Take the pending offlines due at ``now`` (server clock; ``math.inf``: all), oldest first, at most
        ``limit`` of them (None: no limit)."""
        out: list[Pending] = []
        if not self._fifo:
            return out
        while (limit is None or len(out) < limit) and (first := self.front()) is not None and first.due <= now:
            self._fifo.popleft()
            del self.pending[first.uid]
            out.append(first)
        return out

    def next_due(self) -> float | None:
        """When the oldest pending offline comes due (server clock), None if none is pending."""
        first = self.front() if self._fifo else None
        return None if first is None else first.due

    def last_seen(self, uid: Uid) -> float | None:
        """The wall-clock ``last_seen`` of the offline a user in grace waits to get (None: not in grace)."""
        pending = self.pending.get(uid)
        return None if pending is None else pending.last_seen

