"""Vitals (idled.server.status.vitals): the history ring, rates, lateness percentiles and the last events."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import trio

from idled.core.events import PresenceEvent
from idled.server.status.vitals import Sample, Vitals, lateness_summary
from tests.peers import running


def sample_at(wall: float, events: int) -> Sample:
    return Sample(wall, sessions=events, users=events, connections={"user": events}, events=events)


def wall_at(t: float) -> Callable[[], float]:
    """A wall clock that reads ``t``."""
    return lambda: float(t)


def test_one_sample_per_interval_and_the_ring_is_bounded() -> None:
    vitals = Vitals(lambda wall: sample_at(wall, int(wall)), every=1.0, history=5)
    for tenth in range(100):
        vitals.sample(tenth / 10, wall_at(tenth / 10))
    walls = [s.wall for s in vitals.samples]
    assert len(walls) == 5 and walls == sorted(walls)
    assert all(b - a >= 1.0 for a, b in zip(walls, walls[1:]))


def test_sampling_is_due_on_the_monotonic_clock_whatever_the_wall_clock_does() -> None:
    vitals = Vitals(lambda wall: sample_at(wall, 0), every=1.0)
    walls = iter([1000.0, 1001.0, 1001.5, 1001.6, 1001.7])  # what the wall clock says at each sample
    for mono in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.2, 4.0):
        vitals.sample(mono, lambda: next(walls))
    assert [s.wall for s in vitals.samples] == [1000.0, 1001.0, 1001.5, 1001.6, 1001.7]  # one a second, still


def test_a_sample_already_sent_is_not_sent_again_whatever_the_rounding() -> None:
    vitals = Vitals(lambda wall: sample_at(wall, 0))
    vitals.sample(0.0, lambda: 1000.0004)  # sent as t 1000.0: the page asks for samples newer than that
    assert [s["t"] for s in vitals.live()["history"]] == [1000.0]
    assert vitals.live(since=1000.0)["history"] == []
    vitals.sample(1.0, lambda: 1000.9996)
    assert [s["t"] for s in vitals.live(since=1000.0)["history"]] == [1001.0]


def test_rate_is_events_over_the_window() -> None:
    vitals = Vitals(lambda wall: sample_at(wall, int(wall * 50)), every=1.0)
    assert vitals.rate() is None
    for second in range(120):
        vitals.sample(float(second), wall_at(second))
    assert vitals.rate(60.0) == 50.0
    assert vitals.rate(10.0) == 50.0


def test_lateness_percentiles_are_bucket_upper_bounds() -> None:
    bounds = [0.1, 0.5, 1.0, math.inf]
    cumulative = [50.0, 90.0, 99.0, 100.0]  # 50 at <= 0.1, 40 more <= 0.5, 9 more <= 1.0, 1 beyond
    summary = lateness_summary(bounds, cumulative, total=30.0)
    assert summary["count"] == 100 and summary["mean"] == 0.3
    assert (summary["p50"], summary["p90"], summary["p99"]) == (0.1, 0.5, 1.0)
    assert summary["p99_9"] is None  # beyond the last finite bound: not knowable from the histogram
    assert [b["count"] for b in summary["buckets"]] == [50, 40, 9, 1]
    empty = lateness_summary(bounds, [0.0] * 4, total=0.0)
    assert empty["p50"] is None and empty["mean"] is None


def test_recent_events_after_a_seq() -> None:
    vitals = Vitals(lambda wall: sample_at(wall, 0), recent=3)
    for seq in range(1, 6):
        vitals.on_event(PresenceEvent(seq, "online", f"u{seq}", 1.0, "login", 1.0, 31.0, 30.0, "ring"))
    assert [r["seq"] for r in vitals.recent()] == [3, 4, 5]
    assert [r["uid"] for r in vitals.recent(after=4)] == ["u5"]


async def test_a_running_server_samples_itself_and_keeps_its_events(tmp_path: Path) -> None:
    async with running(tmp_path, tick=0.1) as h:
        alice = await h.user("alice", keepalive=1)
        with trio.fail_after(10):
            while not any(e["kind"] == "offline" for e in h.server.vitals.recent()):
                await trio.sleep(0.05)  # alice sends nothing: idle after 1.5 s
        document = h.server.vitals.document()
        assert [(e["uid"], e["kind"]) for e in document["recent_events"]] == [("alice", "online"), ("alice", "offline")]
        assert document["history"] and document["history"][-1]["events"] >= 1
        assert document["lateness"]["count"] == 1 and document["lateness"]["p99"] is not None
        await alice.stream.aclose()


def test_live_sends_only_the_events_and_samples_a_poll_has_not_seen() -> None:
    vitals = Vitals(lambda wall: sample_at(wall, int(wall)), recent=5)
    for second in range(10):
        vitals.sample(float(second), wall_at(second))
    for seq in range(1, 8):
        vitals.on_event(PresenceEvent(seq, "online", f"u{seq}", 1.0, "login", 1.0, 31.0, 30.0, "ring"))
    first = vitals.live()
    assert [s["t"] for s in first["history"]] == [float(s) for s in range(10)]
    assert [e["seq"] for e in first["recent_events"]] == [3, 4, 5, 6, 7] and first["recent_limit"] == 5
    later = vitals.live(after=5, since=7.0)
    assert [s["t"] for s in later["history"]] == [8.0, 9.0]
    assert [e["seq"] for e in later["recent_events"]] == [6, 7]
    nothing = vitals.live(after=7, since=9.0)
    assert nothing["history"] == [] and nothing["recent_events"] == []
    assert set(nothing) == {"history", "rates", "lateness", "recent_events", "recent_limit"}


def test_live_sends_an_int_uid_a_browser_would_round_as_a_string() -> None:
    vitals = Vitals(lambda wall: sample_at(wall, 0))
    for seq, uid in enumerate((42, 2**53 + 1, "alice"), start=1):
        vitals.on_event(PresenceEvent(seq, "online", uid, 1.0, "login", 1.0, 31.0, 30.0, "ring"))
    assert [e["uid"] for e in vitals.live()["recent_events"]] == [42, str(2**53 + 1), "alice"]
