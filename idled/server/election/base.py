"""The election interface the server programs against, its status notices, and `NoElection`.

Theory of operation
-------------------
An `Election` answers one question the server asks before every leader-only act -- ``is_leader(now)`` --
from local state alone: no request, no await, so it can sit on the write path. Leadership is *fenced by
lease* (``idled.server.election.lease``): true only before a deadline computed from the start of the last
successful renewal, so a process that was frozen, or cut off from etcd, stops claiming leadership by
itself, on time, whatever its tasks were doing.

``run`` is the one long-lived task: campaign, hold, step down, campaign again, until ``resign`` (or
cancellation, which resigns). It publishes every change as a `Status` on a `StatusBoard`: a latest-value
cell, not a queue -- a slow reader skips intermediate states and sees the newest, so there is nothing to
bound and nothing to drop. ``await board.next(seen)`` returns the first status newer than version
``seen``. A status says what ``run`` concluded; ``is_leader(now)`` may turn false before ``run`` has
published it (the deadline passes between two looks), never the other way round.

``publish_seq``/``last_seq`` keep the last written event seq where the next leader reads it: a write is
conditioned on still holding the leader key, so a deposed leader's write fails (``fenced``).

`NoElection` is today's single core: always the leader, the seq kept by nobody (the local log is the
only record).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import trio

from idled.server.election.errors import NOT_LEADER, NotLeader

__all__ = ["Election", "NoElection", "Status", "StatusBoard"]


@dataclass(frozen=True, slots=True)
class Status:
    """What the election's task concluded last. ``version`` counts changes from 0 (the initial state).
    ``leader``: this process holds leadership (until its deadline: ask ``is_leader(now)``); ``address``:
    the current leader's advertised address, ours when leading, None when unknown; ``term``: the leader
    key's create revision while we lead (0 otherwise); ``reason``: why, for the log."""

    version: int
    leader: bool
    address: str | None
    term: int
    reason: str


class StatusBoard:
    """A latest-value cell of `Status` with a wait for a newer one."""

    def __init__(self, initial: Status) -> None:
        self._status = initial
        self._changed = trio.Event()

    @property
    def current(self) -> Status:
        return self._status

    def set(self, *, leader: bool, address: str | None, term: int, reason: str) -> Status:
        """Publish a status if anything but the reason differs from the current one; returns the current."""
        old = self._status
        if (old.leader, old.address, old.term) == (leader, address, term):
            return old
        self._status = Status(old.version + 1, leader, address, term, reason)
        self._changed.set()
        self._changed = trio.Event()
        return self._status

    async def next(self, seen: int) -> Status:
        """The current status once its version is greater than ``seen``."""
        while self._status.version <= seen:
            await self._changed.wait()
        return self._status


class Election(Protocol):
    """What the server needs of leader election (see the module docstring)."""

    @property
    def status(self) -> StatusBoard: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Campaign and hold until ``resign``; ``started()`` once the first attempt can begin."""

    def is_leader(self, now: float) -> bool:
        """True only while we hold the leader key and ``now`` (the election's clock) is before the deadline."""

    def leader(self) -> str | None:
        """The current leader's advertised address (ours when leading), None when unknown."""

    async def publish_seq(self, seq: int, *, lower: bool = False) -> None:
        """Record ``seq`` as the last written, if we still lead: `NotLeader` otherwise (``not_leader``: the
        local lease check; ``fenced``: etcd refused), `EtcdUnavailable` when etcd did not answer in time.
        A seq below the last published is refused (ValueError) unless ``lower``: a clean stop, every seq up
        to ``seq`` durable, hands the next leader the seqs it had reserved beyond."""

    async def last_seq(self) -> int:
        """The last seq a leader published (0: none yet)."""

    async def resign(self) -> None:
        """Stop leading (if we do) and stop campaigning: another candidate takes over at once."""


class NoElection:
    """No election (``--election`` not given): one core, always the leader, until it resigns."""

    def __init__(self, address: str | None = None) -> None:
        self._address = address
        self._resigned = False
        self._seq = 0
        self._status = StatusBoard(Status(0, True, address, 1, "no election: the only core"))
        self._stop = trio.Event()

    @property
    def status(self) -> StatusBoard:
        return self._status

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self._stop.wait()

    def is_leader(self, now: float) -> bool:
        return not self._resigned

    def leader(self) -> str | None:
        return None if self._resigned else self._address

    async def publish_seq(self, seq: int, *, lower: bool = False) -> None:
        await trio.lowlevel.checkpoint()
        if self._resigned:
            raise NotLeader(NOT_LEADER, "resigned")
        if seq < self._seq and not lower:
            raise ValueError(f"seq {seq} is below the last published {self._seq}")
        self._seq = seq

    async def last_seq(self) -> int:
        await trio.lowlevel.checkpoint()
        return self._seq

    async def resign(self) -> None:
        await trio.lowlevel.checkpoint()
        self._resigned = True
        self._status.set(leader=False, address=None, term=0, reason="resigned")
        self._stop.set()
