"""The sans-IO client rules with plain numbers: keepalive schedule, backoff, gateway batching, observer cursor."""

from __future__ import annotations

import msgpack
import pytest

from idled.client.core import (
    Backoff, GatewayBatcher, KeepaliveTimer, ObserverCursor, asks_for_answer, check_device, check_key,
    default_ask_after, ping_interval,
)
from idled.client.errors import (
    AuthFailed, Busy, ConnectionLost, Gone, Kicked, ProtocolMismatch, Unavailable, error_from,
)
from idled.protocol import (
    MAX_DEVICE_BYTES, MAX_UID_BYTES, Attach, Detach, Event, Login, Subscribe, Touch, decode_client_body, encode,
)


def bodies(frames: list[bytes]) -> list[dict]:
    return [msgpack.unpackb(frame[4:], strict_map_key=False) for frame in frames]


def test_a_keepalive_asks_for_an_answer_only_after_ask_after_without_one() -> None:
    assert default_ask_after(30.0) == 60.0 and default_ask_after(0.2) == 1.0
    assert not asks_for_answer(20.0, 0.0, None, 60.0)  # asked (welcomed) 20 s ago: quiet
    assert asks_for_answer(60.0, 0.0, None, 60.0)  # ask_after since: a ping
    assert not asks_for_answer(80.0, 0.0, 60.0, 60.0)  # a ping is outstanding: it is the question already
    assert asks_for_answer(20.0, 19.9, None, 0.0)  # ask_after 0: every keepalive is a ping
    # at the default keepalive (interval = T / 1.5), one keepalive in three asks
    timeout, interval, asked, pings = 30.0, 20.0, 0.0, []
    for n in range(1, 10):
        now = n * interval
        pings.append(asks_for_answer(now, asked, None, default_ask_after(timeout)))
        if pings[-1]:
            asked = now
    assert pings == [False, False, True] * 3


def test_ping_interval_leaves_a_third_of_the_timeout() -> None:
    assert ping_interval(None, 10) is None
    assert ping_interval(15.0, 10.0) == 10.0  # T = 1.5 k: ping every k
    assert ping_interval(30.0, None) == 20.0  # server default timeout
    assert ping_interval(6.0, 10.0) == 4.0  # capped by max_timeout: ping earlier than k


def test_keepalive_timer_is_postponed_by_any_frame() -> None:
    timer = KeepaliveTimer(2.0, now=100.0)
    assert not timer.due(101.9) and timer.due(102.0)
    timer.sent(101.5)
    assert timer.deadline == 103.5 and not timer.due(102.0)


def test_backoff_full_jitter_is_capped() -> None:
    assert Backoff(0.1, 30.0, random=lambda: 1.0).delay(0) == pytest.approx(0.1)
    assert Backoff(0.1, 30.0, random=lambda: 1.0).delay(3) == pytest.approx(0.8)
    assert Backoff(0.1, 30.0, random=lambda: 1.0).delay(1000) == 30.0
    assert Backoff(0.1, 30.0, random=lambda: 0.0).delay(5) == 0.0


def test_batcher_coalesces_touches_and_keeps_order() -> None:
    batch = GatewayBatcher()
    batch.attach(["a", "b"], 10.0, now=1.0)
    batch.touch(["a"], now=1.1)  # the pending attach is activity already
    assert batch.pending == 2 and batch.first_pending == 1.0
    for _ in range(1000):
        batch.touch(["c", "d"], now=1.2)
    batch.detach(["a"], now=1.3)
    batch.touch(["b"], now=1.4)
    assert bodies(batch.take()) == [
        {"op": "attach", "uids": ["a", "b"], "keepalive": 10.0},
        {"op": "touch", "uids": ["c", "d"]},
        {"op": "detach", "uids": ["a"]},
        {"op": "touch", "uids": ["b"]},
    ]
    assert batch.pending == 0 and batch.first_pending is None and batch.take() == []
    assert batch.live == {"b": 10.0}


def test_batcher_splits_frames_under_the_limit_and_bounds_pending() -> None:
    batch = GatewayBatcher(max_pending=5000)
    batch.touch(range(5000), now=0.0)
    assert batch.full
    frames = batch.take(max_frame=4096)
    assert all(len(frame) - 4 <= 4096 for frame in frames) and len(frames) > 1
    assert [uid for body in bodies(frames) for uid in body["uids"]] == list(range(5000))
    batch.touch(["x" * 256] * 3, now=0.0)
    assert len(batch.take(max_frame=4096)) == 1


def test_batcher_reattaches_live_uids_by_keepalive() -> None:
    batch = GatewayBatcher()
    batch.attach([1, 2], 5.0, now=0.0)
    batch.attach([3], None, now=0.0)
    batch.detach([2], now=0.0)
    batch.take()
    batch.touch([1], now=1.0)
    batch.reattach(now=2.0)
    assert bodies(batch.take()) == [{"op": "attach", "uids": [1], "keepalive": 5.0}, {"op": "attach", "uids": [3]}]



def test_batcher_keeps_detach_reasons_apart_and_in_order() -> None:
    """A detach's reason (an edge's ``logout`` or ``closed``) is its own field of the group, not the keepalive's."""
    batch = GatewayBatcher()
    batch.attach(["a", "b", "c"], 30.0, now=0.0)
    assert batch.attaching
    batch.detach(["a"], now=0.0, reason="logout")
    batch.detach(["b"], now=0.0, reason="logout")
    batch.detach(["c"], now=0.0, reason="closed")
    batch.detach(["d"], now=0.0)
    assert bodies(batch.take()) == [
        {"op": "attach", "uids": ["a", "b", "c"], "keepalive": 30.0},
        {"op": "detach", "uids": ["a", "b"], "reason": "logout"},
        {"op": "detach", "uids": ["c"], "reason": "closed"},
        {"op": "detach", "uids": ["d"]},
    ]
    assert not batch.attaching and batch.live == {}


def test_batcher_forgets_uids_the_server_ended() -> None:
    batch = GatewayBatcher()
    batch.attach([1, 2], 5.0, now=0.0)
    batch.take()
    batch.forget([1, 3])
    batch.reattach(now=1.0)
    assert bodies(batch.take()) == [{"op": "attach", "uids": [2], "keepalive": 5.0}]

def event(seq: int) -> Event:
    return Event(seq, "online", "u", 0.0, "login", 0.0, 1.0)


def test_cursor_resumes_after_the_last_event_and_drops_duplicates() -> None:
    assert ObserverCursor().subscribe() == Subscribe(None)
    cursor = ObserverCursor(after=0)
    assert cursor.subscribe() == Subscribe(1, durable=True)  # a checkpoint: the durable view by default
    assert cursor.accept(event(1)) and cursor.accept(event(2))
    assert not cursor.accept(event(2)) and not cursor.accept(event(1))
    assert cursor.subscribe() == Subscribe(3, durable=True)
    with pytest.raises(ValueError):
        ObserverCursor(after=-1)


def test_watchlist_cursor_sends_its_whole_list_before_the_subscribe() -> None:
    assert ObserverCursor(uids=[]).subscribe() == Subscribe(None, False, ())
    assert bodies(ObserverCursor(after=4, uids=["a", 1, "a"]).subscribe_frames()) == [
        {"op": "subscribe", "from": 5, "durable": True, "uids": ["a", 1]}]
    many = [f"user-{i:05d}" for i in range(1000)]  # ~12 KB of uids: four frames of at most 4096 bytes
    cursor = ObserverCursor(after=9, durable=False, uids=many)
    frames = cursor.subscribe_frames()
    assert len(frames) == 4 and all(len(frame) - 4 <= 4096 for frame in frames)
    *watches, subscribe = bodies(frames)
    assert all(body.keys() == {"op", "uids"} and body["op"] == "watch" for body in watches)
    assert subscribe["op"] == "subscribe" and subscribe["from"] == 10 and "durable" not in subscribe
    assert [uid for body in bodies(frames) for uid in body["uids"]] == many
    assert bodies(cursor.watch(["x", "user-00001", "x"])) == [{"op": "watch", "uids": ["x", "user-00001"]}]
    assert bodies(cursor.unwatch(["user-00000", "nobody"])) == [{"op": "unwatch", "uids": ["user-00000", "nobody"]}]
    assert cursor.uids is not None and list(cursor.uids) == [*many[1:], "x"]
    assert len(cursor.watch(many)) == 4  # split like the subscribe
    with pytest.raises(ValueError, match="not a watchlist observer"):
        ObserverCursor().watch(["a"])
    assert ObserverCursor().subscribe_frames() == [encode(Subscribe())]  # a full observer: as before


def test_durable_defaults_to_having_a_checkpoint_and_can_be_overridden() -> None:
    assert ObserverCursor().subscribe() == Subscribe(None, durable=False)  # from now: the fast view
    assert ObserverCursor(durable=True).subscribe() == Subscribe(None, durable=True)
    assert ObserverCursor(after=41, durable=False).subscribe() == Subscribe(42, durable=False)
    assert ObserverCursor(after=41).subscribe() == Subscribe(42, durable=True)


def test_batcher_refuses_a_keepalive_the_server_would_refuse() -> None:
    batch = GatewayBatcher()
    for bad in (0.5, 86_401):
        with pytest.raises(ValueError):
            batch.attach([1], bad, 0.0)
    assert batch.pending == 0 and not batch.live


def test_errors_are_typed_and_know_whether_to_retry() -> None:
    assert isinstance(error_from("auth_failed", "x"), AuthFailed) and not error_from("auth_failed", "x").retryable
    assert isinstance(error_from("kicked", "x"), Kicked) and not error_from("kicked", "x").retryable
    assert isinstance(error_from("busy", "x"), Busy) and error_from("busy", "x").retryable
    assert isinstance(error_from("unavailable", "x"), Unavailable) and error_from("unavailable", "x").retryable
    assert error_from("server_shutdown", "x").retryable and ConnectionLost("reset").retryable
    unknown = error_from("new_code_from_the_future", "x")
    assert isinstance(unknown, ProtocolMismatch) and not unknown.retryable
    gone = error_from("gone", "seq 3 is no longer retained; oldest available is 1234")
    assert isinstance(gone, Gone) and gone.oldest_seq == 1234 and gone.code == "gone"


# ------------------------------------------------------------------------------------------- devices


def test_batcher_carries_session_keys_as_uid_device_arrays_that_decode_back_to_the_keys() -> None:
    """A device's session is the key (uid, device): batched, deduplicated and kept live like a uid, sent as
    the 2-array [uid, device] -- which the server's decoder turns back into the very tuple."""
    phone, laptop = ("alice", "phone"), ("alice", "laptop")
    batch = GatewayBatcher()
    batch.attach([phone, laptop, "bob", (7, "d0")], 30.0, now=0.0)
    batch.touch([phone], now=0.1)  # covered by the pending attach
    frames = batch.take()
    assert bodies(frames) == [
        {"op": "attach", "uids": [["alice", "phone"], ["alice", "laptop"], "bob", [7, "d0"]], "keepalive": 30.0}]
    assert decode_client_body(frames[0][4:]) == Attach((phone, laptop, "bob", (7, "d0")), 30.0)
    for _ in range(100):
        batch.touch([laptop, phone], now=1.0)
    batch.detach([phone], now=1.1, reason="logout")
    assert [decode_client_body(f[4:]) for f in batch.take()] == [Touch((laptop, phone)), Detach((phone,), "logout")]
    assert batch.live == {laptop: 30.0, "bob": 30.0, (7, "d0"): 30.0}
    batch.forget([laptop])  # the server ended it (idle, kicked): not re-attached
    batch.reattach(now=2.0)
    assert [decode_client_body(f[4:]) for f in batch.take()] == [Attach(("bob", (7, "d0")), 30.0)]


def test_batcher_splits_frames_of_the_largest_keys_under_the_limit() -> None:
    key = ("u" * MAX_UID_BYTES, "d" * MAX_DEVICE_BYTES)  # the largest key there is
    batch = GatewayBatcher()
    batch.touch([(key[0], f"{i:064d}") for i in range(40)] + [key], now=0.0)
    frames = batch.take(max_frame=1024)
    assert all(len(frame) - 4 <= 1024 for frame in frames) and len(frames) > 10
    assert [k for f in frames for k in decode_client_body(f[4:]).uids][-1] == key
    with pytest.raises(ValueError):
        batch.take(max_frame=MAX_UID_BYTES + MAX_DEVICE_BYTES)  # not even one largest key would fit


def test_keys_and_devices_are_checked_where_the_application_hands_them_over() -> None:
    assert check_key(("alice", "phone")) == ("alice", "phone") and check_key(42) == 42
    assert check_device(None) is None and check_device("é" * 32) == "é" * 32
    for bad in (["alice", "phone"], ("alice",), ("alice", "phone", "x"), ("alice", ""), ("alice", 3),
                ("", "phone"), ("alice", "x" * (MAX_DEVICE_BYTES + 1))):
        with pytest.raises(ValueError):
            check_key(bad)  # type: ignore[arg-type]
    for device in ("", "é" * 33, 5):
        with pytest.raises(ValueError):
            check_device(device)  # type: ignore[arg-type]


def test_a_session_with_a_device_logs_in_with_it_and_one_without_logs_in_as_before() -> None:
    from idled.client.session import Session
    from idled.client.trio import TRIO

    plain = Session(TRIO, "127.0.0.1", 1, "alice", keepalive=30)
    assert encode(plain.login) == encode(Login("uid", "alice", None, 30))  # byte for byte as before devices
    assert (plain.device, plain.key) == (None, "alice")
    phone = Session(TRIO, "127.0.0.1", 1, "alice", keepalive=30, device="phone")
    assert (phone.device, phone.key) == ("phone", ("alice", "phone"))
    assert msgpack.unpackb(encode(phone.login)[4:]) == {"op": "login", "uid": "alice", "keepalive": 30,
                                                       "device": "phone"}
    with pytest.raises(ValueError):
        Session(TRIO, "127.0.0.1", 1, "alice", device="")
