"""Every detector against a trivially correct model (a dict of deadlines), driven by hypothesis.

The model: a key added or touched at tick ``n`` with timeout ``T`` is due at ``n + T``; advancing to ``m``
must return exactly the keys whose deadline is ``<= m`` that were not yet returned or removed.
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from idled.core.baselines import DeadlineHeap, FullScan
from idled.core.detector import Detector, Entry
from idled.core.factory import DETECTOR_KINDS, make_detector
from idled.core.wheel import TimingWheel

DEFAULT_TIMEOUT = 30
TIMEOUTS = st.sampled_from([None, 1, 2, 3, 4, 5, 7, 29, 30, 31, 32, 45, 100, 961, 1000, 3600, 86400])
JUMPS = st.one_of(st.sampled_from([0, 1, 1, 1, 2, 3, 4, 5, 31, 32]), st.integers(0, 100_000))
KEYS = st.one_of(st.integers(0, 12), st.sampled_from(["a", "b", "c", "42"]))


def build_all(start: int) -> dict[str, Detector]:
    detectors: dict[str, Detector] = {}
    for policy in ("eager", "lazy"):
        # A tiny ring pushes most keys through the overflow levels; the default one keeps most in the ring.
        detectors[f"ring-{policy}-3"] = TimingWheel(timeout=DEFAULT_TIMEOUT, slots=3, policy=policy, start=start)
        detectors[f"ring-{policy}-30"] = TimingWheel(timeout=DEFAULT_TIMEOUT, slots=30, policy=policy, start=start)
        detectors[f"ring-{policy}-7x2"] = TimingWheel(
            timeout=DEFAULT_TIMEOUT, slots=7, overflow_slots=2, policy=policy, start=start
        )
        # Tiny bucket caps: a slot is several buckets almost at once (at 1M keys it is ~3 of 10,922).
        detectors[f"ring-{policy}-30-cap2"] = TimingWheel(
            timeout=DEFAULT_TIMEOUT, slots=30, policy=policy, start=start, bucket_cap=2
        )
        detectors[f"ring-{policy}-3-cap1"] = TimingWheel(
            timeout=DEFAULT_TIMEOUT, slots=3, policy=policy, start=start, bucket_cap=1
        )
    detectors["scan"] = FullScan(timeout=DEFAULT_TIMEOUT, start=start)
    detectors["heap"] = DeadlineHeap(timeout=DEFAULT_TIMEOUT, start=start)
    return detectors


class DetectorsMatchModel(RuleBasedStateMachine):
    @initialize(start=st.sampled_from([0, 1, 29, 31, 1_000_003]))
    def setup(self, start: int) -> None:
        self.now = start
        self.last_at = start  # activity ticks never go backwards: real time doesn't
        self.model: dict[Hashable, tuple[int, int]] = {}  # key -> (deadline, timeout)
        self.detectors = build_all(start)

    def activity_at(self, ahead: int) -> int:
        self.last_at = max(self.last_at, self.now + ahead)
        return self.last_at

    @rule(key=KEYS, timeout=TIMEOUTS, ahead=st.sampled_from([0, 0, 1]))
    def add(self, key: Hashable, timeout: int | None, ahead: int) -> None:
        # ``ahead``: the server records activity at ceil(t), one tick ahead of the clock it advances with.
        at = self.activity_at(ahead)
        effective = DEFAULT_TIMEOUT if timeout is None else timeout
        self.model[key] = (at + effective, effective)
        for detector in self.detectors.values():
            detector.add(key, at, timeout)

    @rule(key=KEYS, ahead=st.sampled_from([0, 1]))
    def touch(self, key: Hashable, ahead: int) -> None:
        at = self.activity_at(ahead)
        if key in self.model:
            _, timeout = self.model[key]
            self.model[key] = (at + timeout, timeout)
        for detector in self.detectors.values():
            detector.touch(key, at)  # unknown keys must be ignored

    @rule(key=KEYS)
    def remove(self, key: Hashable) -> None:
        expected = self.model.pop(key, None) is not None
        for name, detector in self.detectors.items():
            assert detector.remove(key) == expected, name

    @rule(limit=st.sampled_from([1, 2, 1000]), times=st.integers(1, 3))
    def work_ahead(self, limit: int, times: int) -> None:
        # The server's idle-time call between ticks: it may move keys around but never change a result.
        for detector in self.detectors.values():
            for _ in range(times):
                assert detector.work_ahead(limit) <= limit

    @rule(jump=JUMPS, limit=st.sampled_from([None, None, 1, 2, 5]))
    def advance(self, jump: int, limit: int | None) -> None:
        self.now += jump
        due = {key for key, (deadline, _) in self.model.items() if deadline <= self.now}
        for key in due:
            del self.model[key]
        for name, detector in self.detectors.items():
            got: list[Hashable] = []
            for _ in range(10_000):
                got += detector.advance(self.now, limit)
                nxt = detector.next_due()
                if nxt is None or nxt > self.now:
                    break
            assert len(got) == len(set(got)), (name, got)
            assert set(got) == due, (name, sorted(map(str, got)), sorted(map(str, due)))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def step_to_next_deadline(self, data: st.DataObject) -> None:
        """Walk tick by tick up to the earliest model deadline: nothing before it, exactly it then."""
        target = min(deadline for deadline, _ in self.model.values())
        if target - self.now > 40:  # long timeouts: jump most of the way, walk the last ticks
            self.advance(target - self.now - 40, None)
        while self.now + 1 < target:
            self.advance(1, None)
        self.advance(max(0, target - self.now), data.draw(st.sampled_from([None, 1])))

    @invariant()
    def sizes_and_next_due_agree(self) -> None:
        if not hasattr(self, "model"):
            return
        earliest = min((deadline for deadline, _ in self.model.values()), default=None)
        for name, detector in self.detectors.items():
            assert len(detector) == len(self.model), name
            for key in self.model:
                assert key in detector, (name, key)
            nxt = detector.next_due()
            if earliest is None:
                assert nxt is None, name
            else:
                # Never a promise that lets a caller sleep past a deadline.
                assert nxt is not None and nxt <= earliest, (name, nxt, earliest)


TestDetectorsMatchModel = DetectorsMatchModel.TestCase
TestDetectorsMatchModel.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)


@pytest.mark.parametrize("kind", DETECTOR_KINDS)
def test_every_kind_keeps_a_24h_timeout(kind: str) -> None:
    detector = make_detector(kind, timeout=30)
    detector.add("day", 0, 86_400)
    detector.add("short", 0, 1)
    assert detector.advance(1) == ["short"]
    assert detector.advance(86_399) == []
    assert detector.advance(86_400) == ["day"]
    assert detector.next_due() is None and len(detector) == 0


@pytest.mark.parametrize("kind", DETECTOR_KINDS)
def test_jump_returns_everything_due_once(kind: str) -> None:
    detector = make_detector(kind, timeout=30)
    for i in range(1000):
        detector.add(i, i % 50, 1 + (i * 7919) % 5000)
    first = detector.advance(2_000)
    assert sorted(first) == [i for i in range(1000) if i % 50 + 1 + (i * 7919) % 5000 <= 2_000]
    rest = detector.advance(10_000)
    assert sorted(first + rest) == list(range(1000))
    assert detector.stats().expired_total == 1000


def test_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown detector"):
        make_detector("wheel", timeout=30)


@pytest.mark.parametrize("kind", DETECTOR_KINDS)
def test_bad_timeouts_are_refused_without_side_effects(kind: str) -> None:
    detector = make_detector(kind, timeout=30)
    for bad in (0, -1, 1.5, 10**9, True):
        with pytest.raises(ValueError):
            detector.add("k", 0, bad)  # type: ignore[arg-type]
    assert len(detector) == 0 and detector.next_due() is None


class Record(Entry):
    """A caller's own per-key record, as the presence table keeps one: the detector files it as given."""

    __slots__ = ("owner",)


@pytest.mark.parametrize("kind", DETECTOR_KINDS)
def test_the_callers_record_is_the_detectors_entry(kind: str) -> None:
    detector = make_detector(kind, timeout=30)
    mine = Record()
    mine.owner = "gateway-1"
    assert detector.add("k", 5, None, mine) is mine
    assert detector.entries["k"] is mine and (mine.key, mine.tick, mine.timeout) == ("k", 5, 30)
    detector.touch_entry(mine, 10)
    assert mine.tick == 10 and detector.advance(39) == []
    expired = detector.advance_entries(40)
    assert expired == [mine] and mine.owner == "gateway-1" and "k" not in detector.entries


@pytest.mark.parametrize("kind", DETECTOR_KINDS)
def test_replacing_or_removing_a_record_unfiles_the_old_one(kind: str) -> None:
    detector = make_detector(kind, timeout=30)
    first = detector.add("k", 0)
    second = detector.add("k", 20)  # a newer login: the old record must never come due
    assert detector.entries["k"] is second and first is not second
    assert detector.advance(30) == [] and detector.advance(50) == ["k"]
    detector.add("gone", 60)
    assert detector.remove("gone") and not detector.remove("gone")
    assert detector.advance(200) == [] and len(detector) == 0


@pytest.mark.parametrize("kind", DETECTOR_KINDS)
def test_an_entry_has_a_place_exactly_while_its_detector_holds_it(kind: str) -> None:
    # The user plane holds its session's record and touches it without the key's lookup
    # (PresenceTable.touch_session): ``place is None`` is how it knows the record was replaced, removed or expired.
    detector = make_detector(kind, timeout=30)
    first = detector.add("k", 0)
    assert first.place is not None
    second = detector.add("k", 5)  # replaced
    assert first.place is None and second.place is not None
    detector.touch_entry(second, 10)
    assert second.place is not None
    removed = detector.add("gone", 10)
    assert detector.remove("gone") and removed.place is None
    expired = detector.advance_entries(40)
    assert expired == [second] and second.place is None
