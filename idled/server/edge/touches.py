"""The edge's touches and their ages: what its users did since the link's last flush, and when it was read.

Theory of operation
-------------------
A touch is filed with the time its activity was read (``TOUCH_CLOCK``: the users' ``now``, a C function: no
Python frame per packet) and travels with its age (``Touch.ago``), so the core stamps it when this edge read
it, not when the batch arrived: the link's wait for company moves no deadline. The touches of one flush go in
one frame per ``AGE_STEP`` (10 ms) of age, floored: a touch may look up to a step younger than it is (a
deadline that much later), never older (an early offline). The core applies at most half its tick of an age
(``max_age``), so an older touch -- a link that lagged -- travels as that old, in one frame with the others
(``idled.server.edge.link`` also waits no longer than ``max_age``). A core whose welcome does not say
``ages`` (an older version: it would refuse the field) gets plain touches.
"""

from __future__ import annotations

import time
from typing import Final

from idled.client.core import GatewayBatcher
from idled.protocol import MAX_TOUCH_AGO, SessionKey

__all__ = ["AGE_STEP", "TOUCH_CLOCK", "fold"]

AGE_STEP: Final = 0.010  # seconds: a touch's age travels floored to this
TOUCH_CLOCK: Final = time.monotonic  # what touches are stamped with (EdgeUsers.now) and aged by


def fold(touches: dict[SessionKey, float], batch: GatewayBatcher, max_age: float | None) -> None:
    """Put ``touches`` (session key -> when read) into ``batch``, aged up to ``max_age`` (None: no ages)."""
    if max_age is None:
        batch.touch(touches, 0.0)
        return
    now, top = TOUCH_CLOCK(), int(min(max_age, MAX_TOUCH_AGO) / AGE_STEP)
    by_age: dict[int, list[SessionKey]] = {}
    for uid, read in touches.items():
        by_age.setdefault(min(int((now - read) / AGE_STEP), top), []).append(uid)
    for steps, uids in sorted(by_age.items(), reverse=True):
        batch.touch(uids, 0.0, steps * AGE_STEP)
