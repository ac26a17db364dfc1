"""The wall clock that never goes backwards (idled.core.wallclock): plain floats in, our time out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idled.core.wallclock import JITTER, MAX_SLEW, MonotonicWall

T0 = 1_800_000_000.0  # a wall time (unix seconds)


def test_in_sync_it_is_the_system_clock_and_elapsed_time_is_exact() -> None:
    clock = MonotonicWall()
    readings = [clock.read(T0 + mono, 50.0 + mono) for mono in (0.0, 0.25, 1.0, 7.5, 3600.0)]
    assert readings == [T0, T0 + 0.25, T0 + 1.0, T0 + 7.5, T0 + 3600.0]
    assert clock.steps == 0 and clock.ahead() == 0.0


def test_a_forward_step_is_followed_at_once() -> None:
    clock = MonotonicWall()
    clock.read(T0, 0.0)
    assert clock.read(T0 + 1.0 + 3600.0, 1.0) == T0 + 1.0 + 3600.0
    assert (clock.steps, clock.last_step) == (1, 3600.0)
    assert clock.read(T0 + 3602.0, 2.0) == T0 + 3602.0  # and in sync after it


def test_a_backward_step_is_slewed_away_never_followed() -> None:
    clock = MonotonicWall(slew=0.1)
    clock.read(1000.0, 0.0)
    clock.read(1010.0, 10.0)
    assert clock.read(920.0, 20.0) == pytest.approx(1019.0)  # the module docstring's worked example
    assert (clock.steps, clock.last_step) == (1, -100.0)
    assert clock.ahead() == pytest.approx(99.0)
    assert clock.read(1020.0, 120.0) == pytest.approx(1109.0)
    assert clock.ahead() == pytest.approx(89.0)
    assert clock.read(1900.0, 1000.0) == pytest.approx(1901.0)  # offset 989 - 0.1 x 880: 1 s ahead
    assert clock.read(1920.0, 1020.0) == 1920.0  # met (at mono 1010: 990 s after the step) and followed
    assert clock.ahead() == 0.0
    assert clock.read(1930.0, 1030.0) == 1930.0  # and in sync from there
    assert clock.steps == 1


def test_while_slewing_time_runs_at_least_eleven_twelfths_as_fast() -> None:
    clock = MonotonicWall()
    clock.read(T0, 0.0)
    previous = clock.read(T0 - 3600.0 + 1.0, 1.0)
    for mono in range(2, 100):
        now = clock.read(T0 - 3600.0 + mono, float(mono))
        assert (1 - MAX_SLEW) * 1.0 - 1e-6 <= now - previous <= 1.0
        previous = now
    assert clock.ahead() == pytest.approx(3600.0 - MAX_SLEW * 99.0)


def test_jitter_below_the_threshold_is_absorbed() -> None:
    clock = MonotonicWall()
    clock.read(T0, 0.0)
    assert clock.read(T0 + 1.0 + JITTER / 2, 1.0) == T0 + 1.0  # a little ahead: not a step
    assert clock.read(T0 + 2.0 - JITTER / 2, 2.0) == T0 + 2.0  # a little behind: nor this
    assert clock.steps == 0


def test_floor_starts_a_run_at_or_after_the_last_logged_time() -> None:
    clock = MonotonicWall(slew=0.1)
    clock.floor(T0, 5.0)  # the log's last ts; the clock was stepped back 100 s while the daemon was down
    assert clock.read(T0 - 100.0, 5.0) == T0
    assert clock.read(T0 - 90.0, 15.0) == pytest.approx(T0 + 9.0)  # slewing from there
    ahead_of_us = MonotonicWall()
    ahead_of_us.floor(T0, 5.0)  # the system clock is past the last ts (the usual restart): simply it
    assert ahead_of_us.read(T0 + 60.0, 5.0) == T0 + 60.0
    floored_later = MonotonicWall()
    floored_later.read(T0, 0.0)
    floored_later.floor(T0 + 500.0, 1.0)  # a floor above a running clock lifts it
    assert floored_later.read(T0 + 1.0, 1.0) == T0 + 500.0


def test_bad_parameters_are_refused() -> None:
    for slew, jitter in ((0.0, 0.001), (1.0, 0.001), (0.1, -1.0), (0.1, float("inf"))):
        with pytest.raises(ValueError, match="slew"):
            MonotonicWall(slew=slew, jitter=jitter)


wall_steps = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
mono_steps = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)


@given(st.lists(st.tuples(wall_steps, mono_steps), max_size=60), st.floats(min_value=-1e6, max_value=1e6))
def test_our_time_never_decreases_whatever_the_readings(moves: list[tuple[float, float]], floor: float) -> None:
    clock = MonotonicWall()
    wall, mono = T0, 100.0
    previous = clock.read(wall, mono)
    for index, (wall_move, mono_move) in enumerate(moves):
        wall += mono_move + wall_move  # the wall clock advances with mono, plus any step
        mono += mono_move
        if index == len(moves) // 2:
            clock.floor(T0 + floor, mono)
            previous = max(previous, T0 + floor)
        now = clock.read(wall, mono)
        assert now >= previous
        # ... and never ahead of both the system clock and our previous time plus the elapsed time
        assert now <= max(wall + JITTER, previous + mono_move) + 1e-5
        previous = now


@given(st.lists(st.tuples(st.floats(min_value=0.0, max_value=1e5), mono_steps), max_size=40))
def test_forward_steps_are_followed_and_elapsed_time_is_exact_between_them(
    moves: list[tuple[float, float]],
) -> None:
    clock = MonotonicWall()
    wall, mono = T0, 0.0
    clock.read(wall, mono)
    for forward, elapsed in moves:
        wall += elapsed + forward
        mono += elapsed
        assert clock.read(wall, mono) == pytest.approx(wall, abs=JITTER + 1e-6)  # the system's, up to the jitter
        assert clock.ahead() == 0.0


@given(st.lists(st.floats(min_value=-1e3, max_value=1e3), max_size=40), st.floats(min_value=0.0, max_value=1.0))
def test_readings_out_of_order_never_take_time_back(walls: list[float], mono: float) -> None:
    clock = MonotonicWall()
    previous = -float("inf")
    for index, wall in enumerate(walls):
        now = clock.read(T0 + wall, mono - index)  # a monotonic clock that goes back: counted as no time at all
        assert now >= previous
        previous = now
