"""idled/gcpolicy.py: survivors of a full collection are frozen; a thaw lets cycles be reclaimed again."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from idled.ops.gcpolicy import FULL_WALK_LOG, GcPolicy


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def policy() -> Iterator[tuple[GcPolicy, list[float]]]:
    now = [0.0]
    policy = GcPolicy(thaw_every=60.0, clock=lambda: now[0])
    policy.start()
    try:
        yield policy, now
    finally:
        policy.stop()


def test_start_freezes_what_exists(policy: tuple[GcPolicy, list[float]]) -> None:
    assert gc.get_freeze_count() > 0
    assert policy[0]._on_gc in gc.callbacks


def test_survivors_of_a_full_collection_are_frozen(policy: tuple[GcPolicy, list[float]]) -> None:
    gp, _ = policy
    live = [Node() for _ in range(1000)]  # tracked objects that stay alive
    before = gc.get_freeze_count()
    gc.collect()
    assert gp.full_collections >= 1
    assert gc.get_freeze_count() >= before + len(live)
    assert gc.get_count()[0] < 700  # the young generation was merged into the frozen one too


def test_a_frozen_cycle_is_reclaimed_after_the_thaw(policy: tuple[GcPolicy, list[float]]) -> None:
    gp, now = policy
    a, b = Node(), Node()
    a.other, b.other = b, a
    probe = weakref.ref(a)
    gc.collect()  # the cycle is live: frozen with the rest
    del a, b  # now it is garbage, but frozen: the collector does not see it
    gc.collect()
    assert probe() is not None
    assert not gp.maybe_thaw()  # not yet time
    now[0] = 61.0
    assert gp.maybe_thaw() and gp.thaws == 1  # the thaw walks everything at once ...
    assert probe() is None
    assert gc.get_freeze_count() > 0  # ... and refreezes the survivors


def test_each_thaw_is_one_full_walk_logged_with_its_duration(
        policy: tuple[GcPolicy, list[float]], caplog: pytest.LogCaptureFixture) -> None:
    gp, now = policy
    gc.collect()  # an ordinary full collection (nothing thawed): not a walk of everything
    gp._clock = iter([61.0, 61.0, 61.25]).__next__  # the thaw's check, the walk's start, its stop
    with caplog.at_level("INFO", logger="idled.ops.gcpolicy"):
        assert gp.maybe_thaw()
    assert gp.walks == [0.25]
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [f"{FULL_WALK_LOG} 250.0 ms"]
    assert "ms CPU) over" in caplog.records[0].getMessage()  # the walk's own work, apart from the pause


def test_stop_undoes_everything() -> None:
    gp = GcPolicy()
    gp.start()
    gp.stop()
    assert gc.get_freeze_count() == 0 and gp._on_gc not in gc.callbacks


def test_processes_started_together_walk_at_their_own_phases() -> None:
    now = [0.0]
    policies = [GcPolicy(thaw_every=60.0, clock=lambda: now[0], phase=lambda k=k: k / 4) for k in range(4)]
    for gp in policies:
        gp.start()
        gp.stop()  # (the first thaw's time is fixed at start)
    first = []
    for t in range(30, 61):
        now[0] = float(t)
        first += [t for gp in policies if gp.thaws == 0 and gp.maybe_thaw()]
    assert first == [30, 38, 45, 53]  # 60 x (0.5 + 0.5 x phase): spread over the second half
    now[0] = 90.0
    assert [gp.maybe_thaw() for gp in policies] == [True, False, False, False]  # then every 60 s from there


def test_a_short_thaw_interval_is_checked_often_enough() -> None:
    assert GcPolicy(thaw_every=20.0).check_every == 2.0  # a walk at most 10% late
    assert GcPolicy().check_every == 60.0


def frozen_garbage(count: int) -> None:
    """``count`` objects in cycles that are live, frozen by a full collection, then dropped: garbage only a
    thaw can reclaim (a closed connection's task, coroutine and stream, in a server)."""
    cycles = []
    for _ in range(count // 2):
        a, b = Node(), Node()
        a.other, b.other = b, a
        cycles.append(a)
    gc.collect()
    del cycles, a, b


def test_thaws_that_find_nothing_back_off_to_a_day(policy: tuple[GcPolicy, list[float]]) -> None:
    # A core behind edges: sessions and a few gateways, nothing dies in cycles. Each walk of everything
    # costs ~0.2 s at 1M sessions for nothing, so the wait doubles, up to thaw_every_max.
    gp, now = policy
    gp.thaw_every_max = 500.0
    intervals = []
    for _ in range(5):
        now[0] += gp.interval
        assert gp.maybe_thaw()
        gc.collect()
        intervals.append(gp.interval)
    assert intervals == [120.0, 240.0, 480.0, 500.0, 500.0]
    assert gp.last_reclaimed is not None and gp.last_reclaimed < gp.fruitful
    now[0] += 499.0
    assert not gp.maybe_thaw()


def test_a_fruitful_thaw_brings_the_interval_back(policy: tuple[GcPolicy, list[float]]) -> None:
    # An edge: users come and go, and their frozen tasks and streams die in cycles. Thaws stay frequent.
    gp, now = policy
    gp.fruitful = 1000
    now[0] += gp.interval
    assert gp.maybe_thaw()
    gc.collect()
    assert gp.interval == 120.0  # found nothing: wait longer
    frozen_garbage(3000)
    now[0] += gp.interval
    assert gp.maybe_thaw()
    gc.collect()
    assert gp.last_reclaimed is not None and gp.last_reclaimed >= 3000
    assert gp.interval == 60.0
