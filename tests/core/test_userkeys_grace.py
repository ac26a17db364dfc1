"""The presence table's two helpers on their own: `UserKeys` (idled.core.devices) and `GraceQueue`
(idled.core.grace), each walked through the worked example of its module docstring."""

from __future__ import annotations

import math

import pytest

from idled.core.devices import UserKeys, uid_of
from idled.core.grace import GraceQueue


def test_user_keys_worked_example() -> None:
    keys = UserKeys(max_devices=8)
    assert keys.admit("alice", "alice", plain=False) == (0, None) and keys.users == {} and keys.spare == 0
    assert keys.admit("alice", ("alice", "phone"), plain=True) == (1, None)
    assert keys.users == {"alice": ["alice", ("alice", "phone")]} and keys.spare == 1
    assert keys.admit("alice", ("alice", "laptop"), plain=True) == (2, None) and keys.spare == 2
    assert keys.remove("alice", "alice") == 2
    assert keys.users == {"alice": [("alice", "phone"), ("alice", "laptop")]} and keys.spare == 1
    assert keys.remove("alice", ("alice", "phone")) == 1
    assert keys.users == {"alice": ("alice", "laptop")} and keys.spare == 0
    assert keys.keys("alice", plain=False) == (("alice", "laptop"),) and keys.devices("alice") == ("laptop",)
    assert keys.remove("alice", ("alice", "laptop")) == 0 and keys.users == {}
    assert keys.keys("bob", plain=True) == ("bob",) and keys.keys("bob", plain=False) == () and keys.devices("bob") == ()
    assert uid_of(("alice", "phone")) == "alice" and uid_of(7) == 7


def test_user_keys_cap_names_the_oldest_and_renew_makes_a_key_the_newest() -> None:
    keys = UserKeys(max_devices=2)
    keys.admit("u", "u", plain=False)
    keys.admit("u", ("u", "a"), plain=True)
    keys.renew("u", "u")  # the plain key logged in again: the newest now
    assert keys.users == {"u": [("u", "a"), "u"]}
    assert keys.admit("u", ("u", "b"), plain=True) == (2, ("u", "a"))  # the oldest makes room
    assert keys.users == {"u": ["u", ("u", "b")]} and keys.spare == 1
    lone = UserKeys(max_devices=1)
    assert lone.admit("v", ("v", "a"), plain=True) == (1, "v")  # its plain key alone was the oldest
    assert lone.users == {"v": ("v", "a")} and lone.spare == 0
    for bad in (0, 1025, 2.0):
        with pytest.raises(ValueError):
            UserKeys(bad)  # type: ignore[arg-type]


def test_grace_queue_worked_example() -> None:
    queue = GraceQueue(5.0)
    queue.wait("a", 1.0, 101.0, 100.5, 45.0, None)
    queue.wait("b", 2.0, 102.0, 101.5, 45.0, "phone")
    assert queue.next_due() == 6.0 and queue.last_seen("a") == 100.5
    assert queue.cancel("a") and not queue.cancel("a") and len(queue) == 2  # a's entry is stale now
    assert queue.pop_due(6.5) == [] and len(queue) == 1 and queue.next_due() == 7.0  # the stale front dropped
    [b] = queue.pop_due(7.0)
    assert (b.uid, b.ts, b.last_seen, b.device) == ("b", 102.0, 101.5, "phone")
    assert len(queue) == 0 and queue.pending == {} and queue.next_due() is None and queue.last_seen("b") is None


def test_grace_queue_limit_order_and_bounds() -> None:
    queue = GraceQueue(1.0)
    for uid in range(5):
        queue.wait(uid, 0.1 * uid, 0.0, 0.0, 1.0, None)
    assert [p.uid for p in queue.pop_due(math.inf, limit=2)] == [0, 1]
    assert [p.uid for p in queue.pop_due(math.inf)] == [2, 3, 4]
    for bad in (-1.0, 3601.0, float("nan")):
        with pytest.raises(ValueError):
            GraceQueue(bad)
