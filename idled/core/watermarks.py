"""Owner watermarks: a session whose owner has not yet reported its activity up to the deadline is held.

Theory of operation
-------------------
A gateway (an edge) reads its users' keepalives, then reports them to the server in batches. Between the
user's socket and the presence table a keepalive can wait in the gateway's event loop, its batch, the link
and the server's socket buffer: if any of them lags -- a busy loop, a GC walk, a SIGSTOP -- the server would
see silence where the user was talking, and an ``idle`` offline there is a lie.

So an owner that opts in reports a *watermark*: the server sends it ``mark(t)`` (``t`` on the server's own
clock), and the owner answers ``marked(t)`` once everything its users sent before the request reached it
has been forwarded, in order, ahead of the answer. When the server reads the answer, every such activity has
been applied: the owner's watermark is ``t``. No clocks are compared across processes; ``t`` only travels
there and back.

The rule: **a session owned by a tracked owner expires only once the owner's watermark has reached its
deadline** (last activity + timeout). The detector still finds the session due at the first tick at or
after its deadline; ``hold`` then decides. A session due while the watermark lags is *held*: kept online
(``held``, uid -> session) and queued per owner in the order it came due. A touch that arrives meanwhile
(``take``) makes it a live session again; ``mark`` raising the watermark past a held deadline makes the
owner *ready*, and ``release`` returns the held sessions whose deadline it passed: those really were silent.
An owner that lags -- or is stopped -- for any length of time thus delays its own sessions' offlines by that
long, and never causes one; other owners' sessions are not affected. Owners that do not track marks (direct
connections, gateways that did not opt in) are never held here: the server stamps their activity when it
reads it (less a gateway touch's ``ago``: ``idled.server.roles.gateways``, *Touch ages*).

``wanted`` records, per owner, the latest deadline a held session is waiting on: the server asks that owner
for a mark now instead of at its next periodic one, so a held session costs one round trip, not a period.

Bounds: a session is in ``held`` at most once; the per-owner queues may also hold stale entries (a session
taken back by a touch, a login or a logout, or held again with a later deadline), dropped when they reach
the front, and a queue is compacted when stale entries outnumber live ones, so its length stays within
twice the owner's held sessions plus a constant.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Holdable", "Holds"]

COMPACT_SLACK = 64  # stale entries tolerated in a queue beyond its live ones before it is compacted


class Holdable(Protocol):
    """What a held session must carry (``idled.core.presence.SessionEntry``)."""

    key: Hashable
    owner: Any
    seen: float
    seconds: float


H = TypeVar("H", bound=Holdable)  # the holder's session record, handed back as it was given


class _Owner(Generic[H]):
    """A tracked owner: its watermark, its held sessions in the order they came due, and how many are live."""

    __slots__ = ("watermark", "queue", "count")

    def __init__(self, since: float) -> None:
        # Nothing reported yet: the time it began to be tracked, before any session it can own was attached
        # (so every one is held when due until the first answer), and from which its lag is measured.
        self.watermark = since
        # (deadline, session) in the order they came due; an entry is live while the session is held with that
        # very deadline (a session touched, then held again, has a later one: its old entry is stale)
        self.queue: deque[tuple[float, H]] = deque()
        self.count = 0


class Holds(Generic[H]):
    """Held sessions and the tracked owners' watermarks (see the module docstring). ``H``: the session record
    the caller holds (``idled.core.presence.SessionEntry``), returned by ``take`` and ``release`` as it was held."""

    __slots__ = ("held", "_owners", "_ready", "_wanted")

    def __init__(self) -> None:
        self.held: dict[Hashable, H] = {}
        self._owners: dict[Any, _Owner[H]] = {}
        self._ready: dict[Any, None] = {}  # owners whose oldest held session may be past their watermark
        self._wanted: dict[Any, float] = {}  # owner -> latest deadline a held session waits on

    # -- owners ----------------------------------------------------------------------------------------------

    def track(self, owner: Any, since: float) -> None:
        """``owner`` reports watermarks from ``since`` on (it owns no session yet): until its first one, each
        of its sessions due is held."""
        self._owners.setdefault(owner, _Owner(since))

    def untrack(self, owner: Any) -> None:
        """``owner`` is gone: its sessions are ended by the caller (held ones included: ``take`` them)."""
        self._owners.pop(owner, None)
        self._ready.pop(owner, None)
        self._wanted.pop(owner, None)

    def tracks(self, owner: Any) -> bool:
        return owner in self._owners

    def watermark(self, owner: Any) -> float | None:
        """The owner's watermark (server clock), None if it is not tracked."""
        state = self._owners.get(owner)
        return None if state is None else state.watermark

    def mark(self, owner: Any, t: float) -> bool:
        """``owner`` has forwarded everything up to ``t``. True if a held session may now be released."""
        state = self._owners.get(owner)
        if state is None or t <= state.watermark:
            return False
        state.watermark = t
        front = self._front(state)
        if front is not None and front <= t:
            self._ready[owner] = None
            return True
        return False

    @property
    def tracking(self) -> bool:
        """Some owner reports watermarks (else ``hold`` never holds: the per-tick path skips it)."""
        return bool(self._owners)

    @property
    def ready(self) -> bool:
        """Some held session can be released now (``release``)."""
        return bool(self._ready)

    def lagging(self, now: float) -> list[tuple[Any, float, int]]:
        """(owner, seconds its watermark is behind ``now``, held sessions) for every tracked owner."""
        return [(owner, now - state.watermark, state.count) for owner, state in self._owners.items()]

    def take_wanted(self) -> dict[Any, float]:
        """Owners a held session waits on, each with the latest deadline waited on; cleared."""
        wanted, self._wanted = self._wanted, {}
        return wanted

    # -- sessions --------------------------------------------------------------------------------------------

    def hold(self, session: H) -> bool:
        """The detector found ``session`` due: hold it if its owner's watermark has not reached its deadline.
        Returns whether it was held (else it really expired)."""
        state = self._owners.get(session.owner)
        deadline = session.seen + session.seconds
        if state is None or state.watermark >= deadline:
            return False
        self.held[session.key] = session
        state.queue.append((deadline, session))
        state.count += 1
        if len(state.queue) > 2 * state.count + COMPACT_SLACK:
            state.queue = deque(entry for entry in state.queue if self._live(entry))
        if self._wanted.get(session.owner, -math.inf) < deadline:
            self._wanted[session.owner] = deadline
        return True

    def take(self, key: Hashable) -> H | None:
        """Stop holding ``key`` (touched again, logged in elsewhere, logged out, ended): its session, or None."""
        session = self.held.pop(key, None)
        if session is not None:
            state = self._owners.get(session.owner)
            if state is not None:
                state.count -= 1
        return session

    def release(self, limit: int | None = None) -> list[H]:
        """Held sessions whose owner's watermark has passed their deadline (at most ``limit``): expired."""
        out: list[H] = []
        held = self.held
        for owner in list(self._ready):
            state = self._owners.get(owner)
            if state is None:
                del self._ready[owner]
                continue
            queue, watermark = state.queue, state.watermark
            while (deadline := self._front(state)) is not None and deadline <= watermark:
                session = queue.popleft()[1]
                del held[session.key]
                state.count -= 1
                out.append(session)
                if limit is not None and len(out) >= limit:
                    return out  # the owner stays ready: the caller comes back for the rest
            del self._ready[owner]
        return out

    def _live(self, entry: tuple[float, H]) -> bool:
        deadline, session = entry
        return self.held.get(session.key) is session and session.seen + session.seconds == deadline

    def _front(self, state: _Owner[H]) -> float | None:
        """The deadline of an owner's oldest live held session (dropping stale entries on the way)."""
        queue = state.queue
        while queue:
            if self._live(queue[0]):
                return queue[0][0]
            queue.popleft()
        return None

    def __len__(self) -> int:
        return len(self.held)
