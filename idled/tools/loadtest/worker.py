"""One load-generator worker process: many user connections, or a few gateways carrying many sessions.

Theory of operation
-------------------
The coordinator (`idled.tools.loadtest.pool`) starts `python -m idled.tools.loadtest.worker`, writes its
configuration (a map) on the worker's stdin, waits for ``{"t": "ready"}`` on its stdout, then sends
``{"t": "start", "t0": WALL}``: moment 0 of the plan, shared by every worker. Later ``{"t": "stop"}`` (or
EOF) ends the run: every connection is closed, a final report with the latency histograms is written, and
the process exits.

Time: the plan is in seconds after t0 (wall clock); each worker converts it to trio time once
(``t0_trio = t0 - (time.time() - trio.current_time())``) and schedules on trio's monotonic clock.

The sessions themselves are driven by `idled.tools.loadtest.engine` (user connections: one epoll loop, one
trio task for all of them) or `idled.tools.loadtest.gateways` (a wheel of sessions per gateway connection);
`idled.tools.loadtest.workerstate` holds what they share -- configuration, counters, records, the
self-measurement -- and this module the process around them. The trio loop stays: it carries the pipes to
the coordinator, and the engine waits on its epoll fd through it.

Reports (``{"t": "report", ...}``) go to the coordinator every `report_interval` seconds from one task;
records (silent, bye, failed) accumulate in lists bounded by the number of sessions between reports, so a
slow coordinator delays reports but never the pings.
"""

from __future__ import annotations

import os
import sys
import time

import trio

from idled.tools.loadtest import ipc
from idled.tools.loadtest.engine import run_users
from idled.tools.loadtest.gateways import run_gateways
from idled.tools.loadtest.workerstate import Worker

__all__ = ["serve", "main"]


async def serve(w: Worker, control: ipc.Reader, out: trio.abc.SendStream) -> None:
    """Ready, wait for start, run the sessions until stop (or EOF), then the final report."""
    await ipc.send(out, {"t": "ready", "worker": w.index, "pid": os.getpid()})
    start = await control.recv()
    if not start or start.get("t") != "start":
        return
    w.t0 = trio.current_time() + (float(start["t0"]) - time.time())
    w.mark("start")
    interval = float(w.cfg.get("report_interval", 0.5))
    async with trio.open_nursery() as outer:

        async def reporter() -> None:
            while True:
                await trio.sleep(interval)
                with trio.CancelScope(shield=True):  # a frame cut in half would garble the pipe
                    await ipc.send(out, w.report())

        outer.start_soon(reporter)
        async with trio.open_nursery() as sessions:

            async def until_stop() -> None:
                while True:
                    msg = await control.recv()
                    if msg is None or msg.get("t") == "stop":
                        w.mark("stop")  # (before the sockets are closed: that is teardown, not load)
                        sessions.cancel_scope.cancel()
                        return

            sessions.start_soon(until_stop)
            if w.mode == "users":
                await run_users(w)
            else:
                await run_gateways(w)
        outer.cancel_scope.cancel()
    await ipc.send(out, w.report(final=True))


async def _amain() -> None:
    control = ipc.Reader(trio.lowlevel.FdStream(os.dup(0)))
    out = trio.lowlevel.FdStream(os.dup(1))
    cfg = await control.recv()
    if cfg is None:
        return
    await serve(Worker(cfg), control, out)


def main() -> int:
    sys.stdout = sys.stderr  # fd 1 carries the reports: nothing else may write there
    try:
        trio.run(_amain)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
