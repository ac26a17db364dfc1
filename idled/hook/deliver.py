"""The delivery loop: batch, post, retry, dead-letter, checkpoint -- one batch in flight, in seq order.

Theory of operation
-------------------
`Deliverer.run` takes events from the channel `idled.hook.source` fills. A batch starts with the first event
and closes after ``batch_wait`` seconds, or earlier when it holds ``batch_max`` events or ``batch_bytes`` of
body (`idled.hook.batch`). It is then posted, signed afresh for each attempt, until a 2xx
(`idled.hook.post`), sleeping `RetryPolicy.delay` between attempts; no later event is posted meanwhile, so
the receiver sees first deliveries in strictly increasing seq order. Only then is the checkpoint committed
(`idled.hook.state`) -- or, once `RetryPolicy.exhausted` (24 h of failures by default), when the batch is
durably in the dead-letter file. The checkpoint therefore never runs ahead of what the receiver acknowledged, and a crash anywhere
re-posts at most the batch in flight plus what followed it: at-least-once, with ``webhook-id`` and each
event's ``seq`` for the receiver to drop duplicates (``webhook-id``: `idled.hook.sign`).

A full disk under the state directory (`StateError.disk_full`) does not stop delivery: a checkpoint that
cannot be committed is left behind on disk (one warning; every later batch tries again; a restart meanwhile
re-posts from the older checkpoint, at-least-once as after a crash), and a batch to dead-letter waits,
retried every ``DISK_RETRY`` seconds, until the dead-letter file takes it (nothing later is posted meanwhile).

Shutdown (`Shutdown`): SIGTERM cancels a wait for events, a batch still filling and a backoff sleep at once;
a request in flight gets ``stop_grace`` seconds to finish. Whatever was not acknowledged is abandoned
uncommitted and is posted again by the next run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import trio

from idled.hook.batch import Batch, Batcher
from idled.hook.config import HookConfig
from idled.hook.metrics import HookMetrics
from idled.hook.post import Outcome, Poster
from idled.hook.sign import webhook_headers
from idled.hook.state import StateDir, StateError
from idled.protocol import Event

__all__ = ["DISK_RETRY", "Deliverer", "Shutdown"]

log = logging.getLogger("idled.hook")

DISK_RETRY = 5.0  # seconds between two attempts to dead-letter a batch on a full disk


class Shutdown:
    """The stop request as cancel scopes: `interruptible()` blocks end at once, `graceful()` ones get
    ``grace`` seconds from the stop."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.stopping = False
        self._now: set[trio.CancelScope] = set()
        self._graceful: set[trio.CancelScope] = set()

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        for scope in self._now:
            scope.cancel()
        for scope in self._graceful:
            scope.deadline = min(scope.deadline, trio.current_time() + self.grace)

    @contextmanager
    def _scoped(self, scopes: set[trio.CancelScope], deadline: float) -> Iterator[trio.CancelScope]:
        with trio.CancelScope(deadline=deadline) as scope:
            scopes.add(scope)
            try:
                yield scope
            finally:
                scopes.discard(scope)

    def interruptible(self) -> AbstractContextManager[trio.CancelScope]:
        return self._scoped(self._now, -math.inf if self.stopping else math.inf)

    def graceful(self) -> AbstractContextManager[trio.CancelScope]:
        return self._scoped(self._graceful, trio.current_time() + self.grace if self.stopping else math.inf)


class Deliverer:
    def __init__(self, config: HookConfig, state: StateDir, poster: Poster, metrics: HookMetrics,
                 shutdown: Shutdown, *, committed: int | None, wall: Callable[[], float] = time.time,
                 random: Callable[[], float] | None = None) -> None:
        import random as random_module

        self.config, self.state, self.poster, self.metrics = config, state, poster, metrics
        self.shutdown = shutdown
        self.committed = committed  # the checkpoint on disk (None: none yet)
        self.wall = wall
        self.random = random or random_module.random
        self.batcher = Batcher(config.batch_max, config.batch_bytes, config.filter)
        self._carry: Event | None = None
        self._filtered = 0
        self._disk_full = False  # the last write to the state directory failed for lack of space (logged once)

    async def run(self, channel: trio.MemoryReceiveChannel[Event]) -> None:
        """Deliver until the channel closes or shutdown; returns normally either way."""
        while not self.shutdown.stopping:
            batch = await self._fill(channel)
            if batch is None:
                return
            if batch.events and not await self.send(batch):
                return  # stopping: abandoned, not committed
            if self.committed is None or batch.through > self.committed:
                await self._commit(batch.through)

    async def _fill(self, channel: trio.MemoryReceiveChannel[Event]) -> Batch | None:
        first = self._carry
        self._carry = None
        if first is None:
            with self.shutdown.interruptible():
                first = await self._receive(channel)
            if first is None or self.shutdown.stopping:
                return None
        if self.committed is None:  # from now (or --from): pin where this hook starts, before any post
            await self._commit(first.seq - 1)
        self.batcher.add(first)
        with trio.move_on_after(self.config.batch_wait), self.shutdown.interruptible():
            while not self.batcher.full:
                event = await self._receive(channel)
                if event is None:
                    break
                if not self.batcher.add(event):
                    self._carry = event
                    break
        self.metrics.queued.set(channel.statistics().current_buffer_used)
        self.metrics.filtered.inc(self.batcher.filtered - self._filtered)
        self._filtered = self.batcher.filtered
        if self.shutdown.stopping:
            self.batcher.take()
            return None
        return self.batcher.take()

    @staticmethod
    async def _receive(channel: trio.MemoryReceiveChannel[Event]) -> Event | None:
        try:
            return channel.receive_nowait()
        except trio.WouldBlock:
            pass
        except trio.EndOfChannel:
            return None
        try:
            return await channel.receive()
        except trio.EndOfChannel:
            return None

    async def send(self, batch: Batch) -> bool:
        """Post until a 2xx or, once the retry policy gives up, `give_up` took it (True); or shutdown (False)."""
        body = batch.body()
        failures = 0
        first = trio.current_time()  # the budget (--retry-for) runs on trio's clock, like the sleeps
        while True:
            outcome = await self._attempt(batch, body, failures + 1)
            if outcome is None:
                return False
            self.metrics.requests.labels(outcome.result).inc()
            if outcome.ok:
                self._delivered(batch)
                return True
            failures += 1
            self.metrics.retry_backlog.set(len(batch.events))
            elapsed = trio.current_time() - first
            if self.config.retry.exhausted(failures, elapsed):
                return await self.give_up(batch, failures, outcome.error, elapsed)
            delay = self.config.retry.delay(failures, self.random, outcome.retry_after)
            log.warning("delivery %s (%d events) failed, attempt %d, %.0f s since the first: %s; retrying in %.2f s",
                        batch.delivery_id, len(batch.events), failures, elapsed, outcome.error, delay)
            with self.shutdown.interruptible():
                await trio.sleep(delay)
            if self.shutdown.stopping:
                return False

    async def _attempt(self, batch: Batch, body: bytes, attempt: int) -> Outcome | None:
        headers = webhook_headers(self.config.secret, batch.delivery_id, int(self.wall()), body)
        headers["Idled-Attempt"] = str(attempt)
        outcome = None
        with self.shutdown.graceful():
            outcome = await self.poster.post(body, headers)
        return outcome

    def _delivered(self, batch: Batch) -> None:
        now = self.wall()
        self.metrics.delivered.inc(len(batch.events))
        self.metrics.retry_backlog.set(0)
        for _, ts, _ in batch.events:
            self.metrics.latency.observe(max(0.0, now - ts))

    async def give_up(self, batch: Batch, failures: int, error: str, elapsed: float) -> bool:
        """Append the batch to the dead-letter file, waiting for room on a full disk; False: shutdown came first.
        (`idled.hook.redrive` overrides it: a letter redriven in vain is not dead-lettered twice.)"""
        while not await self._state_write(self.state.append_dead_letter, batch, failures, error, self.wall()):
            with self.shutdown.interruptible():
                await trio.sleep(DISK_RETRY)
            if self.shutdown.stopping:
                return False
        self.metrics.dead_letter.inc(len(batch.events))
        self.metrics.retry_backlog.set(0)
        log.warning("delivery %s (%d events) DEAD-LETTERED after %d attempts over %.0f s (last error: %s); "
                    "appended to %s (idled hook --redrive sends it again)", batch.delivery_id, len(batch.events),
                    failures, elapsed, error, self.state.path + "/dead-letter.jsonl")
        return True

    async def _commit(self, seq: int) -> None:
        if await self._state_write(self.state.commit_checkpoint, seq, self.wall()):
            self.committed = seq
            self.metrics.checkpoint.set(seq)

    async def _state_write(self, write: Callable[..., None], *args: object) -> bool:
        """Run a write of the state directory in a thread; False if the disk is full (one warning until a write
        succeeds again). Any other failure raises (``StateError``: fatal)."""
        try:
            await trio.to_thread.run_sync(write, *args)
        except StateError as exc:
            if not exc.disk_full:
                raise
            if not self._disk_full:
                log.warning("state directory %s: %s; delivery goes on, the checkpoint on disk stays at %s until "
                            "there is room", self.state.path, exc.reason, self.committed)
            self._disk_full = True
            return False
        if self._disk_full:
            log.warning("state directory %s: written again", self.state.path)
            self._disk_full = False
        return True
