"""An elected core's fence: it stops, writing nothing more, the moment it is no longer the leader.

Theory of operation
-------------------
Under ``--election`` (``idled.server.node``) a `Server` runs only while this process holds the leader lease.
Leadership can end at any moment -- the lease deadline passes (etcd unreachable, the process was frozen),
etcd says the key is no longer ours, a seq write is refused -- and the server must then stop *before* its
next write, not once some task notices. Two looks make that so:

* ``check()`` sits in front of every log write (the writer's ``before_write``): a batch is written only
  while ``Election.is_leader(now)`` holds, which is a clock comparison against the lease deadline (no
  request). So nothing reaches the log -- nor, through it, a standby or a durable observer -- once the
  deadline has passed, even in a process that has just woken from SIGSTOP.
* ``watch()`` follows the election's status board and raises as soon as the election task concludes we
  are not the leader, so the server stops at once even when nothing is being written.

Both raise `SteppedDown`, which ends the server's nursery: connections are dropped without goodbye frames
(users reconnect, edges re-attach elsewhere) and no ``shutdown`` offline is written -- the new leader
writes the honest record (``restart`` offlines for what it finds open, then what the edges re-attach).
Events published to fast (non-durable) observers between the deadline and the stop are never written;
their seqs lie in the block this leader reserved in etcd, which the next leader skips.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from idled.server.election import Election, NotLeader

__all__ = ["Fence", "SteppedDown"]


class SteppedDown(Exception):
    """This core is no longer the leader; ``args[0]`` says why."""


class Fence:
    def __init__(self, election: Election, clock: Callable[[], float] = time.monotonic) -> None:
        self.election = election
        self.clock = clock  # the election's clock (EtcdElection's default: time.monotonic)

    def check(self) -> None:
        """Raise `SteppedDown` unless we lead right now."""
        if not self.election.is_leader(self.clock()):
            raise SteppedDown("the leader lease has ended")

    async def watch(self) -> None:
        """Return never; raise `SteppedDown` once the election says we are not the leader."""
        board = self.election.status
        status = board.current
        while status.leader:
            status = await board.next(status.version)
        raise SteppedDown(status.reason)

    def deadline_in(self) -> float | None:
        """Seconds left on the lease (None: unknown or not leading), for /status."""
        deadline = getattr(self.election, "deadline", None)
        return None if deadline is None else round(deadline - self.clock(), 3)


def stepped_down(exc: BaseException) -> SteppedDown | None:
    """The `SteppedDown` inside ``exc`` (itself, or a leaf of a nursery's exception group), if any; a seq
    write etcd refused (`NotLeader`) counts as one."""
    if isinstance(exc, SteppedDown):
        return exc
    if isinstance(exc, NotLeader):
        return SteppedDown(f"etcd refused a write: {exc}")
    if isinstance(exc, BaseExceptionGroup):
        for leaf in exc.exceptions:
            if (found := stepped_down(leaf)) is not None:
                return found
    return None

