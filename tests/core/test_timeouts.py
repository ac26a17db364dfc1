"""The timeout rule (idled.core.timeouts): 1.5 x keepalive, never below a tick, never above max_timeout."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from idled.core.factory import make_detector
from idled.core.presence import PresenceTable, ticks_for
from idled.core.timeouts import (
    DEFAULT_MAX_TIMEOUT, DEFAULT_TICK, DEFAULT_TIMEOUT, KEEPALIVE_FACTOR, SharedTimeouts, timeout_for,
)


def test_no_keepalive_gets_the_default_itself() -> None:
    default = 42.5
    assert timeout_for(None, default, 1.0, 3600.0) is default  # the table tests the default by identity


def test_keepalive_gets_one_and_a_half_times_it() -> None:
    assert KEEPALIVE_FACTOR == 1.5
    assert timeout_for(20.0, 30.0, 1.0, 3600.0) == 30.0
    assert timeout_for(2.0, 30.0, 0.1, 3600.0) == 3.0


def test_never_below_one_tick() -> None:
    assert timeout_for(1.0, 30.0, 2.0, 3600.0) == 2.0  # 1.5 s would be shorter than the detector can see
    assert timeout_for(1.0, 30.0, 1.5, 3600.0) == 1.5


def test_never_above_max_timeout() -> None:
    assert timeout_for(1000.0, 30.0, 1.0, 600.0) == 600.0
    assert timeout_for(400.0, 30.0, 1.0, 600.0) == 600.0  # exactly the cap
    assert timeout_for(399.0, 30.0, 1.0, 600.0) == 598.5


def test_defaults_are_the_configs() -> None:
    from idled.ops.config import Config
    from idled.protocol import DEFAULT_MAX_FRAME

    cfg = Config()
    assert (cfg.timeout, cfg.tick, cfg.max_timeout, cfg.max_frame) == (
        DEFAULT_TIMEOUT, DEFAULT_TICK, DEFAULT_MAX_TIMEOUT, DEFAULT_MAX_FRAME)


@given(
    keepalive=st.floats(0.001, 86400.0),
    tick=st.floats(0.001, 60.0),
    max_over_tick=st.floats(1.0, 1000.0),
)
def test_bounds_and_the_tables_rule_agree(keepalive: float, tick: float, max_over_tick: float) -> None:
    max_timeout = tick * max_over_tick
    got = timeout_for(keepalive, 30.0, tick, max_timeout)
    assert tick <= got <= max_timeout
    if tick <= 1.5 * keepalive <= max_timeout:
        assert got == 1.5 * keepalive
    table = PresenceTable(make_detector("ring-lazy", timeout=ticks_for(max_timeout, tick), slots=8), tick=tick,
                          timeout=max_timeout, max_timeout=max_timeout, detector_name="ring-lazy")
    assert table.timeout_for(keepalive) == got


def test_shared_timeouts_one_object_per_value_and_a_bounded_table() -> None:
    default = 30.0
    shared = SharedTimeouts(default, limit=3)
    assert shared.share(30.0 + 0.0) is default
    first = shared.share(float("4.5"))
    assert shared.share(float("4.5")) is first
    assert shared.share(7.0) == 7.0  # the third value: kept
    unshared = float("9.5")
    assert shared.share(unshared) is unshared and shared.share(float("9.5")) is not unshared  # past the limit
