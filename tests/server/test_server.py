"""idled.server.app over trio.testing memory streams, on pytest-trio's autojump clock: no real sleeps.

The server runs in-process with no listeners (``tests.peers.running``); each test connection is one end of
``trio.testing.memory_stream_pair()`` whose other end is handed to ``server.handle`` -- the very handler
the accept loop runs. Every time below is virtual: the autojump clock jumps to the next deadline whenever
every task is blocked, so "silent for 1 s" costs nothing, and an offline can be placed at an exact instant.
(While the log writer works in a thread, virtual time keeps jumping from deadline to deadline; every
task lives on that one clock, so nothing here depends on real time.)
"""

from __future__ import annotations

import functools
import math
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from idled.protocol import tokens as auth
from idled.protocol import (
    BYE,
    PING,
    PING_FRAME,
    PONG,
    Attach,
    Detach,
    Error,
    Event,
    Login,
    Msg,
    Query,
    Status,
    Subscribe,
    Touch,
    Welcome,
    encode,
)

from idled.log.eventlog import encode_record, segment_name
from tests import peers
from tests.peers import frame

TICK = 0.1
TIMEOUT = 1.0
BASE: dict[str, Any] = dict(tick=TICK, timeout=TIMEOUT, max_timeout=60.0, login_timeout=2.0)
SLACK = 1e-6  # float noise on the virtual clock


# Every test's server: in-process, no listeners, a fresh metrics registry (tests.peers.running).
running = functools.partial(peers.running, **BASE)


# -- login, ping, logout ----------------------------------------------------------------------------------


async def test_serve_with_no_listeners_starts_and_stops(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        assert h.server.ports == []
        h.server.stop()
        await h.done.wait()
    assert h.server.stopping


async def test_login_ping_msg_bye(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        user = await h.connect()
        await user.send(Login("uid", "alice", None, 1.0))
        welcome = await user.expect(Welcome)
        assert welcome == Welcome("uid", "alice", 1.5)  # MQTT rule: 1.5 x keepalive
        await user.send(PING)
        assert await user.recv() is PONG
        await user.send(Msg({"text": "hi", "n": [1, 2]}))  # activity; no reply
        await user.send(PING)
        assert await user.recv() is PONG
        await user.send_raw(encode(Msg(None)) + PING_FRAME + PING_FRAME)  # several frames in one write
        assert await user.recv() is PONG and await user.recv() is PONG
        events, status = await obs.events_until_status(["alice", "bob"])
        assert status.online == {"alice": True, "bob": False}
        assert [(e.kind, e.uid, e.reason) for e in events] == [("online", "alice", "login")]
        assert events[0].extra == {"timeout": 1.5, "detector": "ring-lazy"}
        await user.send(BYE)
        assert await user.recv() is None
        events, status = await obs.events_until_status(["alice"])
        assert [(e.kind, e.uid, e.reason) for e in events] == [("offline", "alice", "logout")]
        assert status.online == {"alice": False}
        assert h.metric("idled_logins_total", role="user", result="ok") == 1
        assert h.metric("idled_logins_total", role="observer", result="ok") == 1


async def test_closing_the_connection_is_offline_closed(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        user = await h.user(7)
        await user.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        events, status = await obs.events_until_status([7])
        assert [(e.kind, e.uid, e.reason) for e in events] == [("online", 7, "login"), ("offline", 7, "closed")]
        assert status.online == {7: False}
        assert events[1].seq == events[0].seq + 1


# -- idle expiry, at exactly the right virtual time -------------------------------------------------------------


async def test_idle_expiry_at_the_first_tick_after_the_deadline(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        user = await h.user("idler")
        await trio.sleep(0.537)
        t_ping = trio.current_time()
        await user.send(PING)
        assert await user.recv() is PONG
        assert trio.current_time() == t_ping  # memory streams: no time passes on the way
        deadline = t_ping + TIMEOUT
        # just before the deadline: still online
        await trio.sleep_until(deadline - 0.002)
        events, status = await obs.events_until_status(["idler"])
        assert status.online == {"idler": True} and [e.kind for e in events] == ["online"]
        error = await user.recv()
        t_error = trio.current_time()
        assert isinstance(error, Error) and error.code == "idle_timeout"
        assert await user.recv() is None
        offline = await obs.expect(Event)
        t_offline = trio.current_time()
        assert (offline.kind, offline.uid, offline.reason) == ("offline", "idler", "idle")
        expected = math.ceil(deadline / TICK - 1e-9) * TICK  # the first tick at or after the deadline
        assert deadline - SLACK <= t_offline <= deadline + TICK + SLACK
        assert t_offline == pytest.approx(expected, abs=SLACK)
        assert t_error == pytest.approx(expected, abs=SLACK)
        # the record's wall-clock fields: deadline = last_seen + timeout, ts - deadline = virtual lateness
        assert offline.deadline - offline.last_seen == pytest.approx(TIMEOUT, abs=1e-5)
        assert offline.ts - offline.deadline == pytest.approx(expected - deadline, abs=1e-5)
        assert offline.extra == {"timeout": TIMEOUT, "detector": "ring-lazy"}
        assert h.metric("idled_offline_lateness_seconds_count") == 1
        assert h.metric("idled_presence_events_total", kind="offline", reason="idle") == 1


async def test_keepalive_login_expires_after_one_and_a_half_keepalives(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """tick 0.2 and keepalive 1.5: timeout 2.25 is not a whole number of ticks."""
    async with running(tmp_path, tick=0.2) as h:
        obs = await h.observer()
        await trio.sleep(0.22)  # deadline 2.47 -> tick 2.6; ceil(0.22 / 0.2) + ceil(2.25 / 0.2) ticks would say 2.8
        t_login = trio.current_time()
        user = await h.user("k", keepalive=1.5)
        error = await user.recv()
        t_off = trio.current_time()
        assert isinstance(error, Error) and error.code == "idle_timeout"
        deadline = t_login + 2.25
        assert deadline - SLACK <= t_off <= deadline + 0.2 + SLACK
        assert t_off == pytest.approx(math.ceil(deadline / 0.2 - 1e-9) * 0.2, abs=SLACK)
        events, _ = await obs.events_until_status()
        assert [(e.kind, e.reason, e.extra["timeout"]) for e in events] == [("online", "login", 2.25), ("offline", "idle", 2.25)]


async def test_many_users_each_expire_on_time(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """Logins spread over 2 s, each pinging a random number of times: every offline lands in its tick."""
    async with running(tmp_path) as h:
        obs = await h.observer()
        last_activity: dict[int, float] = {}
        offline_at: dict[int, float] = {}

        async def one(uid: int) -> None:
            await trio.sleep(uid * 0.0731 % 2.0)
            peer = await h.user(uid)
            last_activity[uid] = trio.current_time()
            for _ in range(uid % 4):
                await trio.sleep(0.3 + uid * 0.013 % 0.5)
                await peer.send(PING)
                assert await peer.recv() is PONG
                last_activity[uid] = trio.current_time()
            await peer.expect_error("idle_timeout")

        async def watch() -> None:
            while len(offline_at) < 40:
                event = await obs.expect(Event)
                if event.kind == "offline":
                    assert event.reason == "idle"
                    offline_at[event.uid] = trio.current_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            for uid in range(40):
                nursery.start_soon(one, uid)
        for uid, t in offline_at.items():
            deadline = last_activity[uid] + TIMEOUT
            assert deadline - SLACK <= t <= deadline + TICK + SLACK, (uid, deadline, t)


# -- duplicate login ----------------------------------------------------------------------------------------------


async def test_duplicate_login_kicks_the_old_connection_without_a_flap(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        first = await h.user("dup")
        await trio.sleep(0.7)
        t_second = trio.current_time()
        second = await h.user("dup", keepalive=2.0)
        error = await first.expect_error("kicked")
        assert "elsewhere" in error.reason
        events, status = await obs.events_until_status(["dup"])
        assert [(e.kind, e.reason) for e in events] == [("online", "login")]  # no offline/online pair
        assert status.online == {"dup": True}
        # the session now follows the new connection's timeout (3 s from the takeover), not the old 1 s
        await trio.sleep_until(t_second + 2.9)
        _, status = await obs.events_until_status(["dup"])
        assert status.online == {"dup": True}
        await second.expect_error("idle_timeout")
        assert trio.current_time() == pytest.approx(t_second + 3.0, abs=TICK + SLACK)
        events, _ = await obs.events_until_status()
        assert [(e.kind, e.reason, e.seq) for e in events] == [("offline", "idle", 2)]


async def test_a_kicked_connection_closing_late_does_not_end_the_new_session(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        first = await h.user("u")
        second = await h.user("u")
        await first.expect_error("kicked")
        await first.stream.aclose()
        await second.send(PING)
        assert await second.recv() is PONG
        events, status = await obs.events_until_status(["u"])
        assert status.online == {"u": True} and [e.kind for e in events] == ["online"]


# -- gateways ---------------------------------------------------------------------------------------------------


async def test_gateway_attach_touch_detach(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        gw = await h.gateway()
        t_attach = trio.current_time()
        await gw.send(Attach(("a", "b", "c", 4), 2.0))  # timeout 3.0 each
        await gw.send(PING)
        assert await gw.recv() is PONG
        events, status = await obs.events_until_status(["a", "b", "c", 4, "x"])
        assert sorted((e.kind, str(e.uid), e.reason, e.extra["timeout"]) for e in events) == [
            ("online", "4", "login", 3.0), ("online", "a", "login", 3.0),
            ("online", "b", "login", 3.0), ("online", "c", "login", 3.0),
        ]
        assert status.online == {"a": True, "b": True, "c": True, 4: True, "x": False}
        await gw.send(Detach(("b",)))
        # "a" is touched every second; "c" and 4 stay silent and expire 3 s after the attach
        offline: dict[Any, tuple[float, str]] = {}
        for _ in range(5):
            await trio.sleep(1.0)
            await gw.send(Touch(("a",)))
            await gw.send(PING)
            assert await gw.recv() is PONG
            events, _ = await obs.events_until_status()
            for e in events:
                assert e.kind == "offline"
                offline[e.uid] = (trio.current_time(), e.reason)
        assert offline["b"][1] == "detach"
        for uid in ("c", 4):
            assert offline[uid][1] == "idle"
            assert offline[uid][0] >= t_attach + 3.0 - SLACK  # seen at the next flush: only the lower bound here
        assert "a" not in offline
        _, status = await obs.events_until_status(["a", "b", "c", 4])
        assert status.online == {"a": True, "b": False, "c": False, 4: False}


async def test_gateway_expiry_is_exact(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        gw = await h.gateway()
        await trio.sleep(0.05)
        t_attach = trio.current_time()
        await gw.send(Attach(("s",)))
        online = await obs.expect(Event)
        offline = await obs.expect(Event)
        t = trio.current_time()
        assert (online.kind, offline.kind, offline.reason) == ("online", "offline", "idle")
        assert t == pytest.approx(math.ceil((t_attach + TIMEOUT) / TICK - 1e-9) * TICK, abs=SLACK)
        await gw.send(PING)  # the gateway connection itself is not ended by one session's expiry
        assert await gw.recv() is PONG


async def test_gateway_loss_ends_all_its_sessions(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, timeout=30.0) as h:
        obs = await h.observer()
        gw = await h.gateway("edge-1")
        uids = tuple(f"g{i}" for i in range(50))
        await gw.send(Attach(uids))
        other = await h.gateway("edge-2")
        await other.send(Attach(("elsewhere",)))
        taken = await h.user("g0")  # a direct login takes g0 over from the gateway: no event
        events, _ = await obs.events_until_status()
        assert sorted(e.uid for e in events) == sorted(uids + ("elsewhere",))
        await gw.stream.aclose()  # the gateway goes away
        await trio.testing.wait_all_tasks_blocked()
        events, status = await obs.events_until_status(list(uids) + ["elsewhere"])
        assert all((e.kind, e.reason) == ("offline", "gateway_lost") for e in events)
        assert sorted(e.uid for e in events) == sorted(uids[1:])
        assert status.online == {**{u: False for u in uids[1:]}, "g0": True, "elsewhere": True}
        await taken.send(PING)
        assert await taken.recv() is PONG


async def test_gateway_touch_of_a_taken_over_session_is_ignored(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        gw = await h.gateway()
        await gw.send(Attach(("shared",), 100.0))
        await obs.expect(Event)
        t_user = trio.current_time()
        user = await h.user("shared")  # timeout 1.0 from now

        async def touches() -> None:
            for _ in range(4):
                await trio.sleep(0.4)
                await gw.send(Touch(("shared",)))  # no longer the owner: must not keep it alive

        async with trio.open_nursery() as nursery:
            nursery.start_soon(touches)
            await user.expect_error("idle_timeout")
            assert trio.current_time() == pytest.approx(t_user + TIMEOUT, abs=TICK + SLACK)
        offline = await obs.expect(Event)
        assert (offline.kind, offline.reason) == ("offline", "idle")


# -- observers ----------------------------------------------------------------------------------------------------


async def test_observer_subscribe_and_query(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        early = await h.user("early")
        obs = await h.observer()  # live from now: does not see "early"'s login
        late = await h.user(12345)
        await early.send(BYE)
        await late.send(BYE)
        events, status = await obs.events_until_status(["early", 12345, "12345"])
        assert [(e.kind, e.uid, e.reason) for e in events] == [
            ("online", 12345, "login"), ("offline", "early", "logout"), ("offline", 12345, "logout")
        ]
        assert [e.seq for e in events] == [2, 3, 4]
        assert status.online == {"early": False, 12345: False, "12345": False}
        # a query-only observer (never subscribed) gets answers but no events
        quiet = await h.connect()
        await quiet.send(Login("observer", "quiet"))
        await quiet.expect(Welcome)
        await h.user("third")
        await quiet.send(Query(("third",)))
        assert await quiet.expect(Status) == Status({"third": True})
        await quiet.send(PING)
        assert await quiet.recv() is PONG


# -- every error code ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x00\x00\x00\x01\xc1", "bad_frame"),  # reserved msgpack byte
        (b"\x00\x00\x00\x00", "bad_frame"),  # empty frame
        (struct.pack(">I", 4097), "too_large"),  # over max_frame: refused from the prefix alone
        (struct.pack(">I", 0xFFFFFFFF), "too_large"),
        (frame([1, 2, 3]), "bad_message"),  # not a map
        (frame({"op": "login", "uid": 1.5}), "bad_message"),  # wrong type
        (PING_FRAME, "not_logged_in"),
        (frame({"op": "subscribe"}), "not_logged_in"),
    ],
)
async def test_bad_first_frames(tmp_path: Path, autojump_clock: trio.testing.MockClock, data: bytes, code: str) -> None:
    async with running(tmp_path) as h:
        peer = await h.connect()
        await peer.send_raw(data)
        await peer.expect_error(code)
        assert h.metric("idled_frames_rejected_total", reason=code) == 1
        assert h.server.connections == {"user": 0, "gateway": 0, "observer": 0, "standby": 0, "pending": 0}


async def test_bad_frame_after_login_ends_the_session(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        user = await h.user("u")
        await user.send_raw(b"\x00\x00\x00\x02\x81\xc1")
        await user.expect_error("bad_frame")
        events, _ = await obs.events_until_status()
        assert [(e.kind, e.reason) for e in events] == [("online", "login"), ("offline", "closed")]


async def test_end_of_stream_inside_a_frame_is_a_bad_frame(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        pending = await h.connect()
        await pending.send_raw(encode(Login("uid", "x"))[:7])
        await pending.stream.send_eof()
        await pending.expect_error("bad_frame")
        user = await h.user("y")
        await user.send_raw(PING_FRAME[:-1])
        await user.stream.send_eof()
        error = await user.expect_error("bad_frame")
        assert "end of stream" in error.reason


async def test_login_timeout(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, login_timeout=3.0) as h:
        start = trio.current_time()
        silent = await h.connect()
        slow = await h.connect()
        await slow.send_raw(encode(Login("uid", "slow"))[:5])  # a partial login does not extend the deadline
        await silent.expect_error("login_timeout")
        assert trio.current_time() == pytest.approx(start + 3.0, abs=SLACK)
        await slow.expect_error("login_timeout")
        assert h.metric("idled_frames_rejected_total", reason="login_timeout") == 2


async def test_not_allowed_per_role(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as h:
        user = await h.user("u")
        await user.send(Attach(("v",)))
        await user.expect_error("not_allowed")
        gw = await h.gateway()
        await gw.send(Subscribe(None))
        await gw.expect_error("not_allowed")
        obs = await h.observer()
        await obs.send(Subscribe(None))  # twice
        error = await obs.expect_error("not_allowed")
        assert "already subscribed" in error.reason
        obs2 = await h.observer("o2")
        await obs2.send(Touch(("u",)))
        await obs2.expect_error("not_allowed")
        obs3 = await h.observer("o3")
        await obs3.send_raw(b"\x00\x00\x00\x01\xc1")  # framing errors reach observers' error frames too
        await obs3.expect_error("bad_frame")


async def test_auth_failed_and_accepted(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"0123456789abcdef0123456789abcdef\n")
    secret = auth.load_secret(secret_file)
    expires = time.time() + 3600
    async with running(tmp_path, secret_file=str(secret_file)) as h:
        for login in [
            Login("uid", "alice"),  # no token
            Login("uid", "alice", "garbage"),
            Login("uid", "alice", auth.mint(secret, "uid", "bob", expires)),  # another name
            Login("uid", "alice", auth.mint(secret, "observer", "alice", expires)),  # another role
            Login("uid", "alice", auth.mint(b"another secret of 32 bytes......", "uid", "alice", expires)),
            Login("uid", "alice", auth.mint(secret, "uid", "alice", time.time() - 1)),  # expired
        ]:
            peer = await h.connect()
            await peer.send(login)
            await peer.expect_error("auth_failed")
        assert h.metric("idled_logins_total", role="user", result="auth_failed") == 6
        user = await h.user("alice", token=auth.mint(secret, "uid", "alice", expires))
        await user.send(PING)
        assert await user.recv() is PONG
        gw = await h.connect()
        await gw.send(Login("gateway", "gw", auth.mint(secret, "gateway", "gw", expires)))
        assert (await gw.expect(Welcome)).role == "gateway"
        assert h.metric("idled_logins_total", role="user", result="ok") == 1


async def test_busy_beyond_max_connections(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, max_connections=2, login_timeout=4.0, timeout=30.0) as h:
        a = await h.user("a")
        pending = await h.connect()  # pending counts too
        refused = await h.connect()
        error = await refused.expect_error("busy")
        assert "too many" in error.reason
        # A connection that has not logged in for half the login deadline makes room for a newer one (it may be
        # holding a slot on purpose: idled.door.gate); one within it is never cut short, as just seen.
        await trio.sleep(2.1)
        newer = await h.connect()
        assert "made room for a newer one" in (await pending.expect_error("busy")).reason
        await newer.send(Login("uid", "n"))
        await newer.expect(Welcome)
        await a.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        b = await h.user("b")  # room again
        await b.send(PING)
        assert await b.recv() is PONG


async def test_stop_sends_server_shutdown_and_logs_shutdown_events(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as h:
        obs = await h.observer()
        users = [await h.user(f"u{i}") for i in range(5)]
        gw = await h.gateway()
        await gw.send(Attach(("g1", "g2")))
        pending = await h.connect()  # connected, not yet logged in
        events, _ = await obs.events_until_status()
        assert len(events) == 7
        h.server.stop()
        for user in users:
            await user.expect_error("server_shutdown")
        late = await h.connect()
        await late.expect_error("server_shutdown")  # refused while stopping
        await pending.send(Login("uid", "late-login"))  # login completing after the sessions were ended
        await pending.expect_error("server_shutdown")
        offline = [await obs.expect(Event) for _ in range(7)]
        assert {(e.kind, e.reason) for e in offline} == {("offline", "shutdown")}
        assert {e.uid for e in offline} == {"u0", "u1", "u2", "u3", "u4", "g1", "g2"}
        await obs.expect_error("server_shutdown")  # after every shutdown event
        await gw.expect_error("server_shutdown")
        await h.done.wait()
    records = h.records()
    assert [r["seq"] for r in records] == list(range(1, 15))
    assert [(r["kind"], r["reason"]) for r in records[7:]] == [("offline", "shutdown")] * 7
    assert "late-login" not in {r["uid"] for r in records}


async def test_gateway_attach_after_shutdown_began_is_refused(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """Between ending every session and closing the gateways, an attach must not start sessions that
    nothing will end (and whose online events would miss the closed log)."""
    async with running(tmp_path) as h:
        # a slow observer (not reading) holds the shutdown open until the grace period ends
        obs = await h.observer(lockstep=True)
        gw = await h.gateway()
        user = await h.user("u")
        h.server.stop()
        await user.expect_error("server_shutdown")  # end_all() has run
        await gw.send(Attach(("too-late",)))
        await gw.expect_error("server_shutdown")
        assert not h.done.is_set()  # the refusal came from the attach, not from the end of the shutdown
        assert (await obs.expect(Event)).uid == "u"  # its online
        offline = await obs.expect(Event)
        assert (offline.uid, offline.reason) == ("u", "shutdown")
        await obs.expect_error("server_shutdown")  # nothing for "too-late" in between
        await h.done.wait()
    assert [(r["uid"], r["reason"]) for r in h.records()] == [("u", "login"), ("u", "shutdown")]


async def test_gone_when_from_is_older_than_retention(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import idled.server.engine.bus

    monkeypatch.setattr(idled.server.engine.bus, "RECENT_EVENTS", 10)
    async with running(tmp_path, segment_bytes=4096, retention_bytes=4096) as h:
        for i in range(60):  # 120 events of ~150 bytes: several 4 KiB segments, the oldest deleted
            user = await h.user(f"user-{i:03d}")
            await user.send(BYE)
            assert await user.recv() is None
        await trio.sleep(1.0)  # let the writer (and its retention) catch up
        oldest = h.server.log.oldest_seq()
        assert oldest is not None and oldest > 1
        obs = await h.observer(from_seq=1)
        error = await obs.expect_error("gone")
        available = int(error.reason.rsplit(" ", 1)[1])  # "... oldest available is N"
        assert 1 < available <= oldest  # the disk's oldest, or older if the memory window reaches further back
        ok = await h.observer("ok", from_seq=available)
        replayed = [await ok.expect(Event) for _ in range(121 - available)]
        assert [e.seq for e in replayed] == list(range(available, 121))
        refused = await h.observer("refused", from_seq=available - 1)
        await refused.expect_error("gone")


# -- the stall guard ------------------------------------------------------------------------------------------


async def test_stall_guard_a_paused_process_does_not_expire_everyone(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Simulating SIGSTOP/SIGCONT honestly: `MockClock.jump()` from inside the running test task moves the
    clock while no other task can run -- what the event loop sees after a pause: one scheduling round, then
    the next one 10 s later, with the timer tasks (tick, monitor) all overdue and the clients' packets,
    which sat in the kernel during the pause, ready to read right after. `user` pings right after the
    pause (its keepalive was queued); `silent` sent nothing. Neither may go offline at the wake-up: both
    deadlines move by the pause."""
    async with running(tmp_path, stall_ticks=2) as h:
        obs = await h.observer()
        user = await h.user("pinger")
        silent = await h.user("silent")
        t_login = trio.current_time()
        await trio.sleep(0.6)
        autojump_clock.jump(10.0)  # nothing runs during these 10 s
        t_wake = trio.current_time()
        await user.send(PING)
        assert await user.recv() is PONG
        events, status = await obs.events_until_status(["pinger", "silent"])
        assert status.online == {"pinger": True, "silent": True}
        assert [e.kind for e in events] == ["online", "online"]
        assert h.server.clock.paused >= 10.0
        # "silent" had 0.4 s left before the pause: it goes offline 0.4 s after the wake-up, not at once
        await silent.expect_error("idle_timeout")
        t_silent = trio.current_time()
        remaining = t_login + TIMEOUT - (t_wake - 10.0)
        assert t_wake + remaining - SLACK <= t_silent <= t_wake + remaining + TICK + 0.02
        # "pinger" pinged at the wake-up: offline one timeout after that ping
        await user.expect_error("idle_timeout")
        assert t_wake + TIMEOUT - SLACK <= trio.current_time() <= t_wake + TIMEOUT + TICK + 0.02


async def test_no_stall_guard_while_the_loop_keeps_running(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """The control: 10 s of silence during which the loop *could* run is an ordinary expiry, on time."""
    async with running(tmp_path, stall_ticks=2) as h:
        silent = await h.user("silent")
        await trio.sleep(10.0)
        assert h.server.clock.paused == 0.0
        error = await silent.recv()
        assert isinstance(error, Error) and error.code == "idle_timeout"
        records = [r for r in h.records() if r["kind"] == "offline"]
        assert len(records) == 1 and records[0]["reason"] == "idle"
        assert 0 <= records[0]["ts"] - records[0]["deadline"] < TICK + 1e-5


# -- restart: sessions a previous run left online ------------------------------------------------------------------


async def test_sessions_left_online_get_restart_records(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    from idled.log.eventlog import EventLog

    data = tmp_path / "data"
    with EventLog(data) as log:  # what a run killed with two sessions online leaves behind
        log.recover()
        log.append([
            {"seq": 1, "kind": "online", "uid": "a", "ts": 1.0, "reason": "login", "last_seen": 1.0, "deadline": 2.0, "timeout": 1.0},
            {"seq": 2, "kind": "online", "uid": "b", "ts": 1.0, "reason": "login", "last_seen": 1.0, "deadline": 2.0, "timeout": 1.0},
            {"seq": 3, "kind": "offline", "uid": "a", "ts": 1.5, "reason": "logout", "last_seen": 1.5, "deadline": 2.5, "timeout": 1.0},
            {"seq": 4, "kind": "online", "uid": "c", "ts": 1.6, "reason": "login", "last_seen": 1.6, "deadline": 4.6, "timeout": 3.0},
        ])
        log.sync()
    async with running(tmp_path) as h:
        obs = await h.observer(from_seq=1)
        replayed = [await obs.expect(Event) for _ in range(6)]
        assert [e.seq for e in replayed] == [1, 2, 3, 4, 5, 6]
        assert {(e.uid, e.reason) for e in replayed[4:]} == {("b", "restart"), ("c", "restart")}
        restart_c = next(e for e in replayed[4:] if e.uid == "c")
        assert (restart_c.last_seen, restart_c.extra["timeout"]) == (1.6, 3.0)
        user = await h.user("b")
        online = await obs.expect(Event)
        assert (online.seq, online.kind, online.uid) == (7, "online", "b")
        await user.send(BYE)


# -- a server given no metrics ----------------------------------------------------------------------------------


def test_null_metrics_has_everything_the_server_bumps() -> None:
    """A server given no metrics gets a NullMetrics and bumps it unconditionally: it must have every public
    attribute of Metrics, and each must take the calls the server makes. (test_replay.py runs whole servers on
    it.)"""
    from prometheus_client import CollectorRegistry

    from idled.ops.metrics import Metrics
    from idled.ops.nullmetrics import NullMetrics

    real = Metrics(CollectorRegistry(), tick=TICK, process_collectors=False)
    public = {name for name in [*vars(real), *dir(Metrics)] if not name.startswith("_")}
    null = NullMetrics()
    assert sorted(name for name in public if not hasattr(null, name)) == []
    null.logins.labels(role="user", result="ok").inc()
    null.offline_lateness.observe(0.01)
    null.event_loop_stall_max.set(1.0)
    null.observe_loop_lag(0.5)
    null.register_snapshot(dict)
    assert null.registry is None and null.render() == b""


# -- the log's damage, as an operator sees it ----------------------------------------------------------------


async def test_damage_the_recovery_skipped_is_a_gauge(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    records = [
        {"seq": seq, "kind": "online", "uid": f"u{seq}", "ts": 1.7e9, "reason": "login", "last_seen": 1.7e9,
         "deadline": 1.7e9 + 30, "timeout": 30.0}
        for seq in range(1, 5)
    ]
    encoded = [encode_record(r) for r in records]
    damaged = bytearray(encoded[1])
    damaged[-1] ^= 0x01  # a flipped body byte: record 2 is lost, 3 and 4 follow it
    (data_dir / segment_name(1)).write_bytes(encoded[0] + bytes(damaged) + encoded[2] + encoded[3])
    async with running(tmp_path) as h:
        assert h.metric("idled_eventlog_damaged_records") == 1
        assert h.metric("idled_eventlog_damaged_bytes") == len(damaged)
        # Every good record survived: 1, 3, 4 (and their restart offlines after them).
        assert [r["seq"] for r in h.records()][:3] == [1, 3, 4]
