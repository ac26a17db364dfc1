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

Per process role, by measurement. What a thaw reclaims is cyclic garbage among frozen objects: connections
that lived long enough to be frozen, then closed (a trio task, its coroutine and stream, a traceback). What
it costs is a walk of every live object. An edge, or a core serving users directly, holds ~34 objects per
user connection and its users come and go: its thaws find garbage. A core behind edges holds a few gateway
and observer connections, which rarely close, and one record per session, which never forms a cycle
(tests/core checks that ending sessions leaves nothing for the collector): at 1M sessions its walk costs
~0.2 s (`idled bench --growth`, full_gc_ms) and finds next to nothing. So the policy watches what each thaw's
walk reclaims (the ``collected`` count of the full collection that follows it): under ``fruitful`` objects
(10,000: ~300 connections' worth, a few MB), the next thaw waits twice as long, up to a day; a fruitful
one brings the interval back to ``thaw_every``. The interval only doubles after a thaw that found less than
``fruitful``, so at a steady rate the garbage waiting for a thaw stays under ~2 x ``fruitful``; the role
needs no flag.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

THAW_EVERY = 3600.0  # seconds between two full walks of every object
THAW_EVERY_MAX = 24 * 3600.0  # the longest wait when thaws find next to nothing (see above)
THAW_FRUITFUL = 10_000  # objects a thaw's walk must reclaim to keep the interval at thaw_every


class GcPolicy:
    def __init__(
        self,
        *,
        thaw_every: float = THAW_EVERY,
        thaw_every_max: float = THAW_EVERY_MAX,
        fruitful: int = THAW_FRUITFUL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.thaw_every = thaw_every
        self.thaw_every_max = max(thaw_every, thaw_every_max)
        self.fruitful = fruitful
        self.interval = thaw_every  # the current wait between two thaws
        self._clock = clock
        self._thaw_at = 0.0
        self._thawed = False  # a thaw happened; the next full collection tells what it was worth
        self.full_collections = 0
        self.thaws = 0
        self.last_reclaimed: int | None = None  # objects the walk after the last thaw collected

    def start(self) -> None:
        """Freeze what exists now (the server's startup objects and its empty session maps), then freeze
        the survivors of every full collection."""
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_gc)
        self._thaw_at = self._clock() + self.interval

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()

    def maybe_thaw(self) -> bool:
        """Called periodically: unfreeze everything once ``interval`` has passed (returns whether it did)."""
        now = self._clock()
        if now < self._thaw_at:
            return False
        gc.unfreeze()
        self._thawed = True
        self._thaw_at = now + self.interval
        self.thaws += 1
        return True

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            self.full_collections += 1
            if self._thawed:  # the walk of everything: what it found decides when the next is worth it
                self._thawed = False
                self.last_reclaimed = info["collected"]
                if info["collected"] >= self.fruitful:
                    self.interval = self.thaw_every
                else:
                    self.interval = min(2 * self.interval, self.thaw_every_max)
                self._thaw_at = self._clock() + self.interval
            gc.freeze()  # what survived a full walk is live: don't walk it again until the next thaw
