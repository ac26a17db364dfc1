"""``NullMetrics``: the server's metrics with nothing behind them, in a module of its own.

A process that exports no metrics -- an edge without ``--metrics-port``, tests, embedders -- gets this instead
of ``idled.ops.metrics.Metrics``, and so never imports ``prometheus_client`` (with its ``http.server`` and
``email``: ~2.4 MiB of every edge's baseline, measured).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio

__all__ = ["NullMetrics"]


class _NoOp:
    """A counter, gauge or histogram (or one of its labelled children) that records nothing."""

    __slots__ = ()

    def labels(self, *values: str, **labels: str) -> _NoOp:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


_NO_OP = _NoOp()


class NullMetrics:
    """:class:`Metrics` with nothing behind it: every collector the server bumps is a no-op.

    What the server gets when it is given no metrics (tests, embedders), so its paths bump metrics
    unconditionally instead of asking "are there metrics?" at every site. ``registry`` is None: there is
    nothing to scrape, so no /metrics endpoint is started.
    """

    registry: None = None
    presence_events = frames_rejected = logins = detector_ticks = tick_duration = _NO_OP
    offline_lateness = event_loop_lag = event_loop_stall_max = _NO_OP
    eventlog_records = eventlog_bytes = eventlog_fsync_duration = info = tick_seconds = _NO_OP

    def register_snapshot(
        self, fn: Callable[[], Mapping[str, Any]], *, trio_token: trio.lowlevel.TrioToken | None = None
    ) -> None:
        pass

    def observe_loop_lag(self, seconds: float) -> None:
        pass

    def render(self) -> bytes:
        return b""
