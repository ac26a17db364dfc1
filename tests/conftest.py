"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing


@pytest.fixture
def autojump_clock(monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """pytest-trio's virtual clock, with worker threads run inline.

    The autojump clock jumps to the next deadline whenever every task is blocked -- and a task waiting for a
    worker thread (the event-log writer, fsync) *is* blocked, so virtual time would race ahead by however
    many deadlines fit in the thread's real duration: on a loaded machine, past a test's own timeouts or the
    shutdown grace period. Running ``trio.to_thread.run_sync`` inline keeps every file operation real and
    makes virtual time advance only when the whole server is truly waiting.
    """

    async def run_inline(fn: Callable[..., Any], *args: Any, **_: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", run_inline)
    return trio.testing.MockClock(autojump_threshold=0)
