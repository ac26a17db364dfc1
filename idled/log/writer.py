"""The event-log writer task: drains a trio channel into an EventLog with group commit.

Theory of operation
-------------------
Producers (the presence tick, connection handlers) send event dicts, seq already assigned, into a
trio memory channel (`trio.open_memory_channel`). `run_writer` is its only consumer. Each turn of its loop:

1. passes one schedule point (so ready producers can add to the channel), takes one event -- waiting for it
   if the channel is empty -- then everything else already queued without waiting
   (`receive_nowait()` until WouldBlock, at most `max_batch`): one *batch*, however many arrived while the
   previous batch was being written. Under load batches grow by themselves; at low rates a batch is one event.
2. commits the batch in one worker-thread call (`trio.to_thread.run_sync`): `EventLog.append(batch)` -- encode,
   one os.write -- and, when the policy says so, `EventLog.sync()`. fdatasync takes milliseconds; a write into
   the page cache usually takes microseconds but can stall as long under dirty-page throttling, and
   encoding a large batch takes ~2 us per event (in a thread the GIL's 5 ms switch interval still lets the
   event loop in). While the thread works, the next batch accumulates in the channel.
   A *small* batch (at most `inline_records`) that needs no sync, no retention and no rotation is written
   on the event loop instead: at a few thousand events a second most batches are one or two events, and
   each thread hop handed the GIL to the worker at the event loop's next system call -- a send to an edge
   then waited for the worker's whole commit (py-spy, 100k users through 6 edges at 2,000 logins/s: a
   quarter of the core's samples in `send`, most of it waiting for the GIL). A write of a few records into
   the page cache costs ~10-20 us on the loop, less than the hop.
3. reports: `on_batch(records, bytes)`, `on_fsync(seconds)`, `on_durable(seq)`.

fsync policies, and what `on_durable(seq)` means under each:

- ``always``: every batch is fdatasync'ed before `on_durable(last seq of the batch)`. An event reported
  durable survives a power cut. Cost: one fdatasync per batch (throughput is set by fdatasync latency x
  batch size; see `idled bench --writer` for this machine's figures).
- ``interval``: a batch is synced together with its write if `interval` seconds have passed since the last
  sync (so the first batch after a quiet spell is synced at once); otherwise it is left dirty, and the
  writer stops waiting for events at `last sync + interval` to sync it -- so nothing stays unsynced longer
  than ~interval even if traffic stops. `on_durable` follows the syncs.
- ``never``: no fsync ever (the kernel writes back on its own, ~30 s); `on_durable(seq)` is called once the
  batch is written, i.e. it survives a crash of the process, not of the machine.

Backpressure, not loss, is the caller's: with a bounded channel `send()` blocks the producer when the disk
is slower than the event rate (the benchmark below does that); the server's channel is unbounded and its
producers wait in `EventBus.room()` while the backlog is over a limit (events are published synchronously,
so they cannot block in `send()`). Nothing is dropped either way.

A full disk (`DiskFull`: ENOSPC or EDQUOT at a write, a roll or the space reservation; see eventlog) is not
fatal. The log is left at its last whole record; the writer keeps the events it could not write (the rest of
the batch: ``Held.events``) and stops taking new ones, which wait in the channel, in seq order. It syncs what
it did write (so durable observers get it), reports ``on_degraded(error)`` once, and tries the held events
again every ``retry_interval`` seconds (a failed attempt writes nothing, so retrying costs one fallocate or
one write). Once they are written it reports ``on_degraded(None)`` and goes on draining the channel as
usual: nothing is lost, reordered or skipped, and observers get everything as they would have. The bound on
what waits is the caller's: the server's producers wait in ``EventBus.room()`` once the backlog is over its
limit (``idled.server.engine.sessions``). A failed *fsync* stays fatal, full disk or not (fsyncgate).

Stopping: close the send side(s). The writer drains what is queued, writes it, syncs (except ``never``) and
returns (still holding events on a full disk, it keeps trying until it is cancelled). If the writer is
cancelled instead, queued and held events are abandoned; a commit in flight still completes (to_thread calls
are not abandoned), and written-but-unsynced data is in the page cache, which survives the process but not a
power cut. `FsyncFailed` propagates: the log is poisoned and the caller must treat it as fatal (see
eventlog). On exit the receive channel is closed, so senders of a writer that died get BrokenResourceError
instead of blocking forever.

Retention (`EventLog.apply_retention`) also runs in the commit thread, at most every `retention_every` seconds
(and the log itself applies it after each rotation). The commit thread also tops up the active segment's
space reservation (`EventLog.reserve_ahead`), so the small batches written on the loop never call fallocate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from idled.log.eventlog import FSYNC_POLICIES, DiskFull, EventLog, FsyncPolicy

__all__ = ["FSYNC_POLICIES", "FsyncPolicy", "Held", "RETRY_INTERVAL", "run_writer"]

RETRY_INTERVAL = 1.0  # seconds between two attempts to write the events a full disk held back


@dataclass(slots=True)
class Held:
    """What the writer holds back for lack of space (read by whoever reports it: the server's status).
    ``reason``: the operating system's words (None while the log takes every event); ``events``: the events of
    the failed batch not written yet (newer ones wait in the channel); ``attempts``: failed attempts so far."""

    reason: str | None = None
    events: int = 0
    attempts: int = 0


def _commit(
    log: EventLog, batch: Sequence[dict[str, Any]], sync: bool, release: bool, retention: bool
) -> tuple[int, float | None]:
    """Runs in a worker thread: write the batch, maybe sync / retain. Returns (bytes, fsync seconds | None)."""
    nbytes = log.append(batch)
    log.reserve_ahead()
    fsync_seconds = _sync(log) if sync else None
    if release and not sync:
        log.release_rotated()
    if retention:
        log.apply_retention()
    return nbytes, fsync_seconds


def _sync(log: EventLog) -> float:
    started = time.perf_counter()
    log.sync()
    return time.perf_counter() - started


async def run_writer(
    log: EventLog,
    receive: trio.MemoryReceiveChannel[dict[str, Any]],
    *,
    fsync: FsyncPolicy | str = "interval",
    interval: float = 1.0,
    on_durable: Callable[[int], None] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
    on_fsync: Callable[[float], None] | None = None,
    before_write: Callable[[], None] | None = None,
    on_degraded: Callable[[DiskFull | None], None] | None = None,
    held: Held | None = None,
    max_batch: int = 4096,
    inline_records: int = 64,
    retention_every: float = 3600.0,
    retry_interval: float = RETRY_INTERVAL,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Drain `receive` into `log` until the channel is closed (see module docstring). `log` must be recovered.

    on_durable(seq): highest seq durable under the policy. on_batch(records, bytes): after each write.
    on_fsync(seconds): after each fdatasync, its duration. before_write(): before each batch is written; what
    it raises ends the writer with nothing of that batch written (an elected core's fence: ``idled.server.node``).
    on_degraded(DiskFull | None): the disk filled (why) / the events it held back are written (None);
    ``held``: filled in meanwhile. Raises FsyncFailed (fatal) and any append error but DiskFull.
    """
    if fsync not in FSYNC_POLICIES:
        raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, not {fsync!r}")
    if not (interval > 0 and math.isfinite(interval)) or max_batch < 1 or retention_every <= 0:
        raise ValueError("interval must be finite and > 0, max_batch >= 1, retention_every > 0")
    if not (retry_interval > 0 and math.isfinite(retry_interval)):
        raise ValueError("retry_interval must be finite and > 0")
    writer = _Writer(log, fsync, interval, retention_every, retry_interval, inline_records,
                     on_durable, on_batch, on_fsync, before_write, on_degraded, held if held is not None else Held())
    task_status.started()
    async with receive:
        while (batch := await _next_batch(receive, writer.sync_at(), max_batch)) is not None:
            if not batch:  # interval elapsed with unsynced data and nothing new arrived
                await writer.sync_now()
            else:
                await writer.commit(batch)
        if writer.dirty:
            await writer.sync_now()


class _Writer:
    """run_writer's state between batches: the policy, the callbacks, when it last synced (see the module
    docstring)."""

    def __init__(
        self, log: EventLog, fsync: str, interval: float, retention_every: float, retry_interval: float,
        inline_records: int, on_durable: Callable[[int], None] | None, on_batch: Callable[[int, int], None] | None,
        on_fsync: Callable[[float], None] | None, before_write: Callable[[], None] | None,
        on_degraded: Callable[[DiskFull | None], None] | None, held: Held,
    ) -> None:
        self.log = log
        self.always, self.never = fsync == "always", fsync == "never"
        self.interval, self.retention_every, self.retry_interval = interval, retention_every, retry_interval
        self.inline_records = inline_records
        self.on_durable, self.on_batch, self.on_fsync = on_durable, on_batch, on_fsync
        self.before_write, self.on_degraded, self.held = before_write, on_degraded, held
        self.last_sync = trio.current_time() - interval  # the first batch is synced at once
        self.next_retention = trio.current_time()  # the first batch applies retention
        self.dirty = False  # written but not yet synced (interval policy only)

    def sync_at(self) -> float | None:
        """When unsynced data must be synced if nothing else arrives (None: nothing is unsynced)."""
        return self.last_sync + self.interval if self.dirty else None

    def synced(self, seconds: float) -> None:
        self.dirty = False
        if self.on_fsync is not None:
            self.on_fsync(seconds)
        if self.on_durable is not None:
            self.on_durable(self.log.durable_seq)

    async def sync_now(self) -> None:
        self.last_sync = trio.current_time()
        self.synced(await trio.to_thread.run_sync(_sync, self.log))

    async def commit(self, batch: list[dict[str, Any]]) -> None:
        """Write one batch (and sync, retain, as due); a full disk holds it until it is written."""
        if self.before_write is not None:
            self.before_write()
        log, now = self.log, trio.current_time()
        do_sync = self.always or (not self.never and now >= self.last_sync + self.interval)
        do_retention = now >= self.next_retention
        if do_sync:
            self.last_sync = now
        if do_retention:
            self.next_retention = now + self.retention_every
        try:
            if not do_sync and not do_retention and len(batch) <= self.inline_records and log.fits(len(batch)):
                nbytes, fsync_seconds = log.append(batch), None  # small: on the loop (see the module docstring)
            else:
                nbytes, fsync_seconds = await trio.to_thread.run_sync(
                    _commit, log, batch, do_sync, self.never, do_retention)
        except DiskFull as exc:
            await self.hold(batch, exc)
            return
        self.written(len(batch), nbytes, fsync_seconds)

    def written(self, records: int, nbytes: int, fsync_seconds: float | None) -> None:
        """Report a write: the batch, and its durability under the policy."""
        if self.on_batch is not None:
            self.on_batch(records, nbytes)
        if fsync_seconds is not None:
            self.synced(fsync_seconds)
        elif self.never:
            if self.on_durable is not None:
                self.on_durable(self.log.last_seq)
        else:
            self.dirty = True

    async def hold(self, batch: list[dict[str, Any]], exc: DiskFull) -> None:
        """A full disk: keep what was not written, retry until it is (see the module docstring)."""
        log, held = self.log, self.held
        rest = self._unwritten(batch, exc)
        if self.dirty:  # (_unwritten reported what did fit as written: dirty unless the policy is never)
            await self.sync_now()  # what did fit goes to durable observers now, not when the disk has room
        held.reason, held.events = exc.reason, len(rest)
        if self.on_degraded is not None:
            self.on_degraded(exc)
        while rest:
            held.attempts += 1
            await trio.sleep(self.retry_interval)
            if self.before_write is not None:
                self.before_write()
            try:
                nbytes, fsync_seconds = await trio.to_thread.run_sync(
                    _commit, log, rest, self.always, self.never, False)
            except DiskFull as again:
                rest = self._unwritten(rest, again)
                held.reason, held.events = again.reason, len(rest)
                if self.dirty:  # some of it fitted: durable observers get that now
                    await self.sync_now()
                continue
            self.written(len(rest), nbytes, fsync_seconds)
            rest = []
        held.reason, held.events = None, 0
        if self.on_degraded is not None:
            self.on_degraded(None)

    def _unwritten(self, batch: list[dict[str, Any]], exc: DiskFull) -> list[dict[str, Any]]:
        """The events of ``batch`` the log did not take before ``exc``; those it did are reported written."""
        last = self.log.last_seq
        rest = [event for event in batch if event["seq"] > last]
        if len(rest) < len(batch):
            self.written(len(batch) - len(rest), exc.written, None)
        return rest

async def _next_batch(
    receive: trio.MemoryReceiveChannel[dict[str, Any]], sync_at: float | None, max_batch: int
) -> list[dict[str, Any]] | None:
    """The next batch: one event -- waited for, until ``sync_at`` when unsynced data waits for its sync -- then
    whatever else is already queued, up to ``max_batch``. [] when ``sync_at`` came first; None at the end."""
    batch: list[dict[str, Any]] = []
    try:
        # One schedule point per batch lets ready producers add to the channel; then only an empty channel
        # makes the writer wait, and only a dirty one arms a deadline (a cancel scope per batch would cost more
        # than encoding a small batch).
        await trio.lowlevel.checkpoint()
        try:
            batch.append(receive.receive_nowait())
        except trio.WouldBlock:
            if sync_at is not None:
                with trio.move_on_at(sync_at):
                    batch.append(await receive.receive())
            else:
                batch.append(await receive.receive())
    except trio.EndOfChannel:
        return None
    while batch and len(batch) < max_batch:
        try:
            batch.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break  # EndOfChannel is raised again by the next receive()
    return batch
