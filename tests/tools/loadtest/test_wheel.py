"""The user engine's timing wheel and keepalive schedule, with plain numbers (no clock, no sockets)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.tools.loadtest.wheel import Schedule, TimerWheel


def test_the_worked_example_of_the_docstring() -> None:
    wheel = TimerWheel(0.01)
    assert wheel.next_time() is None and wheel.due(5.0) == []
    wheel.add(7, 1.234)
    wheel.add(9, 1.239)
    wheel.add(4, 1.301)
    assert wheel.size == 3
    assert wheel.next_time() == pytest.approx(1.23)
    assert wheel.due(1.2299) == []
    assert wheel.due(1.2300) == [7, 9]
    assert wheel.next_time() == pytest.approx(1.30)
    assert wheel.due(10.0) == [4]
    assert wheel.size == 0 and wheel.next_time() is None


def test_an_entry_filed_for_a_past_slot_comes_back_on_the_next_call_not_this_one() -> None:
    wheel = TimerWheel(0.01)
    wheel.add(1, 0.5)
    first = wheel.due(1.0)
    assert first == [1]
    wheel.add(2, 1.0)  # what a handler does while processing `first`: re-file "now"
    wheel.add(3, 0.2)  # or even in the past
    assert first == [1]  # the returned list is not the wheel's own
    assert wheel.due(1.0) == [3, 2]  # slot order
    assert wheel.due(1.0) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=1, max_size=200),
       st.floats(0.001, 0.05), st.floats(0.0005, 0.02))
def test_every_entry_comes_back_once_never_more_than_a_slot_early(times: list[float], width: float,
                                                                   step: float) -> None:
    wheel = TimerWheel(width)
    for entry, t in enumerate(times):
        wheel.add(entry, t)
    seen: dict[int, float] = {}
    now = 0.0
    while wheel.size:
        for entry in wheel.due(now):
            assert entry not in seen
            seen[entry] = now
        now += step
    assert sorted(seen) == list(range(len(times)))
    for entry, at in seen.items():
        assert at >= times[entry] - width - 1e-9  # at most one slot early
        assert at <= times[entry] + step + 1e-9  # and as soon as the sweep reached its slot


def test_slot_width_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TimerWheel(0.0)


def _schedule(ping_every: float | None) -> Schedule:
    return Schedule(30.0, 0.1, ping_every, fast_from=10.0, rand=random.Random(7).random)


def test_keepalives_follow_the_load_tests_rule() -> None:
    slow, fast = _schedule(None), _schedule(1.0)
    for _ in range(200):
        assert 30 * 0.9 <= slow.next(3.0) - 3.0 <= 30 * 1.1  # every K x U(1 - jitter, 1 + jitter)
        assert 1.5 <= slow.first(0.0) <= 30.0  # the first at a random phase in (0.05 K, K]
        assert 10.0 < fast.next(3.0) <= 11.0  # due after the ramp's end: joins the --ping-every schedule
        assert 12.0 + 0.9 <= fast.next(12.0) <= 12.0 + 1.1  # on it: every S x U(1 - jitter, 1 + jitter)
        assert 12.0 < fast.first(12.0) <= 13.0  # logged in after the ramp's end


def test_the_schedule_is_reproducible_from_its_random_source() -> None:
    a, b = _schedule(None), _schedule(None)
    assert [a.next(float(t)) for t in range(50)] == [b.next(float(t)) for t in range(50)]


def test_an_origin_shifts_every_slot_boundary() -> None:
    wheel = TimerWheel(0.04, origin=0.015)  # e.g. worker 3 of 8: slots start at 0.015 + 0.04 s
    wheel.add(1, 0.050)  # in the slot [0.015, 0.055)
    wheel.add(2, 0.056)  # in the next, [0.055, 0.095)
    assert wheel.next_time() == pytest.approx(0.015)
    assert wheel.due(0.0149) == []
    assert wheel.due(0.015) == [1]
    assert wheel.next_time() == pytest.approx(0.055)
    assert wheel.due(0.0549) == [] and wheel.due(0.055) == [2]
