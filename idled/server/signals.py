"""The daemon's signals: SIGTERM/SIGINT stop it, SIGHUP reloads it (the core and each edge alike)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import trio

__all__ = ["until_stopped"]

log = logging.getLogger("idled.server")


async def until_stopped(stop: trio.Event, reload: Callable[[], None], stopping: str = "shutting down") -> None:
    """Wait until ``stop`` is set -- by SIGTERM/SIGINT (logged as ``<SIGNAL>: <stopping>``) or by the caller --
    calling ``reload()`` on every SIGHUP meanwhile. Once it returns the default handlers are back, so a second
    Ctrl-C interrupts the shutdown itself."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
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
