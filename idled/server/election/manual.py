"""`ManualElection`: a standby promoted by hand (``idled promote``), with no election behind it.

``idled serve --standby-of HOST:PORT`` follows the active core until an operator promotes it (SIGUSR1, which
``idled promote`` sends): from then on it leads, for good. Nothing stops the old active from writing too:
promote only a standby whose active is dead or fenced off (docs/ha.md, the runbook) -- that is the whole
point of ``--election``. There is no shared seq mark: the promoted core continues after the last record it
holds (``last_seq`` is 0).
"""

from __future__ import annotations

import trio

from idled.server.election.base import Status, StatusBoard
from idled.server.election.errors import NOT_LEADER, NotLeader

__all__ = ["ManualElection"]


class ManualElection:
    def __init__(self, active: str) -> None:
        self._leading = False
        self._status = StatusBoard(Status(0, False, active, 0, f"standby of {active}"))
        self._stop = trio.Event()

    @property
    def status(self) -> StatusBoard:
        return self._status

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self._stop.wait()

    def promote(self) -> bool:
        """Lead from now on; False if we already did."""
        if self._leading:
            return False
        self._leading = True
        self._status.set(leader=True, address=None, term=1, reason="promoted by hand")
        return True

    def is_leader(self, now: float) -> bool:
        return self._leading

    def leader(self) -> str | None:
        return self._status.current.address

    async def publish_seq(self, seq: int, *, lower: bool = False) -> None:
        await trio.lowlevel.checkpoint()
        if not self._leading:
            raise NotLeader(NOT_LEADER, "a standby")

    async def last_seq(self) -> int:
        await trio.lowlevel.checkpoint()
        return 0

    async def resign(self) -> None:
        await trio.lowlevel.checkpoint()
        self._stop.set()
