"""The worked examples of idled/wheel.py's docstring, and the wheel's own mechanics."""

from __future__ import annotations

import pytest

from idled.core.wheel import TimingWheel


def test_docstring_ring_example() -> None:
    wheel = TimingWheel(timeout=3, slots=3, policy="eager")
    wheel.add("a", 0)
    wheel.add("b", 1)
    assert wheel.advance(2) == []
    wheel.touch("a", 2)
    assert wheel.advance(4) == ["b"]
    assert wheel.advance(5) == ["a"]
    assert len(wheel) == 0 and wheel.next_due() is None


def test_docstring_overflow_example() -> None:
    # slots=3: ring span 4 ticks, so a key due at 10 waits in level-1 bucket v=2 (deadlines 8..11).
    wheel = TimingWheel(timeout=3, slots=3, policy="eager")
    wheel.add("k", 0, 10)
    stats = wheel.stats()
    assert (stats.overflow_keys, stats.overflow_levels) == (1, 1)
    assert wheel.next_due() == 8  # the cascade, not the expiry
    assert wheel.advance(8) == []
    assert wheel.stats().overflow_keys == 0  # moved down to the ring
    assert wheel.next_due() == 10
    assert wheel.advance(9) == []
    assert wheel.advance(10) == ["k"]


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_a_deadline_one_revolution_out_is_parked_in_the_ring(policy: str) -> None:
    # slots=3: ring span 4; deadline 6 is parked in bucket 6 % 4, which comes due at 2, not in level 1.
    wheel = TimingWheel(timeout=6, slots=3, policy=policy)  # type: ignore[arg-type]
    wheel.add("k", 0)
    assert (wheel.stats().overflow_keys, wheel.stats().overflow_levels) == (0, 0)
    assert wheel.stats().largest_slot == 0  # beside the ring, in the parking bucket of slot 6 % 4
    assert wheel.next_due() == 2
    assert wheel.advance(2) == []  # re-filed by its deadline, which now fits the ring
    assert wheel.next_due() == 6
    wheel.touch("k", 5)  # deadline 11: parked again (eager at once, lazy when 6 comes due)
    assert wheel.advance(6) == []
    assert wheel.next_due() == 7
    assert wheel.advance(10) == []
    assert wheel.advance(11) == ["k"]
    assert wheel.stats().overflow_levels == 0


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_a_tick_expires_before_it_refiles_parked_keys(policy: str) -> None:
    wheel = TimingWheel(timeout=2, slots=3, policy=policy)  # type: ignore[arg-type]
    for key in range(5):
        wheel.add(f"parked{key}", 0, 6)  # parked in slot 2's parking bucket
    wheel.add("due", 0)  # due at 2, in slot 2's ring bucket
    assert wheel.advance(2, limit=1) == ["due"]  # examined first, whatever was filed before it
    assert wheel.next_due() == 2  # the parked keys are re-filed next, still at tick 2
    assert wheel.advance(2) == [] and wheel.next_due() == 6


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_timeout_equal_to_slots_stays_in_the_ring(policy: str) -> None:
    # The common case: touched during tick `now` (recorded at now + 1) with a 30-tick timeout, 30 slots.
    wheel = TimingWheel(timeout=30, slots=30, policy=policy)  # type: ignore[arg-type]
    wheel.advance(100)
    wheel.add("k", 101)
    assert wheel.stats().overflow_keys == 0
    assert wheel.advance(130) == []
    assert wheel.advance(131) == ["k"]


def test_lazy_touch_is_a_store_and_refiles_when_due() -> None:
    wheel = TimingWheel(timeout=5, slots=8, policy="lazy")
    wheel.add("k", 0)
    wheel.touch("k", 3)  # deadline 8, but still filed at 5
    assert wheel.next_due() == 5
    assert wheel.advance(5) == []  # re-filed, not expired
    assert wheel.next_due() == 8
    assert wheel.advance(8) == ["k"]


def test_eager_touch_moves_the_key() -> None:
    wheel = TimingWheel(timeout=5, slots=8, policy="eager")
    wheel.add("k", 0)
    wheel.touch("k", 3)
    assert wheel.next_due() == 8
    assert wheel.stats().largest_slot == 1


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_chunked_advance_examines_at_most_limit_keys(policy: str) -> None:
    wheel = TimingWheel(timeout=10, policy=policy)  # type: ignore[arg-type]
    for i in range(100):
        wheel.add(i, 0)
    got: list[object] = []
    calls = 0
    while (due := wheel.next_due()) is not None and due <= 10:
        batch = wheel.advance(10, limit=7)
        assert len(batch) <= 7
        got += batch
        calls += 1
    assert sorted(got) == list(range(100)) and calls >= 15


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_keys_touched_while_their_bucket_is_draining_survive(policy: str) -> None:
    wheel = TimingWheel(timeout=10, policy=policy)  # type: ignore[arg-type]
    for i in range(10):
        wheel.add(i, 0)
    first = wheel.advance(10, limit=3)
    survivors = [i for i in range(10) if i not in first]
    wheel.touch(survivors[0], 10)  # activity arrives between two chunks
    wheel.remove(survivors[1])
    rest: list[object] = []
    while (due := wheel.next_due()) is not None and due <= 10:
        rest += wheel.advance(10, limit=3)
    assert sorted(first + rest) == sorted(set(range(10)) - {survivors[0], survivors[1]})
    assert wheel.advance(20) == [survivors[0]]


def test_overdue_add_expires_at_the_next_advance() -> None:
    wheel = TimingWheel(timeout=3, policy="eager")
    wheel.advance(50)
    wheel.add("late", 40)  # activity reported from behind the wheel's clock: already due
    assert wheel.next_due() == 50
    assert wheel.advance(50) == ["late"]


def test_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError):
        TimingWheel(timeout=3, slots=0)
    with pytest.raises(ValueError):
        TimingWheel(timeout=3, policy="sometimes")  # type: ignore[arg-type]
    wheel = TimingWheel(timeout=3)
    wheel.advance(10)
    with pytest.raises(ValueError, match="backwards"):
        wheel.advance(9)
    with pytest.raises(ValueError):
        wheel.advance(11, limit=0)


def test_stats_snapshot() -> None:
    wheel = TimingWheel(timeout=30, slots=30, policy="eager")
    for i in range(50):
        wheel.add(i, i % 3)
    wheel.add("long", 0, 3600)
    stats = wheel.stats()
    assert stats.keys == 51 and stats.slots == 31
    # Activity at tick 2 says real time reached tick 1: the clock catches up over empty ticks, so deadline
    # 32 fits the ring too; only the hour-long timeout goes to the overflow wheel.
    assert stats.occupied_slots == 3 and stats.largest_slot == 17
    assert stats.overflow_keys == 1 and stats.expired_total == 0


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_a_clock_left_behind_catches_up_instead_of_overflowing(policy: str) -> None:
    # A caller that advances only when next_due() says so: chatty clients keep every deadline ~30 ticks
    # ahead, so nothing is due for a long time and the wheel's clock stays where it was.
    wheel = TimingWheel(timeout=30, slots=30, policy=policy)  # type: ignore[arg-type]
    wheel.add("due-at-30", 0)
    for now in range(1, 30):
        wheel.add(f"k{now}", now)
        wheel.touch("due-at-30", now)
    assert wheel.stats().overflow_keys == 0
    # ...and it never skips a bucket that is due.
    assert wheel.next_due() is not None and wheel.next_due() <= 31



def test_work_ahead_leaves_only_the_silent_keys_for_the_tick() -> None:
    wheel = TimingWheel(timeout=5, slots=8, policy="lazy")
    for key in range(10):
        wheel.add(key, 0)  # all due at 5
    for key in [1, 2, 3, 4, 5, 6, 7, 9]:
        wheel.touch(key, 2)  # keys 0 and 8 stay silent
    assert wheel.work_ahead(4) == 4  # chunked: a snapshot of the bucket (0..9) walked in parts
    wheel.touch(8, 3)  # activity before the rest of the walk counts too
    wheel.remove(9)  # and a key removed meanwhile is skipped
    assert wheel.work_ahead(100) == 6
    assert wheel.work_ahead(100) == 0  # nothing left before the next tick
    sizes = sorted(len(bucket) for bucket in wheel._ring if bucket)
    assert sizes == [1, 1, 7]  # key 0 alone at 5; keys 1..7 at 7; key 8 at 8
    assert wheel.advance(5, limit=1) == [0]  # the tick examines only the silent key
    assert wheel.advance(5) == [] and wheel.next_due() == 7
    assert sorted(wheel.advance(7)) == list(range(1, 8))
    assert wheel.advance(8) == [8]


@pytest.mark.parametrize("policy", ["eager", "lazy"])
def test_a_slot_past_the_bucket_cap_is_several_buckets(policy: str) -> None:
    # Why: a dict grows in one go, copying every item; capped buckets keep each growth small (module doc).
    wheel = TimingWheel(timeout=30, slots=30, policy=policy, bucket_cap=8)  # type: ignore[arg-type]
    for key in range(100):
        wheel.add(key, 0)  # all due at 30: one ring slot
    buckets = [wheel._ring[30], *wheel._full[30]]
    assert [len(b) for b in buckets] == [4] + [8] * 12  # the current bucket and the full ones set aside
    assert wheel.stats().largest_slot == 100 and wheel.next_due() == 30
    for key in range(0, 100, 2):
        wheel.touch(key, 10)  # even keys speak: due at 40 (eager: moved now; lazy: re-filed at 30)
    if policy == "lazy":
        assert wheel.work_ahead(1000) == 100  # walks every bucket of the slot
    expired = wheel.advance(30, limit=7)
    while (due := wheel.next_due()) is not None and due <= 30:
        expired += wheel.advance(30, limit=7)  # chunks of 7 across the slot's buckets
    assert sorted(expired) == list(range(1, 100, 2))
    assert wheel.advance(39) == [] and sorted(wheel.advance(40)) == list(range(0, 100, 2))
    assert all(len(b) <= 8 for b in [*wheel._ring, *wheel._parked] + [b for f in wheel._full for b in f])
    assert len(wheel) == 0 and wheel.next_due() is None
