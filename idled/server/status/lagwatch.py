"""Saying so when an edge lags: its watermark's lag in a gauge, and a log line when it falls behind and back.

Theory of operation
-------------------
An edge that lags makes the core hold its sessions' deadlines (``idled.core.watermarks``): correct, but an
operator must see it happen. ``LagWatch.check`` is one of the monitor's hooks; at most once a second it reads
every tracked owner's lag (server clock minus its watermark) and held sessions. An owner whose lag passes
``threshold`` gets one warning naming it, how far behind it is and how many sessions it holds; when it is
back under the threshold, one line says how long it was behind and the most sessions it held meanwhile.
``lags()`` gives the figures for the ``idled_gateway_watermark_lag_seconds`` gauge.

A gateway that owns no session is not asked for marks (``idled.server.roles.gateways.Outbox``: an idle edge
sleeps), so its watermark stands still without it being behind anyone: ``owns(owner)`` says whether it owns
sessions, and the lag of one that owned none at the last look counts from that look, not from its watermark
(its first answer after an attach comes within a round trip; it must not read as minutes behind meanwhile).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from idled.core.watermarks import Holds

__all__ = ["LagWatch"]

log = logging.getLogger("idled.server.status.lagwatch")

CHECK_EVERY = 1.0  # seconds between two looks


class LagWatch:
    def __init__(self, holds: Holds, now: Callable[[], float], *, threshold: float,
                 owns: Callable[[Any], bool] = lambda owner: True) -> None:
        self.holds = holds
        self.now = now
        self.threshold = threshold
        self.owns = owns
        self._idle: dict[Any, float] = {}  # owner -> server time of the last look that found it owning nothing
        self._behind: dict[Any, tuple[float, int]] = {}  # owner -> (server time it fell behind, most held)
        self._next = 0.0

    def lags(self) -> dict[str, float]:
        """Gateway name -> seconds its watermark is behind (for the gauge)."""
        return {_name(owner): max(0.0, lag) for owner, lag, _ in self._lagging(self.now())}

    def _lagging(self, now: float) -> list[tuple[Any, float, int]]:
        """``Holds.lagging``, an owner without sessions at lag 0 and one that had none lately counted from then."""
        idle, out = self._idle, []
        for owner, lag, held in self.holds.lagging(now):
            if not self.owns(owner):
                idle[owner] = now
                lag = 0.0
            elif owner in idle:
                lag = min(lag, now - idle[owner])
            out.append((owner, lag, held))
        return out

    def check(self) -> None:
        t = trio.current_time()
        if t < self._next:
            return
        self._next = t + CHECK_EVERY
        now = self.now()
        seen = set()
        for owner, lag, held in self._lagging(now):
            seen.add(owner)
            behind = self._behind.get(owner)
            if lag > self.threshold:
                if behind is None:
                    log.warning("gateway %s is %.1f s behind (its event loop, its link or this core): the "
                                "deadlines of its sessions are held until it catches up (%d held now)",
                                _name(owner), lag, held)
                    self._behind[owner] = (now - lag, held)
                elif held > behind[1]:
                    self._behind[owner] = (behind[0], held)
            elif behind is not None:
                del self._behind[owner]
                log.info("gateway %s caught up after %.1f s behind (at most %d sessions held meanwhile)",
                         _name(owner), now - behind[0], max(behind[1], held))
        for owner in [owner for owner in self._behind if owner not in seen]:
            del self._behind[owner]  # gone: the gateway-lost line says what became of its sessions
        for owner in [owner for owner in self._idle if owner not in seen]:
            del self._idle[owner]


def _name(owner: Any) -> str:
    return str(getattr(owner, "name", owner))
