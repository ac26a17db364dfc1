"""The cyclic garbage collector's policy for a server that holds many long-lived objects.

Theory of operation
-------------------
CPython 3.11's full (generation 2) collection walks every tracked object, and it is not incremental: the
event loop stops for all of it. A server holding 19,000 connections tracks ~650k objects (tasks,
coroutines, streams, sockets: ~34 per connection), and 1M gateway sessions put 1M-entry maps behind
objects; measured with ``gc.callbacks`` under ``idled loadtest``, full collections then take 200-800 ms,
every time the number of objects promoted to the old generation grows by 25% (CPython's rule) -- during a
login ramp, every few seconds. Nearly all of those objects are live and stay live: the walk finds nothing.

So objects that have survived a full collection are *frozen* (``gc.freeze()``: moved to a permanent
generation the collector skips), and the next full collection walks only what arrived since. A frozen
object that later becomes part of garbage *cycle* would never be reclaimed, so every ``thaw_every``
seconds (an hour by default) everything is unfrozen: the next full collection walks all objects once (one
long pause an hour instead of one every few seconds), frees the cycles, and refreezes the survivors.
Garbage without cycles is freed by reference counting at once, frozen or not.

Per process role. What a thaw reclaims is cyclic garbage among frozen objects: connections that lived
long enough to be frozen, then closed (a trio task, its coroutine and stream, a traceback). What it costs is
a walk of every live object. An edge, or a core serving users directly (``--workers 0``), holds ~34 objects
per user connection and its users come and go: hourly. A core behind edges (``--workers N``) holds a few
gateway and observer connections, which rarely close, and one record per session, which never forms a
cycle (``idled.core`` unlinks a record from its bucket when it leaves; tests/core checks that ending
sessions leaves nothing for the collector): at 1M sessions a walk costs ~0.2 s and finds next to nothing,
so such a core thaws once a day (``THAW_EVERY_CORE``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

THAW_EVERY = 3600.0  # seconds between two full walks of every object
THAW_EVERY_CORE = 24 * 3600.0  # the same for a core whose users are all behind edges (see above)


class GcPolicy:
    def __init__(self, *, thaw_every: float = THAW_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.thaw_every = thaw_every
        self._clock = clock
        self._thaw_at = 0.0
        self.full_collections = 0
        self.thaws = 0

    def start(self) -> None:
        """Freeze what exists now (the server's startup objects and its empty session maps), then freeze
        the survivors of every full collection."""
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_gc)
        self._thaw_at = self._clock() + self.thaw_every

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()

    def maybe_thaw(self) -> bool:
        """Called periodically: unfreeze everything once ``thaw_every`` has passed (returns whether it did)."""
        now = self._clock()
        if now < self._thaw_at:
            return False
        gc.unfreeze()
        self._thaw_at = now + self.thaw_every
        self.thaws += 1
        return True

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            self.full_collections += 1
            gc.freeze()  # what survived a full walk is live: don't walk it again until the next thaw
