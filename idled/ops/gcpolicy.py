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
serving 3,000 connections through two edges), so the pause would land at no predictable moment and
cycles would wait longer. Each walk's duration is logged (``gc full walk: ... ms``, a line `idled loadtest` reads from every process of the
daemon) and kept in ``walks``. The first thaw comes at a random point of the second half of the first
interval, so the core and its edges (started together) keep apart phases: walks at the same moment would
share the cores and each pause longer (measured: four edges walking within one second of each other, each
pausing 2-3x its CPU time on two cores).

Per process role, by measurement. What a thaw reclaims is cyclic garbage among frozen objects: connections
that lived long enough to be frozen, then closed (a trio task, its coroutine and stream, a traceback). What
it costs is a walk of every live object. An edge, or a core serving users directly, holds ~34 objects per
user connection and its users come and go: its thaws found garbage (less since closed TLS streams and
user-plane records stopped forming cycles: ``idled.door.tls.untie``, ``tests/server/test_tls_garbage.py``).
A core behind edges holds a few gateway and observer connections, which rarely close, and one record per
session, which never forms a cycle
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
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

THAW_EVERY = 3600.0  # seconds between two full walks of every object
THAW_EVERY_MAX = 24 * 3600.0  # the longest wait when thaws find next to nothing (see above)
THAW_FRUITFUL = 10_000  # objects a thaw's walk must reclaim to keep the interval at thaw_every
FULL_WALK_LOG = "gc full walk:"  # starts the log line of each walk (idled.tools.loadtest.target parses it)

log = logging.getLogger("idled.ops.gcpolicy")


class GcPolicy:
    def __init__(
        self,
        *,
        thaw_every: float = THAW_EVERY,
        thaw_every_max: float = THAW_EVERY_MAX,
        fruitful: int = THAW_FRUITFUL,
        clock: Callable[[], float] = time.monotonic,
        phase: Callable[[], float] = random.random,
    ) -> None:
        self.thaw_every = thaw_every
        self.thaw_every_max = max(thaw_every, thaw_every_max)
        self.fruitful = fruitful
        self.interval = thaw_every  # the current wait between two thaws
        self._clock = clock
        self._phase = phase  # U(0, 1): where in the second half of the first interval the first thaw comes
        self._thaw_at = math.inf  # no thaw before start()
        self._thawed = 0  # objects the last thaw released, until the walk that follows it tells what it was worth
        self.full_collections = 0
        self.thaws = 0
        self.walks: list[float] = []  # seconds each full walk (the collection a thaw runs) took
        self.last_reclaimed: int | None = None  # objects the walk after the last thaw collected
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
        """Called periodically: once ``interval`` has passed, unfreeze everything and walk it all (a full
        collection, which refreezes the survivors). Returns whether it did."""
        now = self._clock()
        if now < self._thaw_at:
            return False
        self._thawed = gc.get_freeze_count()
        gc.unfreeze()
        self._thaw_at = now + self.interval
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
        if self._thawed:  # the walk of everything: what it found decides when the next is worth it
            stopped = self._clock()
            seconds = stopped - self._collection_started
            self.walks.append(seconds)
            del self.walks[:-100]  # bounded: the latest hundred
            collected = info["collected"]
            self.last_reclaimed = collected
            fruitful = collected >= self.fruitful
            self.interval = self.thaw_every if fruitful else min(2 * self.interval, self.thaw_every_max)
            self._thaw_at = stopped + self.interval
            # CPU time apart from the pause: on a busy host the pause is longer than the walk's own work
            log.info("%s %.1f ms (%.1f ms CPU) over %d thawed objects, %d unreachable collected; next in %.0f s",
                     FULL_WALK_LOG, seconds * 1e3, (time.process_time() - self._cpu_started) * 1e3, self._thawed,
                     collected, self.interval)
            self._thawed = 0
