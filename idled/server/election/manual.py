"""`ManualElection`: a standby promoted by hand (``idled promote``), with no election behind it.

``idled serve --standby-of HOST:PORT`` follows the active core until an operator promotes it (SIGUSR1, which
``idled promote`` sends): from then on it leads, for good -- `NoElection`, the single core. Nothing stops
the old active from writing too: promote only a standby whose active is dead or fenced off (docs/ha.md, the
runbook) -- that is the whole point of ``--election``. There is no shared seq mark: the promoted core
continues after the last record it holds (``last_seq`` starts at 0).
"""

from __future__ import annotations

from idled.server.election.base import NoElection, Status, StatusBoard
from idled.server.election.errors import NOT_LEADER, NotLeader

__all__ = ["ManualElection"]


class ManualElection(NoElection):
    def __init__(self, active: str) -> None:
        super().__init__()
        self._leading = False
        self._status = StatusBoard(Status(0, False, active, 0, f"standby of {active}"))

    def promote(self) -> bool:
        """Lead from now on; False if we already did."""
        if self._leading:
            return False
        self._leading = True
        self._status.set(leader=True, address=None, term=1, reason="promoted by hand")
        return True

    def is_leader(self, now: float) -> bool:
        return self._leading and super().is_leader(now)

    def leader(self) -> str | None:
        return self._status.current.address

    async def publish_seq(self, seq: int, *, lower: bool = False) -> None:
        if not self._leading:
            raise NotLeader(NOT_LEADER, "a standby")
        await super().publish_seq(seq, lower=lower)
