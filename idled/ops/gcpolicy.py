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
seconds (an hour by default; the ``gc_thaw_every`` setting) everything is unfrozen and collected at once:
one full walk of all objects (one long pause an hour instead of one every few seconds) frees the cycles and
refreezes the survivors. Garbage without cycles is freed by reference counting at once, frozen or not.

The walk is run by the thaw itself, not left to the next full collection CPython decides on: in a steady
state that one may not come for hours (measured: none in the 60 s after six thaws, 10 s apart, in a core
serving 3,000 connections through two edges), so the pause would land at no predictable moment and cycles would wait longer. Each walk's
duration is logged (``gc full walk: ... ms``, a line `idled loadtest` reads from every process of the
daemon) and kept in ``walks``. The first thaw comes at a random point of the second half of the first
interval, so the core and its edges (started together) keep apart phases: walks at the same moment would
share the cores and each pause longer (measured: four edges walking within one second of each other, each
pausing 2-3x its CPU time on two cores).
"""

from __future__ import annotations

import gc
import logging
import random
import time
from collections.abc import Callable
from typing import Any

THAW_EVERY = 3600.0  # seconds between two full walks of every object
FULL_WALK_LOG = "gc full walk:"  # starts the log line of each walk (idled.tools.loadtest.target parses it)

log = logging.getLogger("idled.ops.gcpolicy")


class GcPolicy:
    def __init__(self, *, thaw_every: float = THAW_EVERY, clock: Callable[[], float] = time.monotonic,
                 phase: Callable[[], float] = random.random) -> None:
        self.thaw_every = thaw_every
        self._clock = clock
        self._phase = phase  # U(0, 1): where in the second half of the first interval the first thaw comes
        self._thaw_at = 0.0
        self.full_collections = 0
        self.thaws = 0
        self.walks: list[float] = []  # seconds each full walk (the collection a thaw runs) took
        self._thawed = 0  # objects the last thaw released, until the walk that follows it
        self._collection_started = 0.0
        self._cpu_started = 0.0

    @property
    def check_every(self) -> float:
        """How often a caller without a faster periodic task should call `maybe_thaw` (seconds)."""
        return min(60.0, self.thaw_every / 10)

    def start(self) -> None:
        """Freeze what exists now (the server's startup objects and its empty session maps), then freeze
        the survivors of every full collection."""
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_gc)
        self._thaw_at = self._clock() + self.thaw_every * (0.5 + 0.5 * self._phase())

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()

    def maybe_thaw(self) -> bool:
        """Called periodically: once ``thaw_every`` has passed, unfreeze everything and walk it all (a full
        collection, which refreezes the survivors). Returns whether it did."""
        now = self._clock()
        if now < self._thaw_at:
            return False
        self._thawed = gc.get_freeze_count()
        gc.unfreeze()
        self._thaw_at = now + self.thaw_every
        self.thaws += 1
        gc.collect()
        return True

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._collection_started = self._clock()
            self._cpu_started = time.process_time()
            return
        self.full_collections += 1
        gc.freeze()  # what survived a full walk is live: don't walk it again until the next thaw
        if self._thawed:
            seconds = self._clock() - self._collection_started
            self.walks.append(seconds)
            del self.walks[:-100]  # bounded: the latest hundred
            # CPU time apart from the pause: on a busy host the pause is longer than the walk's own work
            log.info("%s %.1f ms (%.1f ms CPU) over %d thawed objects, %d unreachable collected", FULL_WALK_LOG,
                     seconds * 1e3, (time.process_time() - self._cpu_started) * 1e3, self._thawed, info["collected"])
            self._thawed = 0
