"""LagWatch (idled.server.status.lagwatch): the watermark lag it reports and the lines it logs, by hand.

A gateway that owns no session is not asked for marks (issue 36: an idle edge sleeps), so its watermark
stands still: that must read as "not behind", and after it attaches again its lag counts from then.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from idled.core.watermarks import Holds
from idled.server.status.lagwatch import CHECK_EVERY, LagWatch


class _Gateway:
    def __init__(self, name: str) -> None:
        self.name = name
        self.uids: dict[str, None] = {}


def _watch(now: list[float]) -> tuple[Holds[Any], LagWatch, _Gateway]:
    holds: Holds[Any] = Holds()
    gateway = _Gateway("edge-1")
    holds.track(gateway, 0.0)
    watch = LagWatch(holds, lambda: now[0], threshold=2.0, owns=lambda owner: bool(owner.uids))
    return holds, watch, gateway


def test_a_gateway_that_owns_nothing_is_not_behind_however_old_its_watermark() -> None:
    now = [600.0]
    _, watch, _ = _watch(now)
    assert watch.lags() == {"edge-1": 0.0}


def test_after_an_attach_the_lag_counts_from_the_last_look_that_found_it_idle() -> None:
    now = [600.0]
    holds, watch, gateway = _watch(now)
    watch.lags()  # a look at 600: it owned nothing
    gateway.uids["alice"] = None
    now[0] = 600.5
    assert watch.lags() == {"edge-1": 0.5}  # not 600.5: its watermark is from before it was idle
    holds.mark(gateway, 600.4)
    assert watch.lags() == {"edge-1": pytest.approx(0.1)}


def test_a_gateway_with_sessions_and_a_stale_watermark_is_behind() -> None:
    now = [10.0]
    _, watch, gateway = _watch(now)
    gateway.uids["alice"] = None
    assert watch.lags() == {"edge-1": 10.0}


async def test_no_warning_for_an_idle_gateway_one_for_a_lagging_one(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    now = [600.0]
    _, watch, gateway = _watch(now)
    with caplog.at_level(logging.INFO, logger="idled.server.status.lagwatch"):
        watch.check()
        assert not caplog.records
        gateway.uids["alice"] = None
        await trio.sleep(CHECK_EVERY)
        now[0] = 603.0  # three seconds without an answer while it owns a session
        watch.check()
    assert [r.getMessage() for r in caplog.records][0].startswith("gateway edge-1 is 3.0 s behind")
