"""idled.core.presence: the session rules, driven by a fake clock (plain floats passed in; nothing sleeps).

`now` is the server's monotonic clock, `wall` the unix time the caller read alongside it; the table turns
one into the other in event records (``wall - (now - t)``). Every test here builds the real detector the
server uses (``make_detector``), so the tick arithmetic under test is the production one.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.core.factory import make_detector
from idled.core.presence import PresenceEvent, PresenceTable

from tests.core.tables import Owner, table, wall


def run_until_expired(p: PresenceTable, uid: Any, horizon: float) -> tuple[float, PresenceEvent]:
    """Drive `p` the way the server's tick task does: sleep until next_due(), expire at exactly that time.

    Returns (the time the offline fired, the event). Fails if a wake-up returns nothing without moving
    next_due() later (the tick task would spin) or if nothing fires before `horizon`.
    """
    while True:
        due = p.next_due()
        assert due is not None, "nothing watched"
        assert due <= horizon, f"{uid!r} not expired by {horizon}"
        fired = p.expire(due, wall(due))
        for _key, _owner, event in fired:
            if event.uid == uid:
                return due, event
        after = p.next_due()
        assert after is None or after > due, f"expire({due!r}) returned nothing and next_due() stayed at {after!r}"


# -- login / online events ---------------------------------------------------------------------------


def test_login_emits_online_with_wall_clock_fields() -> None:
    p = table(first_seq=7)
    alice = Owner("alice")
    previous, event = p.login("alice", alice, 3.0, wall(3.0))
    assert previous is None
    assert event == PresenceEvent(
        seq=7, kind="online", uid="alice", ts=wall(3.0), reason="login", last_seen=wall(3.0),
        deadline=wall(3.0) + 1.0, timeout=1.0, detector="ring-lazy",
    )
    assert p.is_online("alice") and p.owner_of("alice") is alice and len(p) == 1
    assert p.next_seq == 8
    assert event.record()["seq"] == 7 and event.record()["kind"] == "online"


def test_seq_numbers_are_consecutive_across_every_kind_of_change() -> None:
    p = table(first_seq=100)
    a, b, gw = Owner("a"), Owner("b"), Owner("gw")
    seqs = []
    seqs.append(p.login("a", a, 0.0, wall(0.0))[1].seq)
    seqs.append(p.login("b", b, 0.0, wall(0.0))[1].seq)
    assert p.login("b", gw, 0.5, wall(0.5))[1] is None  # a takeover emits nothing and uses no seq
    seqs.append(p.logout("a", a, 0.6, wall(0.6), "logout").seq)
    _, event = run_until_expired(p, "b", 5.0)
    seqs.append(event.seq)
    seqs.append(p.restart_event({"uid": "c", "last_seen": wall(0.0), "timeout": 1.0}, wall(2.0)).seq)
    p.login("d", Owner("d"), 2.0, wall(2.0))
    seqs.extend(e.seq for _, _, e in p.end_all(2.1, wall(2.1), "shutdown"))
    assert seqs == [100, 101, 102, 103, 104, 106]
    assert p.next_seq == 107


# -- touch and expiry -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ring-lazy", "ring-eager", "scan", "heap"])
def test_expires_at_the_first_tick_at_or_after_the_deadline(kind: str) -> None:
    p = table(tick=0.1, timeout=1.0, kind=kind)
    owner = Owner("u")
    p.login("u", owner, 0.03, wall(0.03))
    p.touch("u", 0.42)  # deadline 1.42 -> first tick at or after it: 1.5
    fired_at, event = run_until_expired(p, "u", 10.0)
    assert fired_at == pytest.approx(1.5)
    assert 1.42 <= fired_at < 1.42 + 0.1 + 1e-9
    assert (event.kind, event.reason, event.uid, event.seq) == ("offline", "idle", "u", 2)
    assert event.ts == wall(fired_at)
    assert event.last_seen == pytest.approx(wall(0.42), abs=1e-6)
    assert event.deadline == pytest.approx(wall(1.42), abs=1e-6)
    assert event.timeout == 1.0 and event.detector == kind
    assert not p.is_online("u") and len(p) == 0 and p.next_due() is None


def test_never_early_when_polled_densely() -> None:
    """Calling expire() at every millisecond (the order a real loop might) fires at the same tick."""
    p = table(tick=0.1, timeout=1.0)
    p.login("u", Owner("u"), 0.0, wall(0.0))
    p.touch("u", 0.251)
    fired = None
    for ms in range(0, 3000):
        now = ms / 1000
        if p.expire(now, wall(now)):
            fired = now
            break
    assert fired is not None and 1.251 <= fired <= 1.3 + 1e-9


def test_touch_keeps_a_session_online() -> None:
    p = table(tick=0.1, timeout=1.0)
    p.login("u", Owner("u"), 0.0, wall(0.0))
    for i in range(1, 40):  # a keepalive every 0.5 s for ~20 s
        now = i * 0.5
        assert p.expire(now, wall(now)) == []
        p.touch("u", now)
    assert p.is_online("u")
    fired_at, event = run_until_expired(p, "u", 30.0)
    assert 20.5 <= fired_at <= 20.6 + 1e-9
    assert event.last_seen == pytest.approx(wall(19.5), abs=1e-6)


def test_touch_of_an_unknown_uid_is_ignored() -> None:
    p = table()
    p.touch("ghost", 1.0)
    assert not p.is_online("ghost") and p.next_due() is None and p.next_seq == 1


def test_expire_returns_owners_and_respects_the_chunk_limit() -> None:
    p = table(tick=0.1, timeout=1.0)
    owners = {f"u{i}": Owner(f"u{i}") for i in range(10)}
    for uid, owner in owners.items():
        p.login(uid, owner, 0.0, wall(0.0))
    got: list[tuple[PresenceEvent, Any]] = []
    while len(got) < 10:
        chunk = p.expire(1.0, wall(1.0), limit=3)
        assert 0 < len(chunk) <= 3
        got.extend(chunk)
    assert {e.uid for _, _, e in got} == set(owners)
    assert all(owners[e.uid] is owner for _, owner, e in got)
    assert sorted(e.seq for _, _, e in got) == list(range(11, 21))
    assert p.expire(1.0, wall(1.0)) == [] and len(p) == 0


def test_next_due_is_a_time_at_which_expire_fires() -> None:
    """The tick task sleeps until next_due() and calls expire() with exactly that time (a virtual clock
    wakes it at exactly the deadline). For tick 0.1, 43 * 0.1 / 0.1 < 43 in floating point: a due time of
    43 * 0.1 would make expire() see tick 42, return nothing, and the tick task spin at 4.3 forever."""
    for tick in (0.1, 0.3, 0.01, 0.7):
        p = table(tick=tick, timeout=tick * 5)
        for i in range(200):
            now = i * tick * 0.37
            p.login(i, Owner(str(i)), now, wall(now))
        remaining = set(range(200))
        while remaining:
            due = p.next_due()
            assert due is not None
            fired = p.expire(due, wall(due))
            if not fired:
                after = p.next_due()
                assert after is None or after > due, f"tick {tick}: nothing due at {due!r}, next_due stays"
            remaining -= {e.uid for _, _, e in fired}


# -- the MQTT timeout rule --------------------------------------------------------------------------------


def test_timeout_rule_is_min_of_one_and_a_half_keepalive_and_max_timeout() -> None:
    p = table(tick=0.1, timeout=1.0, max_timeout=60.0)
    assert p.timeout_for(None) == 1.0
    assert p.timeout_for(10) == 15.0
    assert p.timeout_for(2.0) == 3.0
    assert p.timeout_for(40) == 60.0  # 60 = max_timeout < 1.5 * 40
    assert p.timeout_for(86400) == 60.0
    assert p.timeout_for(0.01) == 0.1  # never below one tick


def test_keepalive_session_expires_after_one_and_a_half_keepalives() -> None:
    p = table(tick=0.1, timeout=1.0)
    _, online = p.login("k", Owner("k"), 0.0, wall(0.0), keepalive=2.0)
    assert p.timeout_of("k") == 3.0
    assert online.timeout == 3.0 and online.deadline == wall(0.0) + 3.0
    p.touch("k", 0.5)
    fired_at, event = run_until_expired(p, "k", 10.0)
    assert fired_at == pytest.approx(3.5)
    assert event.timeout == 3.0 and event.deadline == pytest.approx(wall(3.5), abs=1e-6)
    assert p.timeout_of("k") == 1.0  # forgotten with the session: back to the default


@pytest.mark.parametrize("kind", ["ring-lazy", "ring-eager", "scan", "heap"])
def test_timeout_that_is_not_a_whole_number_of_ticks_is_at_most_one_tick_late(kind: str) -> None:
    """keepalive 1 s -> timeout 1.5 s with a 1 s tick: activity at 0.2 has its deadline at 1.7, so the
    offline belongs to the tick at 2.0. Rounding the timeout up to 2 ticks *and* the activity up to tick 1
    would put it at 3.0: 1.3 s late, more than one tick."""
    p = table(tick=1.0, timeout=10.0, kind=kind)
    p.login("k", Owner("k"), 0.2, wall(0.2), keepalive=1.0)
    fired_at, event = run_until_expired(p, "k", 10.0)
    assert fired_at == 2.0
    assert event.deadline == pytest.approx(wall(1.7), abs=1e-6)
    # and through a touch
    p.login("k", Owner("k"), 5.6, wall(5.6), keepalive=1.0)
    p.touch("k", 5.9)  # deadline 7.4 -> tick 8
    fired_at, _ = run_until_expired(p, "k", 20.0)
    assert fired_at == 8.0


def test_default_timeout_that_is_not_a_whole_number_of_ticks() -> None:
    p = table(tick=1.0, timeout=2.5)
    p.login("u", Owner("u"), 0.7, wall(0.7))  # deadline 3.2 -> tick 4
    assert run_until_expired(p, "u", 10.0)[0] == 4.0
    p.login("v", Owner("v"), 10.2, wall(10.2))  # deadline 12.7 -> tick 13
    assert run_until_expired(p, "v", 20.0)[0] == 13.0


# -- newest wins, logout only by the owner ------------------------------------------------------------------


def test_newest_login_wins_without_a_flap() -> None:
    p = table()
    old, new = Owner("old"), Owner("new")
    _, first = p.login("u", old, 0.0, wall(0.0))
    previous, event = p.login("u", new, 0.8, wall(0.8))
    assert previous == ("u", old) and event is None
    assert p.owner_of("u") is new and len(p) == 1 and p.next_seq == first.seq + 1
    # the takeover restarted the deadline: 0.8 + 1.0
    fired_at, offline = run_until_expired(p, "u", 5.0)
    assert fired_at == pytest.approx(1.8)
    assert offline.last_seen == pytest.approx(wall(0.8), abs=1e-6)


def test_logout_only_by_the_current_owner() -> None:
    p = table()
    old, new = Owner("old"), Owner("new")
    p.login("u", old, 0.0, wall(0.0))
    p.login("u", new, 0.1, wall(0.1))
    assert p.logout("u", old, 0.2, wall(0.2), "closed") is None  # the kicked connection closing late
    assert p.is_online("u") and p.owner_of("u") is new
    event = p.logout("u", new, 0.3, wall(0.3), "logout")
    assert event is not None and (event.kind, event.reason, event.seq) == ("offline", "logout", 2)
    assert event.last_seen == pytest.approx(wall(0.1), abs=1e-6)
    assert p.logout("u", new, 0.4, wall(0.4), "logout") is None  # already offline
    assert p.next_due() is None


def test_touch_owned_is_ignored_unless_the_owner_matches() -> None:
    p = table(tick=0.1, timeout=1.0)
    gw, other = Owner("gw"), Owner("other")
    p.login("u", gw, 0.0, wall(0.0))
    assert not p.touch_owned("u", other, 0.9)
    assert not p.touch_owned("nobody", gw, 0.9)
    assert run_until_expired(p, "u", 5.0)[0] == pytest.approx(1.0)
    p.login("u", gw, 2.0, wall(2.0))
    assert p.touch_owned("u", gw, 2.9)
    assert run_until_expired(p, "u", 5.0)[0] == pytest.approx(3.9)


def test_a_gateway_touch_stamped_before_the_sessions_last_activity_changes_nothing() -> None:
    # A gateway's touch carries how long ago it read the activity (``ago``), so a touch may be stamped before
    # what the session already has (its attach, or a later touch): the latest activity wins, a deadline never
    # moves back (a detector that has placed the session by its later deadline would then find it too late).
    p = table(tick=0.1, timeout=1.0)
    gw = Owner("gw")
    p.login("u", gw, 2.0, wall(2.0))
    assert p.touch_owned("u", gw, 1.95)  # read before the attach was applied: the attach's time stays
    assert p.last_activity("u") == 2.0
    assert p.touch_owned("u", gw, 2.5)
    assert p.touch_owned("u", gw, 2.4)
    assert p.last_activity("u") == 2.5
    assert run_until_expired(p, "u", 5.0)[0] == pytest.approx(3.5)


@pytest.mark.parametrize("kind", ["ring-lazy", "ring-eager", "scan", "heap"])
def test_touching_a_session_record_moves_only_that_session_while_it_lives(kind: str) -> None:
    # The user plane touches its connection's session record (session_of), not its key: a record replaced by a
    # newer login, or ended, must stay out of the table -- it never moves the new owner's deadline, never
    # comes back, and never breaks the detector (eager ones re-file what they are given).
    p = PresenceTable(make_detector(kind, timeout=10, slots=16), tick=0.1, timeout=1.0, max_timeout=60.0,
                      detector_name=kind)
    old, new = Owner("old"), Owner("new")
    p.login("u", old, 0.0, wall(0.0))
    mine = p.session_of("u", old)
    assert mine is not None and p.session_of("u", new) is None
    p.touch_session(mine, 0.5)
    assert p.last_activity("u") == 0.5
    p.login("u", new, 0.6, wall(0.6))  # newest wins: old's record is out
    assert p.session_of("u", old) is None
    p.touch_session(mine, 1.2)  # a late frame of the old connection
    assert p.last_activity("u") == 0.6
    assert run_until_expired(p, "u", 5.0)[0] == pytest.approx(1.6)
    p.touch_session(mine, 1.7)
    p.touch_session(p.session_of("u", new), 1.7)  # (None: no session of its any more)
    assert not p.is_online("u") and p.next_due() is None


def test_takeover_with_another_keepalive_changes_the_timeout() -> None:
    p = table(tick=0.1, timeout=1.0)
    p.login("u", Owner("a"), 0.0, wall(0.0), keepalive=4.0)
    assert p.timeout_of("u") == 6.0
    p.login("u", Owner("b"), 1.0, wall(1.0))
    assert p.timeout_of("u") == 1.0
    assert run_until_expired(p, "u", 10.0)[0] == pytest.approx(2.0)


# -- restart and shutdown ----------------------------------------------------------------------------------------


def test_restart_event_closes_a_session_left_online() -> None:
    p = table(first_seq=51)
    record = {"seq": 50, "kind": "online", "uid": "u", "ts": 10.0, "reason": "login", "last_seen": 10.0,
              "deadline": 13.0, "timeout": 3.0, "detector": "ring-lazy"}
    event = p.restart_event(record, 99.0)
    assert event == PresenceEvent(51, "offline", "u", 99.0, "restart", 10.0, 13.0, 3.0, "ring-lazy")
    # a record missing optional fields (older writer) still yields a complete event
    sparse = p.restart_event({"seq": 7, "kind": "online", "uid": 42}, 99.0)
    assert (sparse.seq, sparse.uid, sparse.last_seen, sparse.timeout, sparse.deadline) == (52, 42, 99.0, 1.0, 100.0)
    assert len(p) == 0  # restart events do not touch the table


def test_end_all_ends_every_session_with_its_owner() -> None:
    p = table()
    owners = {uid: Owner(str(uid)) for uid in ["a", "b", 3, 4]}
    for uid, owner in owners.items():
        p.login(uid, owner, 0.0, wall(0.0), keepalive=None if uid != 3 else 2.0)
    p.touch("a", 0.5)
    ended = list(p.end_all(0.7, wall(0.7), "shutdown"))
    assert {e.uid for _, _, e in ended} == set(owners)
    assert all(owners[e.uid] is owner for _, owner, e in ended)
    assert all((e.kind, e.reason, e.ts) == ("offline", "shutdown", wall(0.7)) for _, _, e in ended)
    assert [e.seq for _, _, e in ended] == [5, 6, 7, 8]
    by_uid = {e.uid: e for _, _, e in ended}
    assert by_uid["a"].last_seen == pytest.approx(wall(0.5), abs=1e-6)
    assert by_uid[3].timeout == 3.0
    assert len(p) == 0 and p.next_due() is None and p.expire(100.0, wall(100.0)) == []


def test_end_all_in_chunks_each_at_the_time_of_its_call() -> None:
    # Shutdown ends sessions a chunk at a time and other events interleave: each chunk is stamped with the
    # time of its own call, so ts never goes backwards along the seqs.
    p = table()
    owners = {uid: Owner(str(uid)) for uid in range(10)}
    for uid, owner in owners.items():
        p.login(uid, owner, 0.0, wall(0.0))
    first = p.end_all(0.5, wall(0.5), "shutdown", 4)
    p.logout(first[0][0], first[0][1], 0.6, wall(0.6), "logout")  # already ended: nothing
    gone = next(uid for uid in owners if p.is_online(uid))
    logout = p.logout(gone, owners[gone], 0.6, wall(0.6), "logout")  # ended by its owner meanwhile
    second = p.end_all(0.7, wall(0.7), "shutdown", 4)
    third = p.end_all(0.8, wall(0.8), "shutdown", 4)
    assert p.end_all(0.9, wall(0.9), "shutdown", 4) == []
    assert [len(first), len(second), len(third)] == [4, 4, 1]
    assert logout is not None and logout.uid not in {e.uid for _, _, e in first + second + third}
    events = sorted([e for _, _, e in first + second + third] + [logout], key=lambda e: e.seq)
    assert [e.seq for e in events] == list(range(11, 21))
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    assert {e.ts for _, _, e in third} == {wall(0.8)}
    assert len(p) == 0


# -- a model test: random traffic against a plain dict of deadlines -----------------------------------------

operations = st.lists(
    st.tuples(
        st.sampled_from(["login", "touch", "logout", "wait"]),
        st.integers(0, 5),  # uid
        st.floats(0.0, 0.8, allow_nan=False),  # time step before the operation
        st.sampled_from([None, 0.3, 0.5, 1.0]),  # keepalive for logins
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=operations, kind=st.sampled_from(["ring-lazy", "ring-eager", "scan", "heap"]))
def test_model_never_early_at_most_one_tick_late(ops: list[tuple[str, int, float, float | None]], kind: str) -> None:
    tick = 0.1
    p = table(tick=tick, timeout=0.7, max_timeout=1.2, kind=kind)
    model: dict[int, tuple[Owner, float, float]] = {}  # uid -> (owner, last activity, timeout)
    seq = p.next_seq
    now = 0.0

    def tick_until(target: float) -> None:
        """The tick task between now and target: wake at each next_due() <= target."""
        nonlocal seq
        while (due := p.next_due()) is not None and due <= target:
            for _key, owner, event in p.expire(due, wall(due)):
                own, last, timeout = model.pop(event.uid)
                assert owner is own
                assert due >= last + timeout - 1e-9, "offline before the deadline"
                assert due <= last + timeout + tick + 1e-9, "offline more than one tick late"
                assert event.seq == seq
                seq += 1
        for uid, (_, last, timeout) in model.items():
            assert target < last + timeout + tick + 1e-9, f"{uid} missed: still online past deadline + tick"

    for op, uid, step, keepalive in ops:
        tick_until(now + step)
        now += step
        if op == "login":
            owner = Owner(str(uid))
            previous, event = p.login(uid, owner, now, wall(now), keepalive)
            assert (previous is None) == (uid not in model)
            assert previous is None or previous == (uid, model[uid][0])
            assert (event is None) == (uid in model)
            if event is not None:
                assert event.seq == seq
                seq += 1
            model[uid] = (owner, now, p.timeout_for(keepalive))
        elif op == "touch":
            p.touch(uid, now)
            if uid in model:
                owner, _, timeout = model[uid]
                model[uid] = (owner, now, timeout)
        elif op == "logout" and uid in model:
            event = p.logout(uid, model.pop(uid)[0], now, wall(now), "logout")
            assert event is not None and event.seq == seq
            seq += 1
        assert {u for u in range(6) if p.is_online(u)} == set(model)
    tick_until(now + 5.0)
    assert not model and len(p) == 0


def test_the_table_needs_an_empty_detector_of_its_own() -> None:
    detector = make_detector("ring-lazy", timeout=10, slots=16)
    detector.add("someone", 0)
    with pytest.raises(ValueError, match="of its own"):
        PresenceTable(detector, tick=0.1, timeout=1.0, max_timeout=60.0, detector_name="ring-lazy")


@pytest.mark.parametrize("kind", ["ring-lazy", "ring-eager", "scan", "heap"])
def test_one_record_per_session_in_one_map(kind: str) -> None:
    # The table's fields and the detector's live in one record, under the detector's one uid-keyed map.
    presence = table(kind=kind)
    owner = Owner("gateway")
    presence.login("u1", owner, 0.0, wall(0.0), keepalive=2.0)
    presence.login("u2", owner, 0.0, wall(0.0))
    entries = presence._detector.entries  # type: ignore[attr-defined]
    assert set(entries) == {"u1", "u2"} and entries["u1"].owner is owner
    assert presence.timeout_of("u1") == 3.0 and presence.timeout_of("u2") == 1.0
    presence.touch("u1", 2.5)
    assert entries["u1"].seen == 2.5
    fired = [event for _, _, event in presence.expire(4.0, wall(4.0))] + [e for _, _, e in presence.expire(6.0, wall(6.0))]
    assert [(event.uid, event.last_seen) for event in fired] == [("u2", wall(0.0)), ("u1", wall(2.5))]
    assert len(presence) == 0 and not entries


@pytest.mark.parametrize("kind", ["ring-lazy", "ring-eager", "scan", "heap"])
def test_ended_sessions_leave_no_garbage_cycles(kind: str) -> None:
    # Why a core holding sessions finds nothing when it thaws (idled.ops.gcpolicy backs off then): a record
    # leaving the table is freed by reference counting, never left in a cycle for the collector.
    import gc

    presence = table(kind=kind)
    owner = Owner("gateway")
    gc.collect()
    gc.disable()
    try:
        for i in range(300):
            presence.login(f"u{i}", owner, 0.0, wall(0.0), keepalive=None if i % 2 else 2.0)
        for i in range(0, 300, 3):
            presence.touch(f"u{i}", 0.5)
        for i in range(0, 100):
            presence.logout(f"u{i}", owner, 0.6, wall(0.6), "bye")
        presence.login("u150", Owner("newer"), 0.7, wall(0.7))  # a takeover drops the old record
        assert len(presence.expire(10.0, wall(10.0))) == 200
        assert gc.collect() == 0
    finally:
        gc.enable()


# -- memory: what sessions with the same timeout share -------------------------------------------------------


def test_sessions_asking_the_same_keepalive_share_one_timeout_and_one_activity_tick() -> None:
    """A float (24 bytes) and an int past 256 (32 bytes) per session would be a tenth of its memory: sessions
    of the same timeout hold the same objects, as default-timeout sessions always did."""
    detector = make_detector("ring-lazy", timeout=10, slots=16)
    p = PresenceTable(detector, tick=1.0, timeout=10.0, max_timeout=60.0, detector_name="ring-lazy")
    start = 1000.25  # ticks past 256: ints the interpreter does not cache
    for i in range(4):
        p.login(f"u{i}", Owner(f"c{i}"), start, wall(start), keepalive=20.0)
    assert p.timeout_of("u0") == 30.0
    assert all(p.timeout_of(f"u{i}") is p.timeout_of("u0") for i in range(4))
    for i in range(4):
        p.touch(f"u{i}", start + 3.5 + i / 20)  # (one tick: 1003.75 to 1003.9)
    ticks = [detector.entries[f"u{i}"].tick for i in range(4)]
    assert ticks[0] > 256 and all(t is ticks[0] for t in ticks)
    # ... and the rules are unchanged: due at the first tick at or after the last touch + 30 s
    assert run_until_expired(p, "u3", 2000.0)[0] == 1034.0
