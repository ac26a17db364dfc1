"""idled.core.presence with devices and grace: session keys (uid or (uid, device)), user-level events, the
``max_devices`` cap, and ``offline_grace`` -- unit tests, then a model test against a brute-force reference."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.core.presence import PresenceEvent

from tests.core.tables import Owner, table, wall

OLD_RECORD_KEYS = ["seq", "kind", "uid", "ts", "reason", "last_seen", "deadline", "timeout", "detector"]


def events(ended: list[Any]) -> list[PresenceEvent]:
    return [event for _, _, event in ended if event is not None]


# -- devices ---------------------------------------------------------------------------------------------------


def test_two_devices_one_user_one_online_one_offline() -> None:
    p = table()
    phone, laptop = Owner("phone"), Owner("laptop")
    replaced, online = p.login(("alice", "phone"), phone, 0.0, wall(0.0))
    assert replaced is None and online is not None
    assert (online.kind, online.uid, online.reason, online.device) == ("online", "alice", "login", "phone")
    assert online.record()["device"] == "phone" and "grace" not in online.record()
    replaced, second = p.login(("alice", "laptop"), laptop, 0.1, wall(0.1))
    assert replaced is None and second is None  # another device of an online user: no event
    assert p.is_online("alice") and len(p) == 2 and p.users() == 1
    assert p.keys_of("alice") == (("alice", "phone"), ("alice", "laptop"))
    assert p.devices_of("alice") == ("phone", "laptop")
    p.touch(("alice", "phone"), 0.15)
    assert p.last_activity("alice") == 0.15 and p.last_activity("nobody") is None
    assert p.logout(("alice", "phone"), phone, 0.2, wall(0.2), "logout") is None  # the laptop stays
    assert p.last_activity("alice") == 0.1
    assert p.is_online("alice") and len(p) == 1 and p.users() == 1
    offline = p.logout(("alice", "laptop"), laptop, 0.3, wall(0.3), "closed")
    assert offline is not None
    assert (offline.kind, offline.uid, offline.reason, offline.device, offline.grace) == (
        "offline", "alice", "closed", "laptop", None)
    assert offline.last_seen == pytest.approx(wall(0.1))
    assert not p.is_online("alice") and len(p) == 0 and p.users() == 0 and p.keys_of("alice") == ()
    assert p.next_seq == 3


def test_a_plain_login_makes_the_very_record_it_made_before_devices() -> None:
    p = table()
    owner = Owner("old client")
    _, online = p.login("bob", owner, 0.0, wall(0.0))
    assert online is not None and list(online.record()) == OLD_RECORD_KEYS
    offline = p.logout("bob", owner, 0.5, wall(0.5), "logout")
    assert offline is not None and list(offline.record()) == OLD_RECORD_KEYS
    assert offline == PresenceEvent(2, "offline", "bob", wall(0.5), "logout", wall(0.0), wall(1.0), 1.0, "ring-lazy")


def test_the_plain_key_is_one_more_device_of_its_user() -> None:
    p = table()
    plain, phone = Owner("plain"), Owner("phone")
    _, online = p.login(7, plain, 0.0, wall(0.0))
    assert online is not None and online.device is None
    assert p.login((7, "phone"), phone, 0.1, wall(0.1)) == (None, None)
    assert p.keys_of(7) == (7, (7, "phone")) and p.devices_of(7) == ("phone",)
    assert p.logout(7, plain, 0.2, wall(0.2), "logout") is None
    assert p.keys_of(7) == ((7, "phone"),)
    offline = p.logout((7, "phone"), phone, 0.3, wall(0.3), "logout")
    assert offline is not None and offline.device == "phone"
    # back to a plain key alone: no per-user bookkeeping left
    p.login(7, plain, 0.4, wall(0.4))
    assert p._users == {} and p._user_keys.spare == 0  # type: ignore[attr-defined]


def test_newest_wins_per_key_and_the_device_becomes_the_newest() -> None:
    p = table(max_devices=2)
    a1, b, a2, c = Owner("a1"), Owner("b"), Owner("a2"), Owner("c")
    p.login(("u", "a"), a1, 0.0, wall(0.0))
    p.login(("u", "b"), b, 0.1, wall(0.1))
    replaced, event = p.login(("u", "a"), a2, 0.2, wall(0.2))  # the same device again: the old connection goes
    assert replaced == (("u", "a"), a1) and event is None
    assert p.owner_of(("u", "a")) is a2 and p.keys_of("u") == (("u", "b"), ("u", "a"))
    replaced, event = p.login(("u", "c"), c, 0.3, wall(0.3))  # past the cap: the oldest now is b
    assert replaced == (("u", "b"), b) and event is None
    assert p.keys_of("u") == (("u", "a"), ("u", "c")) and len(p) == 2
    assert p.logout(("u", "b"), b, 0.4, wall(0.4), "closed") is None  # a kicked connection closing late


def test_the_cap_of_one_makes_devices_replace_each_other() -> None:
    p = table(max_devices=1)
    plain, phone = Owner("plain"), Owner("phone")
    p.login("u", plain, 0.0, wall(0.0))
    assert p.login(("u", "phone"), phone, 0.1, wall(0.1)) == (("u", plain), None)
    assert p.keys_of("u") == (("u", "phone"),) and p.users() == 1 and len(p) == 1
    assert p.login("u", plain, 0.2, wall(0.2)) == ((("u", "phone"), phone), None)
    assert p.keys_of("u") == ("u",) and p._users == {}  # type: ignore[attr-defined]


def test_an_expiring_device_tells_its_owner_without_an_event_while_another_lives() -> None:
    p = table(tick=0.1, timeout=1.0)
    phone, laptop = Owner("phone"), Owner("laptop")
    p.login(("u", "phone"), phone, 0.0, wall(0.0))
    p.login(("u", "laptop"), laptop, 0.0, wall(0.0))
    p.touch(("u", "laptop"), 0.9)
    assert p.expire(1.0, wall(1.0)) == [(("u", "phone"), phone, None)]
    [(key, owner, event)] = p.expire(2.0, wall(2.0))
    assert (key, owner) == (("u", "laptop"), laptop)
    assert event is not None and (event.reason, event.device, event.uid) == ("idle", "laptop", "u")


def test_end_all_ends_every_key_and_each_user_once() -> None:
    p = table()
    owners = {key: Owner(str(key)) for key in [("a", "1"), ("a", "2"), "a", "b", ("c", "x")]}
    for key, owner in owners.items():
        p.login(key, owner, 0.0, wall(0.0))
    ended = p.end_all(0.5, wall(0.5), "shutdown")
    assert {key for key, _, _ in ended} == set(owners)
    assert all(owners[key] is owner for key, owner, _ in ended)
    assert sorted(e.uid for e in events(ended)) == ["a", "b", "c"]
    assert len(p) == 0 and p.users() == 0 and p._users == {}  # type: ignore[attr-defined]


def test_held_device_sessions_are_keys_like_any_other() -> None:
    p = table(tick=1.0, timeout=30.0)
    edge = Owner("edge")
    p.track_owner(edge, 0.0)
    p.login(("a", "phone"), edge, 0.0, wall(0.0))
    p.login(("a", "web"), edge, 0.0, wall(0.0))
    assert p.expire(31.0, wall(31.0)) == [] and len(p.holds) == 2
    assert p.is_online("a") and p.users() == 1 and len(p) == 2
    assert p.touch_owned(("a", "web"), edge, 31.0)  # back in the detector
    p.mark(edge, 31.0)
    assert p.expire(31.0, wall(31.0)) == [(("a", "phone"), edge, None)]
    assert p.keys_of("a") == (("a", "web"),)


# -- grace -------------------------------------------------------------------------------------------------------


def test_a_closed_last_session_waits_out_the_grace_then_goes_offline_with_its_original_time() -> None:
    p = table(grace=5.0)
    owner = Owner("phone")
    p.login(("u", "phone"), owner, 0.0, wall(0.0))
    p.touch(("u", "phone"), 0.4)
    assert p.logout(("u", "phone"), owner, 0.5, wall(0.5), "closed") is None
    assert p.is_online("u") and p.in_grace("u") and len(p) == 0 and p.users() == 1 and p.keys_of("u") == ()
    assert p.next_due() == 5.5
    assert p.expire(5.4, wall(5.4)) == []
    [(key, owner_, event)] = p.expire(5.5, wall(5.5))
    assert key == "u" and owner_ is None and event is not None
    assert (event.kind, event.reason, event.ts, event.device, event.grace, event.seq) == (
        "offline", "closed", wall(0.5), "phone", 5.0, 2)
    assert event.last_seen == pytest.approx(wall(0.4)) and event.deadline == pytest.approx(wall(1.4))
    assert event.record()["grace"] == 5.0
    assert not p.is_online("u") and p.users() == 0 and p.next_due() is None


def test_a_login_within_the_grace_continues_the_user_with_no_event() -> None:
    p = table(grace=5.0)
    first, second = Owner("first"), Owner("second")
    p.login("u", first, 0.0, wall(0.0))
    assert p.logout("u", first, 1.0, wall(1.0), "closed") is None
    assert p.login(("u", "other device"), second, 3.0, wall(3.0)) == (None, None)
    assert not p.in_grace("u") and p.is_online("u")
    p.touch(("u", "other device"), 6.0)
    assert p.expire(6.5, wall(6.5)) == []
    assert len(p._grace_queue) == 0  # type: ignore[attr-defined]  # the stale pending entry (due 6.0) was dropped
    assert p.next_seq == 2  # only the first online
    offline = p.logout(("u", "other device"), second, 7.0, wall(7.0), "logout")
    assert offline is not None and offline.reason == "logout" and offline.grace is None


@pytest.mark.parametrize("reason", ["logout", "idle", "kicked", "detach", "gateway_lost", "shutdown"])
def test_only_closed_waits_out_the_grace(reason: str) -> None:
    p = table(grace=5.0)
    owner = Owner("o")
    p.login("u", owner, 0.0, wall(0.0))
    event = p.logout("u", owner, 0.5, wall(0.5), reason)
    assert event is not None and event.reason == reason and event.grace is None


def test_a_closed_device_with_another_device_online_has_no_grace_to_wait() -> None:
    p = table(grace=5.0)
    a, b = Owner("a"), Owner("b")
    p.login(("u", "a"), a, 0.0, wall(0.0))
    p.login(("u", "b"), b, 0.0, wall(0.0))
    assert p.logout(("u", "a"), a, 0.5, wall(0.5), "closed") is None
    assert not p.in_grace("u")
    offline = p.logout(("u", "b"), b, 0.6, wall(0.6), "logout")
    assert offline is not None and offline.device == "b" and offline.reason == "logout"


def test_end_all_emits_pending_grace_offlines_at_once() -> None:
    p = table(grace=60.0)
    gone, live = Owner("gone"), Owner("live")
    p.login("gone", gone, 0.0, wall(0.0))
    p.login("live", live, 0.0, wall(0.0))
    p.logout("gone", gone, 0.5, wall(0.5), "closed")
    first = p.end_all(1.0, wall(1.0), "shutdown", limit=1)
    assert [(k, o, e.reason, e.ts, e.grace) for k, o, e in first if e] == [("gone", None, "closed", wall(0.5), 60.0)]
    rest = p.end_all(1.0, wall(1.0), "shutdown")
    assert [(k, o, e.reason if e else None) for k, o, e in rest] == [("live", live, "shutdown")]
    assert p.end_all(1.0, wall(1.0), "shutdown") == [] and p.users() == 0 and p.next_due() is None


def test_grace_offlines_respect_the_expire_limit_and_come_in_order() -> None:
    p = table(grace=2.0)
    owners = [Owner(str(i)) for i in range(5)]
    for i, owner in enumerate(owners):
        p.login(i, owner, 0.0, wall(0.0))
        p.logout(i, owner, 0.1 * i, wall(0.1 * i), "closed")
    first = p.expire(3.0, wall(3.0), limit=2)
    second = p.expire(3.0, wall(3.0), limit=10)
    assert [k for k, _, _ in first] == [0, 1] and [k for k, _, _ in second] == [2, 3, 4]
    seqs = [e.seq for e in events(first + second)]
    assert seqs == sorted(seqs)


def test_next_due_is_the_earlier_of_the_detector_and_the_grace() -> None:
    p = table(tick=0.1, timeout=1.0, grace=0.3)
    a, b = Owner("a"), Owner("b")
    p.login("a", a, 0.0, wall(0.0))
    p.login("b", b, 0.0, wall(0.0))
    p.logout("b", b, 0.2, wall(0.2), "closed")
    assert p.next_due() == pytest.approx(0.5)
    [(key, _, event)] = p.expire(0.5, wall(0.5))
    assert key == "b" and event is not None and event.grace == pytest.approx(0.3)
    assert p.next_due() == pytest.approx(1.0)


def test_settings_are_validated() -> None:
    for bad in ({"max_devices": 0}, {"max_devices": 1025}, {"grace": -1.0}, {"grace": 3601.0},
                {"grace": float("nan")}):
        with pytest.raises(ValueError):
            table(**bad)  # type: ignore[arg-type]


def test_device_sessions_leave_no_garbage_cycles() -> None:
    p = table(grace=1.0, max_devices=3)
    owner = Owner("gw")
    gc.collect()
    gc.disable()
    try:
        for i in range(200):
            for d in ("a", "b", "c", "d"):
                p.login((i, d), owner, 0.0, wall(0.0))
            p.login(i, owner, 0.0, wall(0.0))
        for i in range(0, 200, 2):
            for key in p.keys_of(i):
                p.logout(key, owner, 0.5, wall(0.5), "closed")
        p.expire(10.0, wall(10.0))
        assert p.users() == 0 and len(p) == 0
        assert gc.collect() == 0
    finally:
        gc.enable()


# -- a model test: random traffic against a brute-force reference ----------------------------------------------

TICK = 0.1
UIDS = [0, 1, "u"]
DEVICES = [None, "a", "b", "c"]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("login"), st.sampled_from(UIDS), st.sampled_from(DEVICES), st.sampled_from([None, 0.5, 1.0])),
        st.tuples(st.just("touch"), st.sampled_from(UIDS), st.sampled_from(DEVICES), st.none()),
        st.tuples(st.sampled_from(["logout", "closed"]), st.sampled_from(UIDS), st.sampled_from(DEVICES),
                  st.integers(0, 3)),  # which owner ends it: 0 the current one, else an older connection
        st.tuples(st.just("wait"), st.none(), st.none(), st.floats(0.0, 1.2, allow_nan=False)),
    ),
    max_size=60,
)


class Reference:
    """The rules, stated as plainly as possible: lists and dicts, everything recomputed by brute force."""

    def __init__(self, max_devices: int, grace: float, timeout_for: Any) -> None:
        self.max_devices, self.grace, self.timeout_for = max_devices, grace, timeout_for
        self.order: list[Any] = []  # every live key, oldest login first
        self.sessions: dict[Any, tuple[Owner, float, float]] = {}  # key -> (owner, last activity, timeout)
        self.pending: dict[Any, tuple[float, float, float, float, str | None]] = {}  # uid -> due, ts, seen, timeout, dev

    @staticmethod
    def uid(key: Any) -> Any:
        return key[0] if isinstance(key, tuple) else key

    @staticmethod
    def device(key: Any) -> str | None:
        return key[1] if isinstance(key, tuple) else None

    def keys(self, uid: Any) -> list[Any]:
        return [key for key in self.order if self.uid(key) == uid]

    def online(self, uid: Any) -> bool:
        return bool(self.keys(uid)) or uid in self.pending

    def login(self, key: Any, owner: Owner, now: float, keepalive: float | None) -> tuple[Any, Any]:
        uid, timeout = self.uid(key), self.timeout_for(keepalive)
        if key in self.sessions:
            previous = self.sessions[key][0]
            self.order.remove(key)
            self.order.append(key)
            self.sessions[key] = (owner, now, timeout)
            return (key, previous), None
        replaced = None
        if len(self.keys(uid)) >= self.max_devices:
            oldest = self.keys(uid)[0]
            self.order.remove(oldest)
            replaced = (oldest, self.sessions.pop(oldest)[0])
        was_online = bool(self.keys(uid)) or replaced is not None
        self.order.append(key)
        self.sessions[key] = (owner, now, timeout)
        if was_online or self.pending.pop(uid, None) is not None:
            return replaced, None
        return replaced, ("online", uid, "login", self.device(key), None)

    def end(self, key: Any, now: float, reason: str) -> Any:
        _, seen, timeout = self.sessions.pop(key)
        self.order.remove(key)
        uid = self.uid(key)
        if self.keys(uid):
            return None
        if reason == "closed" and self.grace:
            self.pending[uid] = (now + self.grace, wall(now), wall(seen), timeout, self.device(key))
            return None
        return ("offline", uid, reason, self.device(key), None)


def shape(event: PresenceEvent | None) -> Any:
    return None if event is None else (event.kind, event.uid, event.reason, event.device, event.grace)


@settings(max_examples=300, deadline=None)
@given(ops=operations, max_devices=st.sampled_from([1, 2, 3, 8]), grace=st.sampled_from([0.0, 0.35, 2.0]),
       kind=st.sampled_from(["ring-lazy", "ring-eager", "scan", "heap"]))
def test_model_devices_cap_and_grace(ops: list[tuple[Any, ...]], max_devices: int, grace: float, kind: str) -> None:
    p = table(tick=TICK, timeout=0.7, max_timeout=1.2, kind=kind, max_devices=max_devices, grace=grace)
    ref = Reference(max_devices, grace, p.timeout_for)
    connections: dict[Any, list[Owner]] = {}  # key -> every owner that logged it in, newest last
    seq = p.next_seq
    now = 0.0

    def check_event(event: PresenceEvent | None, expected: Any) -> None:
        nonlocal seq
        assert shape(event) == expected
        if event is not None:
            assert event.seq == seq
            seq += 1

    def tick_until(target: float) -> None:
        """The tick task between now and target: wake at each next_due() <= target."""
        while (due := p.next_due()) is not None and due <= target:
            fired = p.expire(due, wall(due))
            if not fired:
                after = p.next_due()
                assert after is None or after > due, f"expire({due}) returned nothing: the tick task would spin"
            for key, owner, event in fired:
                if owner is None:  # a grace offline
                    pending = ref.pending.pop(key)
                    assert pending[0] <= due + 1e-9
                    check_event(event, ("offline", key, "closed", pending[4], grace))
                    assert event is not None and event.ts == pending[1] and event.timeout == pending[3]
                    assert event.last_seen == pytest.approx(pending[2])
                    continue
                own, last, timeout = ref.sessions[key]
                assert owner is own
                assert due >= last + timeout - 1e-9, "offline before the deadline"
                assert due <= last + timeout + TICK + 1e-9, "offline more than one tick late"
                check_event(event, ref.end(key, due, "idle"))
        for key, (_, last, timeout) in ref.sessions.items():
            assert target < last + timeout + TICK + 1e-9, f"{key} missed its deadline"
        for uid, pending in ref.pending.items():
            assert target < pending[0], f"{uid}'s grace offline missed"

    for op, uid, device, arg in ops:
        key = uid if device is None else (uid, device)
        if op == "wait":
            tick_until(now + arg)
            now += arg
        elif op == "login":
            owner = Owner(f"{key}#{len(connections.get(key, ()))}")
            connections.setdefault(key, []).append(owner)
            online_before = p.is_online(uid)
            replaced, event = p.login(key, owner, now, wall(now), arg)
            # A login adds an event exactly when its user was not online: what a degraded server's rule relies
            # on (idled.server.engine.sessions.Sessions.brings_online).
            assert (event is not None) == (not online_before)
            expected_replaced, expected = ref.login(key, owner, now, arg)
            assert replaced == expected_replaced
            check_event(event, expected)
        elif op == "touch":
            p.touch(key, now)
            if key in ref.sessions:
                owner, _, timeout = ref.sessions[key]
                ref.sessions[key] = (owner, now, timeout)
        else:  # logout / closed, by the current owner (arg 0) or an older connection of the key
            owners = connections.get(key)
            if not owners:
                continue
            owner = owners[max(0, len(owners) - 1 - arg)]
            event = p.logout(key, owner, now, wall(now), op)
            if key in ref.sessions and ref.sessions[key][0] is owner:
                check_event(event, ref.end(key, now, op))
            else:
                assert event is None
        for u in UIDS:
            assert p.is_online(u) == ref.online(u)
            assert list(p.keys_of(u)) == ref.keys(u)
            assert list(p.devices_of(u)) == [k[1] for k in ref.keys(u) if isinstance(k, tuple)]
            assert p.in_grace(u) == (u in ref.pending)
            assert p.owner_of(u) is (ref.sessions[u][0] if u in ref.sessions else None)
        assert len(p) == len(ref.sessions)
        assert p.users() == sum(ref.online(u) for u in UIDS)
    tick_until(now + 5.0)
    assert not ref.sessions and not ref.pending and len(p) == 0 and p.users() == 0
    assert p._users == {} and p._user_keys.spare == 0  # type: ignore[attr-defined]
    final = p.end_all(now + 5.0, wall(now + 5.0), "shutdown")
    assert final == []
