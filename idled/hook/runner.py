"""`idled hook`'s process: the state directory, where to start, and the tasks that run until a stop.

Theory of operation
-------------------
`run_hook` locks the state directory and reads its checkpoint, then decides where the stream starts:

* a checkpoint N: after N (``--from`` is then ignored, and a log line says so);
* no checkpoint, ``--from S``: after S - 1, committed as the checkpoint at once, so the next start resumes
  rather than starting over from S;
* neither: from now -- the durable view, pinned as the checkpoint (first seq - 1) as soon as the first event
  arrives, so from then on nothing is lost across restarts.

Then, in one nursery: the observer feeding the channel (`idled.hook.source`), the delivery loop
(`idled.hook.deliver`), and optionally the ``/metrics`` endpoint (`idled.ops.http.serve_metrics` on a fresh
registry). The delivery loop returning (shutdown) cancels the rest; the observer failing (`HookGone`, a
final `ClientError` such as a refused login) cancels the delivery loop, abandoning the batch in flight
uncommitted, and propagates.
"""

from __future__ import annotations

import logging
import time

import trio
from prometheus_client import CollectorRegistry

from idled.door.door import Door, metrics_gate
from idled.hook.config import HookConfig
from idled.hook.deliver import Deliverer, Shutdown
from idled.hook.metrics import HookMetrics
from idled.hook.post import Poster
from idled.hook.source import read_events
from idled.hook.state import StateDir, StateError
from idled.ops.http import serve_metrics
from idled.protocol import Event

__all__ = ["run_hook", "start_position"]

log = logging.getLogger("idled.hook")


def start_position(checkpoint: int | None, from_seq: int | None) -> tuple[int | None, str]:
    """(``after`` for the observer -- None: from now --, a line saying why)."""
    if checkpoint is not None:
        ignored = f" (--from {from_seq} ignored: it applies only without a checkpoint)" if from_seq is not None else ""
        return checkpoint, f"resuming after checkpoint seq {checkpoint}{ignored}"
    if from_seq is not None:
        return from_seq - 1, f"no checkpoint: starting from seq {from_seq} (--from)"
    return None, "no checkpoint and no --from: starting from now"


async def run_hook(config: HookConfig, shutdown: Shutdown, *, registry: CollectorRegistry | None = None,
                   door: Door | None = None, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run until ``shutdown.stop()`` (returns) or a failure (raises: `StateError`, `HookGone`, `ClientError`,
    `idled.ops.fatal.Fatal` for the metrics port). ``door``: the metrics endpoint's (``idled.door``), if any."""
    state = await trio.to_thread.run_sync(StateDir, config.state_dir)
    try:
        checkpoint = await trio.to_thread.run_sync(state.read_checkpoint)
        after, why = start_position(checkpoint, config.from_seq)
        log.info("%s; state in %s; posting to %s", why, config.state_dir, config.url)
        waiting = await trio.to_thread.run_sync(state.dead_letter_bytes)
        if waiting:
            log.warning("%d bytes of dead letters wait in %s: idled hook --redrive sends them again", waiting,
                        config.state_dir)
        if checkpoint is None and after is not None:
            try:
                await trio.to_thread.run_sync(state.commit_checkpoint, after, time.time())
                checkpoint = after
            except StateError as exc:  # a full disk: the deliverer pins it with its first commit that fits
                if not exc.disk_full:
                    raise
                log.warning("state directory %s: %s; starting after seq %d all the same", config.state_dir,
                            exc.reason, after)
        registry = registry or CollectorRegistry()
        metrics = HookMetrics(registry)
        if checkpoint is not None:
            metrics.checkpoint.set(checkpoint)
        send, receive = trio.open_memory_channel[Event](config.queue)
        async with Poster(config.url, timeout=config.timeout, ca_file=config.ca_file) as poster:
            deliverer = Deliverer(config, state, poster, metrics, shutdown, committed=checkpoint)
            async with trio.open_nursery() as nursery:
                if door is not None:
                    await nursery.start(serve_metrics, registry, await door.open("metrics"), metrics_gate())
                nursery.start_soon(read_events, config, after, send)
                task_status.started()
                await deliverer.run(receive)
                nursery.cancel_scope.cancel()
    finally:
        state.close()
