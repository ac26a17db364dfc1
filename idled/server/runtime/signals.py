"""The daemon's signals: SIGTERM/SIGINT stop it, SIGHUP reloads it (the core and each edge alike)."""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Callable

import trio

__all__ = ["SIGNALS", "until_stopped"]

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

log = logging.getLogger("idled.server")


async def until_stopped(stop: trio.Event, reload: Callable[[], None], signals: AsyncIterator[int],
                        stopping: str = "shutting down") -> None:
    """Wait until ``stop`` is set -- by SIGTERM/SIGINT (logged as ``<SIGNAL>: <stopping>``) or by the caller --
    calling ``reload()`` on every SIGHUP meanwhile. ``signals`` is a receiver of ``SIGNALS`` the caller opened
    *before* it announced itself ready (IDLED_LISTENING, READY=1): a SIGTERM sent the moment it is ready is
    queued there, not taken by the default handler. Once the receiver is closed the default handlers are back,
    so a second Ctrl-C interrupts the shutdown itself."""
    async with trio.open_nursery() as watch:

        async def on_signals() -> None:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    reload()
                else:
                    log.info("%s: %s", signal.Signals(signum).name, stopping)
                    stop.set()

        watch.start_soon(on_signals)
        await stop.wait()
        watch.cancel_scope.cancel()
