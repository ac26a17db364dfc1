"""Whose fault a pinger's offline was -- the server's or the generator's -- with plain numbers."""

from __future__ import annotations

import pytest

from idled.tools.loadtest.stats import BYE, LATE, SILENT, Matcher, Plan, make_plan
from idled.tools.loadtest.verdict import FALSE, LATE_SEND, classify_offline

T = 30.0  # timeout
E = 0.005  # tolerance
B = 32.0  # bound: timeout + 2 ticks of 1 s


def _classify(ts: float, sends: tuple[float, float]) -> str:
    return classify_offline(ts, sends, timeout=T, tolerance=E, bound=B)


def test_the_worked_examples_of_the_docstring() -> None:
    assert _classify(140.0, (100.0, 118.0)) == FALSE  # sent 22 s before the event: the server was wrong
    assert _classify(130.4, (100.0, 131.0)) == LATE_SEND  # the only send before the event is 30.4 s old
    assert _classify(131.2, (100.0, 131.0)) == LATE_SEND  # sent after the deadline, before the server's tick


def test_the_boundary_is_the_timeout_minus_the_tolerance() -> None:
    assert _classify(100.0 + T - E, (90.0, 100.0)) == LATE_SEND
    assert _classify(100.0 + T - 2 * E, (90.0, 100.0)) == FALSE
    assert _classify(148.0, (118.0, 100.0)) == LATE_SEND  # the two sends in any order


def test_a_gap_past_the_timeout_excuses_only_an_offline_where_that_gap_put_it() -> None:
    # sends at 100 and 131: the gap entitled the server to fire from 130 to 132 (its bound)
    assert _classify(129.0, (100.0, 131.0)) == FALSE  # before the gap's deadline: the server's fault
    assert _classify(135.0, (100.0, 131.0)) == FALSE  # long after the late send arrived: the server's fault


def test_sends_all_after_the_event_leave_the_server_at_fault() -> None:
    assert _classify(50.0, (60.0, 70.0)) == FALSE


# ----------------------------------------------------------------------------------------- the Matcher

T0 = 1_000_000.0
TICK = 1.0


def _matcher() -> Matcher:
    # 0..3 pingers, 4 silent, 5 and 6 planned late
    plan = Plan(7, {4: (SILENT, 40.0), 5: (LATE, 40.0), 6: (LATE, 40.0)}, (30.0, 60.0))
    m = Matcher(plan, uid_base=0, t0_wall=T0)
    for i in range(7):
        m.event("online", i, T0 + i, "login", T0 + i + T, T0 + i)
    m.silent(4, T0 + 41.0)
    m.event("offline", 4, T0 + 41.0 + T + 0.5, "idle", T0 + 41.0 + T, T0 + 41.0)
    return m


def _offline_and_close(m: Matcher, i: int, ts: float, sends: tuple[float, float]) -> None:
    m.event("offline", i, ts, "idle", sends[1] + T, sends[1])
    m.closed(i, sends[0], sends[1], ts + 0.002, "server:idle_timeout")


def test_a_pinger_that_kept_sending_and_went_offline_is_a_false_offline() -> None:
    m = _matcher()
    _offline_and_close(m, 1, T0 + 60.0, (T0 + 20.0, T0 + 41.0))  # sent 19 s before the offline
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert (v.false_offlines, v.generator_late, v.no_close_record) == (1, 0, 0)
    assert v.false_offline_examples[0]["sent_last"] == T0 + 41.0
    assert not v.ok


def test_a_pinger_whose_generator_did_not_send_in_time_is_generator_late_not_false() -> None:
    m = _matcher()
    _offline_and_close(m, 2, T0 + 72.0, (T0 + 20.0, T0 + 41.0))  # nothing sent for 31 s
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert (v.false_offlines, v.generator_late) == (0, 1)
    assert v.generator_late_examples[0]["uid"] == 2
    assert v.ok  # the server was right; the run's figures are another matter (a target of the result)


def test_an_offline_without_a_close_record_is_blamed_on_the_server() -> None:
    m = _matcher()
    m.event("offline", 3, T0 + 72.0, "idle", T0 + 71.0, T0 + 41.0)
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert (v.false_offlines, v.no_close_record, v.generator_late) == (1, 1, 0)


def test_planned_late_sessions_past_the_timeout_owe_an_offline_and_are_not_counted_as_generator_late() -> None:
    m = _matcher()
    m.late(5, T0 + 45.0, T0 + 45.0 + 20.0 + 15.0)  # a 35 s gap: past the 30 s timeout
    _offline_and_close(m, 5, T0 + 75.4, (T0 + 25.0, T0 + 45.0))
    m.late(6, T0 + 46.0, T0 + 46.0 + 36.0)  # owed an offline too, but none came
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert (v.late_planned, v.late_expected, v.late_offlines, v.late_missed) == (2, 2, 1, 1)
    assert v.generator_late == 0 and v.false_offlines == 0
    assert not v.ok  # a missed offline is the server's failure
    assert m.judge(timeout=T, tick=TICK, cutoff=T0 + 46.0 + B - 1).late_missed == 0  # not yet owed


def test_planned_late_sessions_within_the_timeout_owe_nothing_and_an_offline_is_false() -> None:
    m = _matcher()
    m.late(5, T0 + 45.0, T0 + 45.0 + 25.0)  # a 25 s gap: within the timeout, no offline owed
    m.late(6, T0 + 46.0, T0 + 46.0 + 25.0)
    # the delayed keepalive went out at 71; the server expired it anyway at 73
    _offline_and_close(m, 6, T0 + 73.0, (T0 + 46.0, T0 + 71.0))
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert (v.late_planned, v.late_expected, v.late_missed, v.late_offlines) == (2, 0, 0, 0)
    assert v.false_offlines == 1 and v.generator_late == 0
    assert v.to_dict()["planned"] == {"pinger": 6, "silent": 1, "bye": 0, "late": 2}


def test_make_plan_adds_late_sessions_among_the_pingers_without_changing_the_others() -> None:
    before = make_plan(1000, silent_fraction=0.05, bye_fraction=0.01, window=(10.0, 50.0), seed=3)
    plan = make_plan(1000, silent_fraction=0.05, bye_fraction=0.01, window=(10.0, 50.0), seed=3,
                     late_fraction=0.02)
    late = {i: e for i, e in plan.special.items() if e[0] == LATE}
    assert len(late) == 20 and all(10.0 <= at <= 50.0 for _, at in late.values())
    assert {i: e for i, e in plan.special.items() if e[0] != LATE} == dict(before.special)
    assert plan.counts() == {"pinger": 1000 - 50 - 10, "silent": 50, "bye": 10, "late": 20}
    with pytest.raises(ValueError):
        make_plan(10, silent_fraction=0, bye_fraction=0, window=(0.0, 1.0), seed=1, late_fraction=1.5)


# ------------------------------------------------------------------------------------ devices (users)

K = 2  # devices per user: sessions 2u, 2u + 1 are user u's "d0", "d1"


def _users() -> Matcher:
    """Users 0, 1 pingers; 2 silent (devices at 40 and 50 s); 3 bye (devices at 45 and 35 s)."""
    special = {4: (SILENT, 40.0), 5: (SILENT, 50.0), 6: (BYE, 45.0), 7: (BYE, 35.0)}
    m = Matcher(Plan(8, special, (30.0, 60.0), devices=K), uid_base=0, t0_wall=T0)
    for u in range(4):
        m.event("online", u, T0 + u, "login", T0 + u + T, T0 + u)
    return m


def test_make_plan_with_devices_chooses_users_and_gives_each_device_its_own_moment() -> None:
    one = make_plan(1000, silent_fraction=0.05, bye_fraction=0.01, window=(10.0, 50.0), seed=3)
    plan = make_plan(2000, silent_fraction=0.05, bye_fraction=0.01, window=(10.0, 50.0), seed=3, devices=2)
    assert plan.users == 1000 and plan.devices == 2
    # device 0 of each user is what one device per user would have been; device 1 has the same kind
    assert {i // 2: e for i, e in plan.special.items() if i % 2 == 0} == dict(one.special)
    assert {i // 2: e[0] for i, e in plan.special.items() if i % 2 == 1} == {u: e[0] for u, e in one.special.items()}
    assert all(10.0 <= at <= 50.0 for _, at in plan.special.values())
    assert plan.counts() == {"pinger": 1000 - 50 - 10, "silent": 50, "bye": 10, "late": 0}  # users
    with pytest.raises(ValueError):
        make_plan(2001, silent_fraction=0.05, bye_fraction=0.0, window=(10.0, 50.0), seed=3, devices=2)
    with pytest.raises(ValueError):
        make_plan(2000, silent_fraction=0.0, bye_fraction=0.0, window=(10.0, 50.0), seed=3, devices=2,
                  late_fraction=0.1)


def test_a_user_goes_offline_after_its_last_device_and_not_before() -> None:
    m = _users()
    m.silent(4, T0 + 40.0)
    m.silent(5, T0 + 50.0)  # the user's last device: its offline is owed at 50 + T
    m.event("offline", 2, T0 + 50.0 + T + 0.4, "idle", T0 + 50.0 + T, T0 + 50.0)
    m.bye(7, T0 + 35.0)
    m.bye(6, T0 + 45.0)
    m.event("offline", 3, T0 + 45.01, "logout", T0 + 45.01, T0 + 45.0)
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert v.ok and (v.users, v.devices, v.sessions) == (4, 2, 8)
    assert (v.false_offlines, v.early_offlines, v.missed_offlines, v.logouts_seen) == (0, 0, 0, 1)
    assert v.lateness_generator.max == pytest.approx(0.4)
    assert v.online_missing == 0 and v.online_duplicates == 0


def test_an_offline_at_the_first_devices_deadline_is_early_and_one_before_the_last_bye_false() -> None:
    m = _users()
    m.silent(4, T0 + 40.0)
    m.silent(5, T0 + 50.0)
    m.event("offline", 2, T0 + 40.0 + T + 0.4, "idle", T0 + 40.0 + T, T0 + 40.0)  # d0's deadline: d1 still on
    m.bye(7, T0 + 35.0)
    m.bye(6, T0 + 45.0)
    m.event("offline", 3, T0 + 35.01, "logout", T0 + 35.01, T0 + 35.0)  # at d1's bye: d0 had not left
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    # user 2 went offline at its first device's deadline, after its last device stopped: early; user 3 before
    # its last device said bye: false
    assert (v.false_offlines, v.early_offlines) == (1, 1)
    assert not v.ok


def test_an_owed_user_offline_that_never_comes_is_missed() -> None:
    m = _users()
    m.silent(4, T0 + 40.0)
    m.silent(5, T0 + 50.0)
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 50.0 + B + 1)
    assert v.missed_never == 1 and not v.ok
    assert m.judge(timeout=T, tick=TICK, cutoff=T0 + 50.0 + B - 1).unjudged_silent == 1  # not owed yet


def test_a_pinger_users_offline_is_generator_late_only_if_every_device_was_late() -> None:
    m = _users()
    m.event("offline", 0, T0 + 72.0, "idle", T0 + 71.0, T0 + 41.0)
    m.closed(0, T0 + 20.0, T0 + 41.0, T0 + 72.01, "server:idle_timeout")  # d0: silent 31 s, late
    m.closed(1, T0 + 50.0, T0 + 60.0, T0 + 72.01, "server:idle_timeout")  # d1: sent 12 s before: false
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert (v.false_offlines, v.generator_late) == (1, 0)
    assert v.false_offline_examples[0]["device"] == "d1"
    m = _users()
    m.event("offline", 0, T0 + 72.0, "idle", T0 + 71.0, T0 + 41.0)
    m.closed(0, T0 + 20.0, T0 + 41.0, T0 + 72.01, "server:idle_timeout")
    m.closed(1, T0 + 20.0, T0 + 40.0, T0 + 72.01, "server:idle_timeout")
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert (v.false_offlines, v.generator_late, v.no_close_record) == (0, 1, 0)


def test_a_pinger_device_ended_idle_while_its_user_stayed_online_is_judged_by_its_sends() -> None:
    m = _users()
    m.closed(1, T0 + 50.0, T0 + 60.0, T0 + 72.0, "server:idle_timeout")  # sent 12 s before: no event hides it
    m.closed(2, T0 + 10.0, T0 + 20.0, T0 + 60.0, "server:idle_timeout")  # silent 40 s: the generator's fault
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert v.false_offlines == 1 and v.false_offline_reasons == {"device:idle": 1}
    assert v.false_offline_examples[0]["device"] == "d1" and not v.ok


def test_a_user_with_a_failed_device_is_not_judged_but_still_owes_its_online() -> None:
    m = Matcher(Plan(4, {}, (30.0, 60.0), devices=K), uid_base=0, t0_wall=T0)
    m.failed(1)  # user 0's d1 never logged in; d0 did
    m.failed(2)
    m.failed(3)  # user 1: no device logged in: no online owed
    m.event("offline", 0, T0 + 60.0, "idle", T0 + 59.0, T0 + 29.0)
    v = m.judge(timeout=T, tick=TICK, cutoff=T0 + 200)
    assert (v.online_missing, v.false_offlines, v.failed_logins) == (1, 0, 3)
