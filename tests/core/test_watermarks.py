"""Owner watermarks (idled.core.watermarks) through the presence table, with plain numbers.

An owner that reports watermarks (an edge) loses a session to ``idle`` only once its watermark has passed the
session's deadline. The model test at the end plays an edge that forwards keepalives with arbitrary delays
and answers marks honestly: no session that kept sending before its deadline is ever expired.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from idled.core.presence import PresenceTable
from idled.core.watermarks import COMPACT_SLACK, Holds

from tests.core import tables
from tests.core.tables import WALL0, Owner

KINDS = ("ring-lazy", "ring-eager", "scan", "heap")


def table(kind: str = "ring-lazy", *, tick: float = 1.0, timeout: float = 30.0) -> PresenceTable:
    return tables.table(kind=kind, tick=tick, timeout=timeout, max_timeout=3600.0, slots=32)


def expire(p: PresenceTable, now: float) -> list[tuple[str, Any, str]]:
    return [(e.uid, owner, e.reason) for _, owner, e in p.expire(now, WALL0 + now)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_session_due_before_its_owner_confirms_is_held_then_expires_when_the_watermark_passes(kind: str) -> None:
    p, edge = table(kind), Owner("edge")
    p.track_owner(edge, 0.0)
    p.login("a", edge, 0.0, WALL0)
    assert p.mark(edge, 10.0) is False  # nothing held yet
    assert expire(p, 31.0) == []  # due at 30, but the edge has confirmed only up to 10: held
    assert p.is_online("a") and len(p) == 1 and p.owner_of("a") is edge
    assert len(p.holds) == 1
    assert p.holds.take_wanted() == {edge: 30.0}  # the server asks this edge for a mark now
    assert p.mark(edge, 29.9) is False  # still before the deadline
    assert expire(p, 32.0) == []
    assert p.mark(edge, 31.0) is True  # past it: the session really was silent
    assert p.next_due() == float("-inf")  # due now
    assert expire(p, 32.0) == [("a", edge, "idle")]
    assert not p.is_online("a") and len(p) == 0 and len(p.holds) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_touch_that_arrives_while_held_keeps_the_session(kind: str) -> None:
    p, edge = table(kind), Owner("edge")
    p.track_owner(edge, 0.0)
    p.login("a", edge, 0.0, WALL0)
    assert expire(p, 31.0) == []  # held: the edge's keepalive is still on its way
    assert p.touch_owned("a", edge, 33.0)  # it arrives (read late: stamped 33)
    assert len(p.holds) == 0 and p.is_online("a")
    assert p.mark(edge, 40.0) is False  # nothing held any more
    assert expire(p, 62.0) == []  # the new deadline is 63
    assert p.mark(edge, 70.0) is False
    assert expire(p, 63.0) == [("a", edge, "idle")]


def test_the_offline_of_a_held_session_keeps_its_deadline_and_shows_the_wait_as_lateness() -> None:
    p, edge = table(), Owner("edge")
    p.track_owner(edge, 0.0)
    p.login("a", edge, 0.0, WALL0)
    assert expire(p, 30.0) == []
    p.mark(edge, 45.0)
    [(_, _, event)] = p.expire(45.5, WALL0 + 45.5)
    assert event.deadline == WALL0 + 30.0 and event.ts == WALL0 + 45.5  # 15.5 s late: the edge's lag


def test_owners_that_do_not_report_watermarks_are_never_held() -> None:
    p, edge, direct = table(), Owner("edge"), Owner("direct")
    p.track_owner(edge, 0.0)
    p.login("a", direct, 0.0, WALL0)
    assert expire(p, 30.0) == [("a", direct, "idle")]
    assert p.holds.take_wanted() == {}


def test_login_logout_and_end_all_see_held_sessions() -> None:
    p, edge, other = table(), Owner("edge"), Owner("other")
    p.track_owner(edge, 0.0)
    for uid in ("a", "b", "c"):
        p.login(uid, edge, 0.0, WALL0)
    assert expire(p, 31.0) == [] and len(p.holds) == 3
    previous, event = p.login("a", other, 31.0, WALL0 + 31.0)  # newest wins, from the held session: no flap
    assert previous == ("a", edge) and event is None and p.owner_of("a") is other
    assert p.logout("b", other, 31.0, WALL0 + 31.0, "closed") is None  # only the owner may end it
    ended = p.logout("b", edge, 31.0, WALL0 + 31.0, "closed")
    assert ended is not None and ended.reason == "closed"
    assert p.touch_owned("c", other, 31.0) is False  # not its session: stays held
    shutdown = sorted(e.uid for _, _, e in p.end_all(32.0, WALL0 + 32.0, "shutdown"))
    assert shutdown == ["a", "c"] and len(p) == 0 and len(p.holds) == 0
    p.mark(edge, 100.0)
    assert expire(p, 100.0) == []  # the stale queue entries are dropped, nothing expires twice


def test_an_untracked_owner_leaves_its_held_sessions_to_the_caller() -> None:
    p, edge = table(), Owner("edge")
    p.track_owner(edge, 0.0)
    p.login("a", edge, 0.0, WALL0)
    assert expire(p, 31.0) == []
    event = p.logout("a", edge, 31.0, WALL0 + 31.0, "gateway_lost")  # what the gateway-lost path does
    p.untrack_owner(edge)
    assert event is not None and event.reason == "gateway_lost" and len(p) == 0


def test_one_owner_lagging_does_not_hold_another() -> None:
    p, slow, fast = table(), Owner("slow"), Owner("fast")
    p.track_owner(slow, 0.0)
    p.track_owner(fast, 0.0)
    p.login("s", slow, 0.0, WALL0)
    p.login("f", fast, 0.0, WALL0)
    p.mark(fast, 30.5)
    assert expire(p, 31.0) == [("f", fast, "idle")]
    assert p.is_online("s")


def test_release_respects_the_limit_and_comes_back_for_the_rest() -> None:
    p, edge = table(), Owner("edge")
    p.track_owner(edge, 0.0)
    for i in range(10):
        p.login(i, edge, 0.0, WALL0)
    assert expire(p, 31.0) == []
    assert p.mark(edge, 40.0)
    first = p.expire(40.0, WALL0 + 40.0, limit=4)
    assert len(first) == 4 and p.next_due() == float("-inf")
    rest = p.expire(40.0, WALL0 + 40.0, limit=100)
    assert len(rest) == 6 and len(p) == 0


def test_the_queue_of_an_owner_that_never_answers_stays_bounded() -> None:
    """A gateway that keeps touching but never answers a mark: every session is held, touched, held again."""
    p, edge = table(timeout=3.0), Owner("edge")
    p.track_owner(edge, 0.0)
    uids = range(50)
    for uid in uids:
        p.login(uid, edge, 0.0, WALL0)
    now = 0.0
    for _ in range(40):
        now += 4.0
        expire(p, now)
        for uid in uids:
            p.touch_owned(uid, edge, now)
        expire(p, now + 3.5)
    state = p.holds._owners[edge]
    assert len(state.queue) <= 2 * state.count + COMPACT_SLACK


def test_holds_answers_for_owners_it_does_not_track() -> None:
    holds = Holds()
    owner = Owner("x")
    assert holds.mark(owner, 5.0) is False and holds.watermark(owner) is None and not holds.tracking
    holds.track(owner, 1.0)
    assert holds.tracks(owner) and holds.watermark(owner) == 1.0 and holds.lagging(3.0) == [(owner, 2.0, 0)]


# --- the model: an edge forwarding with arbitrary delays, answering marks honestly -------------------------


@settings(max_examples=150, deadline=None)
@example([(0, 0.0), (0, 0.0), (0, 0.0), (0, 2.5), (1, 1.0)], [0.0, 0.0, 0.0], "ring-lazy")  # silent 0..4: true
@given(
    st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 40.0)), min_size=1, max_size=60),  # (uid, forward delay)
    st.lists(st.floats(0.0, 40.0), min_size=1, max_size=30),  # mark round trips
    st.sampled_from(KINDS),
)
def test_no_session_that_sent_before_its_deadline_is_expired(sends: list[tuple[int, float]], trips: list[float],
                                                             kind: str) -> None:
    """Users send keepalives every 2 s (timeout 3 s); the edge forwards each one `delay` later. Marks are
    answered honestly: a mark sent at `c` is answered once every keepalive sent before `c` has reached the
    core. Any offline must then be true by the users' own send times."""
    tick, timeout = 0.5, 3.0
    p, edge = table(kind, tick=tick, timeout=timeout), Owner("edge")
    p.track_owner(edge, 0.0)
    sent: dict[int, list[float]] = {uid: [0.0] for uid in range(4)}
    arrivals: list[tuple[float, int, float]] = []  # (when the core reads it, uid, when the user sent it)
    for uid in range(4):
        p.login(uid, edge, 0.0, WALL0)
    t = 0.0
    for k, (uid, delay) in enumerate(sends):
        t = 2.0 * (k // 4 + 1)
        sent[uid].append(t)
        arrivals.append((t + delay, uid, t))
    marks: list[tuple[float, float]] = []  # (answered at, c)
    c = 0.0
    for trip in trips:
        c += 1.0 + trip / 4
        forwarded = max([a for a, _, s in arrivals if s < c], default=c)
        marks.append((max(c + trip, forwarded), c))
    now, step, ended = 0.0, tick / 2, {}
    while now < t + 60.0:
        now += step
        for a, uid, _ in arrivals:
            if now - step < a <= now:
                p.touch_owned(uid, edge, a)
        for answered, c in marks:
            if now - step < answered <= now:
                p.mark(edge, c)
        for _, _, event in p.expire(now, WALL0 + now):
            ended.setdefault(event.uid, now)
    for uid, when in ended.items():
        # True only if the user was silent for a whole timeout at some point before `when`: a keepalive sent
        # after its deadline had passed (while the edge had not yet reported up to the deadline) cannot save it.
        times = sorted(sent[uid])
        silent = next((s for s, n in zip(times, [*times[1:], math.inf]) if n >= s + timeout), None)
        assert silent is not None and when >= silent + timeout, f"uid {uid} expired at {when}, sent at {times}"
