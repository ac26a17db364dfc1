"""The timeout rule and the defaults it starts from, named once for the core, the edge, clients and tools.

A client that promises a keepalive every k seconds is allowed ``KEEPALIVE_FACTOR`` x k of silence (MQTT's
rule: 1.5 k), so one late keepalive -- a lost scheduling slice, a slow hop -- does not take it offline. Two
bounds apply: the timeout is at least one tick (the detector cannot see less), and at most ``max_timeout``
(an operator's cap: the detector's horizon and how long a vanished client may look online). A client that
asks for no keepalive gets the server's default timeout.

The presence table applies it to every login; an edge computes the same value from the core's welcome
(timeout, tick, max_timeout) so its users' welcomes say what a direct login would; the load tester predicts
it. Whoever needs the rule calls ``timeout_for``: it is written nowhere else. Likewise ``ticks_for``, a
timeout in whole ticks, rounded up: the presence table's rounding, which the server sizes its detector with;
and ``max_touch_age``, how much of a gateway touch's ``ago`` the server applies, which an edge keeps within.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "DEFAULT_MAX_TIMEOUT", "DEFAULT_TICK", "DEFAULT_TIMEOUT", "KEEPALIVE_FACTOR", "SharedTimeouts", "max_touch_age",
    "ticks_for", "timeout_for",
]

KEEPALIVE_FACTOR: Final = 1.5  # seconds of silence allowed per second of promised keepalive
DEFAULT_TIMEOUT: Final = 30.0  # seconds: a client that asks for no keepalive
DEFAULT_TICK: Final = 1.0  # seconds: the detector's resolution
DEFAULT_MAX_TIMEOUT: Final = 3600.0  # seconds: no client gets longer


def timeout_for(keepalive: float | None, default: float, tick: float, max_timeout: float) -> float:
    """The timeout of a client asking for ``keepalive`` (None: ``default``, returned as the very object given,
    which the presence table tests by identity): ``KEEPALIVE_FACTOR`` x keepalive, at least ``tick``, at most
    ``max_timeout``."""
    if keepalive is None:
        return default
    return min(max(KEEPALIVE_FACTOR * keepalive, tick), max_timeout)


def max_touch_age(tick: float) -> float:
    """The most of a gateway touch's ``ago`` the server applies: half a tick. A stamp later than the activity
    is never an early offline, and with less than a tick applied (every timeout is at least one) a deadline
    never lands on a tick already judged (``idled.server.roles.gateways``, *Touch ages*)."""
    return tick / 2


def ticks_for(seconds: float, tick: float) -> int:
    """Whole ticks in a timeout, rounded up: a timeout is never shortened by the tick granularity. The
    server sizes the detector's default timeout with it, so it must match the presence table's own rounding."""
    return max(1, math.ceil(seconds / tick - 1e-9))


class SharedTimeouts:
    """One float object per distinct timeout, for every session of that timeout to hold (24 bytes a session
    less; ``default`` is returned as itself, the identity the presence table tests). The first ``limit``
    distinct values are kept: clients ask for a few, and a client asking for arbitrary ones cannot grow it."""

    __slots__ = ("_shared", "_limit")

    def __init__(self, default: float, limit: int = 256) -> None:
        self._shared = {default: default}
        self._limit = limit

    def share(self, timeout: float) -> float:
        shared = self._shared.get(timeout)
        if shared is None:
            shared = timeout
            if len(self._shared) < self._limit:
                self._shared[timeout] = timeout
        return shared
