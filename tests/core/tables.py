"""What the presence-table tests share: a table on the real detector, the wall clock, a stand-in owner.

`now` is the server's monotonic clock, `wall` the unix time the caller read alongside it; ``wall(now)`` is
that time for a clock that read ``WALL0`` at ``now == 0``. Every table is built on the real detector the
server uses (``make_detector``), so the tick arithmetic under test is the production one.
"""

from __future__ import annotations

from idled.core.factory import make_detector
from idled.core.presence import PresenceTable, ticks_for

WALL0 = 1_700_000_000.0  # wall clock at now == 0


def table(*, tick: float = 0.1, timeout: float = 1.0, max_timeout: float = 60.0, kind: str = "ring-lazy",
          first_seq: int = 1, max_devices: int = 8, grace: float = 0.0, slots: int = 16) -> PresenceTable:
    return PresenceTable(make_detector(kind, timeout=ticks_for(timeout, tick), slots=slots), tick=tick,
                         timeout=timeout, max_timeout=max_timeout, detector_name=kind, first_seq=first_seq,
                         max_devices=max_devices, offline_grace=grace)


def wall(now: float) -> float:
    return WALL0 + now


class Owner:
    """Stands in for a connection: presence only compares owners by identity."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Owner({self.name})"
