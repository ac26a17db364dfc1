"""The event-log writer task: drains a trio channel into an EventLog with group commit.

Theory of operation
-------------------
Producers (the presence tick, connection handlers) send event dicts, seq already assigned, into a
`trio.MemoryChannel`. `run_writer` is its only consumer. Each turn of its loop:

1. passes one schedule point (so ready producers can add to the channel), takes one event -- waiting for it
   if the channel is empty -- then everything else already queued without waiting
   (`receive_nowait()` until WouldBlock, at most `max_batch`): one *batch*, however many arrived while the
   previous batch was being written. Under load batches grow by themselves; at low rates a batch is one event.
2. commits the batch in one worker-thread call (`trio.to_thread.run_sync`): `log.append(batch)` -- encode,
   one os.write -- and, when the policy says so, `log.sync()`. fdatasync takes milliseconds; a write into
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

Stopping: close the send side(s). The writer drains what is queued, writes it, syncs (except ``never``) and
returns. If the writer is cancelled instead, queued events are abandoned; a commit in flight still completes
(to_thread calls are not abandoned), and written-but-unsynced data is in the page cache, which survives the
process but not a power cut. `FsyncFailed` propagates: the log is poisoned and the caller must treat it as
fatal (see eventlog). On exit the receive channel is closed, so senders of a writer that died get
BrokenResourceError instead of blocking forever.

Retention (`log.apply_retention`) also runs in the commit thread, at most every `retention_every` seconds
(and the log itself applies it after each rotation).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from idled.log.eventlog import FSYNC_POLICIES, EventLog, FsyncPolicy

__all__ = ["FSYNC_POLICIES", "FsyncPolicy", "run_writer"]



def _commit(
    log: EventLog, batch: Sequence[dict[str, Any]], sync: bool, release: bool, retention: bool
) -> tuple[int, float | None]:
    """Runs in a worker thread: write the batch, maybe sync / retain. Returns (bytes, fsync seconds | None)."""
    nbytes = log.append(batch)
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
    max_batch: int = 4096,
    inline_records: int = 64,
    retention_every: float = 3600.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Drain `receive` into `log` until the channel is closed (see module docstring). `log` must be recovered.

    on_durable(seq): highest seq durable under the policy. on_batch(records, bytes): after each write.
    on_fsync(seconds): after each fdatasync, its duration. before_write(): before each batch is written; what
    it raises ends the writer with nothing of that batch written (an elected core's fence: ``idled.server.node``).
    Raises FsyncFailed (fatal) and any append error.
    """
    if fsync not in FSYNC_POLICIES:
        raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, not {fsync!r}")
    if not (interval > 0 and math.isfinite(interval)) or max_batch < 1 or retention_every <= 0:
        raise ValueError("interval must be finite and > 0, max_batch >= 1, retention_every > 0")
    always, never = fsync == "always", fsync == "never"
    last_sync = trio.current_time() - interval  # the first batch is synced at once
    next_retention = trio.current_time()  # the first batch applies retention
    dirty = False  # written but not yet synced (interval policy only)

    def synced(seconds: float) -> None:
        nonlocal dirty
        dirty = False
        if on_fsync is not None:
            on_fsync(seconds)
        if on_durable is not None:
            on_durable(log.durable_seq)

    async def sync_now() -> None:
        nonlocal last_sync
        last_sync = trio.current_time()
        synced(await trio.to_thread.run_sync(_sync, log))

    task_status.started()
    async with receive:
        while (batch := await _next_batch(receive, last_sync + interval if dirty else None, max_batch)) is not None:
            if not batch:  # interval elapsed with unsynced data and nothing new arrived
                await sync_now()
                continue
            if before_write is not None:
                before_write()
            now = trio.current_time()
            do_sync = always or (not never and now >= last_sync + interval)
            do_retention = now >= next_retention
            if do_sync:
                last_sync = now
            if do_retention:
                next_retention = now + retention_every
            if not do_sync and not do_retention and len(batch) <= inline_records and log.fits(len(batch)):
                nbytes, fsync_seconds = log.append(batch), None  # small: on the loop (see the module docstring)
            else:
                nbytes, fsync_seconds = await trio.to_thread.run_sync(_commit, log, batch, do_sync, never, do_retention)
            if on_batch is not None:
                on_batch(len(batch), nbytes)
            if fsync_seconds is not None:
                synced(fsync_seconds)
            elif never:
                if on_durable is not None:
                    on_durable(log.last_seq)
            else:
                dirty = True
        if dirty:
            await sync_now()


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
