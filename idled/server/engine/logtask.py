"""The core's log-writer task: the bus's records to disk, what a full disk or a failed log means, a clean end.

Theory of operation
-------------------
``LogTask.run`` runs ``idled.log.writer.run_writer`` on the bus's log queue with the server's fsync policy,
counting batches and fsyncs into the metrics, reporting durability to the bus, and (under ``--election``)
asking the fence before each write. A full disk degrades the server (``idled.server.engine.degraded.LogHold``: the
writer holds what it cannot write, and retries); any other failure of the log (fsync failed, EIO) ends the
daemon: one ``Fatal`` line naming the directory (``fatal_on_log_error``), and systemd restarts it onto a
recovered log. ``done`` is set once nothing more will be written -- shutdown waits for it before it tells the
peers goodbye. A clean end syncs even under ``--fsync never`` and lowers the seq reservation to the last seq
issued (``SeqBlocks.finish``), so every issued seq is durable and the next run continues right after it, with
no gap; that is shielded, so cancelling the server cannot stop it half-way.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from idled.log.eventlog import EventLog
from idled.log.writer import run_writer
from idled.ops.config import Config
from idled.ops.fatal import fatal_on_log_error
from idled.ops.metrics import Metrics
from idled.ops.nullmetrics import NullMetrics
from idled.server.election.fence import Fence
from idled.server.engine.bus import EventBus
from idled.server.engine.degraded import LogHold
from idled.server.engine.seqs import SeqBlocks

__all__ = ["LogTask"]


class LogTask:
    """The writer of one server's log (see the module docstring). ``last_seq()``: the last seq issued."""

    def __init__(self, log: EventLog, bus: EventBus, config: Config, *, metrics: Metrics | NullMetrics,
                 fence: Fence | None, hold: LogHold, seqs: SeqBlocks, last_seq: Callable[[], int]) -> None:
        self.log, self.bus, self.config, self.metrics = log, bus, config, metrics
        self.fence, self.hold, self.seqs, self.last_seq = fence, hold, seqs, last_seq
        self.done = trio.Event()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with fatal_on_log_error(str(self.log.directory)):
            await self._write(task_status)

    async def _write(self, task_status: trio.TaskStatus[None]) -> None:
        metrics, log = self.metrics, self.log

        def on_batch(records: int, nbytes: int) -> None:
            metrics.eventlog_records.inc(records)
            metrics.eventlog_bytes.inc(nbytes)

        try:
            await run_writer(
                log, self.bus.log_receive, fsync=self.config.fsync, interval=self.config.fsync_interval,
                on_batch=on_batch, on_fsync=metrics.eventlog_fsync_duration.observe, on_durable=self.bus.durable_to,
                before_write=self.fence.check if self.fence is not None else None,
                on_degraded=self.hold.on_degraded, held=self.hold.held, task_status=task_status,
            )
        except BaseException:
            self.hold.abandoned()
            log.close()
            self.done.set()
            raise
        self.done.set()  # every event is written: shutdown may tell the peers goodbye
        with trio.CancelScope(shield=True):
            if self.config.fsync == "never":
                await trio.to_thread.run_sync(log.sync)
            await self.seqs.finish(self.last_seq())
            log.close()
