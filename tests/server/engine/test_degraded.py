"""A server whose event log's disk is full runs degraded (idled.server.engine.degraded): new work is refused with
``unavailable`` -- user logins, gateway attaches of new sessions (an ``ended`` notice, or the error frame for
a gateway that takes none), API kicks -- while the sessions online are kept; what cannot be held is left to
its deadline; and it all ends by itself once there is room. ENOSPC is injected (tests/fulldisk.py); the
daemon on a real full tmpfs is tests/faults/test_disk_full.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from idled.protocol import BYE, PING, PONG, Attach, Detach, Ended, Error, ErrorCode, Login, Touch, Welcome
from idled.server.engine import bus as bus_module
from tests.fulldisk import FullDisk
from tests.peers import Client, Harness, running
from tests.server.api.conftest import api_server
from tests.server.api.httpclient import HttpClient


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    return FullDisk(monkeypatch)


async def answer_to_login(h: Harness, uid: str, keepalive: float | None = None) -> object:
    peer = await h.connect()
    await peer.send(Login("uid", uid, None, keepalive))
    return await peer.recv()


async def until(condition: object, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():  # type: ignore[operator]
            await trio.sleep(0.01)


def assert_gap_free(h: Harness) -> list[dict[str, object]]:
    records = h.records()
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    return records


async def test_a_degraded_server_refuses_new_work_keeps_its_sessions_and_recovers(
    tmp_path: Path, disk: FullDisk, autojump_clock: trio.testing.MockClock
) -> None:
    async with api_server(tmp_path, fsync="always") as h:
        alice = await h.user("alice")
        notified = await h.connect()
        await notified.send(Login("gateway", "edge-like", ended=True))
        await notified.expect(Welcome)
        await notified.send(Attach(("g1",)))
        plain = await h.gateway("plain")
        await until(lambda: len(h.records()) == 2)

        disk.full = True
        await h.user("bob")  # accepted: its online is what finds the disk full
        await until(lambda: h.server.degraded.reason is not None)
        assert h.server.status()["degraded"] == "event log: No space left on device"
        assert h.server.snapshot()["eventlog_degraded"] == 1

        refused = await answer_to_login(h, "carol")
        assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE
        await notified.send(Attach(("g1", "g2")))  # g1 is its own already: kept; g2 would be new
        assert await notified.expect(Ended) == Ended(("g2",), "unavailable")
        await plain.send(Attach(("p1",)))  # no notices: only the error frame can say it
        await plain.expect_error(ErrorCode.UNAVAILABLE)
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as http:
            kick = await http.post("/v1/kick", {"uid": "alice"})
        assert kick.status == 503 and kick.json()["error"]["code"] == "unavailable"
        assert kick.headers.get("retry-after") == "1"
        await alice.send(PING)  # what is online stays online
        assert await alice.recv() is PONG
        await alice.send(BYE)  # ... and may leave: its offline is held
        assert await alice.recv() is None
        assert h.server.status()["events_held"] >= 2

        disk.full = False
        await until(lambda: h.server.degraded.reason is None)
        assert isinstance(await answer_to_login(h, "carol"), Welcome)
        await until(lambda: h.server.status()["events_held"] == 0)
        records = assert_gap_free(h)
    assert [(r["uid"], r["kind"]) for r in records[:5]] == [
        ("alice", "online"), ("g1", "online"), ("bob", "online"), ("alice", "offline"), ("carol", "online")]


async def test_a_logout_that_cannot_be_held_is_left_to_its_deadline_never_early(
    tmp_path: Path, disk: FullDisk, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setattr(bus_module, "LOG_BACKLOG_LIMIT", 3)  # the bound on what waits for the writer
    async with running(tmp_path, tick=0.1) as h:
        users = [await h.user(f"u{i}", keepalive=1.0) for i in range(8)]  # timeout 1.5 s
        await until(lambda: len(h.records()) == 8)
        disk.full = True
        for user in users:
            await user.send(BYE)
            assert await user.recv() is None
        await until(lambda: h.server.degraded.reason is not None)
        assert h.server.bus.backlog() <= 4  # the rest were not published
        left = [uid for uid in (f"u{i}" for i in range(8)) if h.server.running.presence.is_online(uid)]  # type: ignore[union-attr]
        assert left, "every logout was held: the bound did not hold"
        await trio.sleep(5)  # past their deadlines: the tick task waits for room rather than publish more
        assert all(h.server.running.presence.is_online(uid) for uid in left)  # type: ignore[union-attr]
        disk.full = False
        await until(lambda: h.server.degraded.reason is None and not any(
            h.server.running.presence.is_online(uid) for uid in left))  # type: ignore[union-attr]
        await until(lambda: len(h.records()) == 16)
        records = assert_gap_free(h)
    offline = {r["uid"]: r for r in records if r["kind"] == "offline"}
    assert {uid for uid, r in offline.items() if r["reason"] == "idle"} == set(left)
    assert all(offline[uid]["ts"] >= offline[uid]["deadline"] for uid in left)  # late, never early


async def test_a_server_started_on_a_full_disk_comes_up_refusing_logins_then_takes_them(
    tmp_path: Path, disk: FullDisk, autojump_clock: trio.testing.MockClock
) -> None:
    disk.full = True  # the first seq block cannot be reserved: no seq may be issued
    async with running(tmp_path) as h:
        assert h.server.degraded.reason == "seq reservation: No space left on device"
        refused = await answer_to_login(h, "early")
        assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE
        disk.full = False
        await until(lambda: h.server.degraded.reason is None)
        assert isinstance(await answer_to_login(h, "later"), Welcome)
        await until(lambda: len(h.records()) == 1)
        assert h.server.seqs.reserved >= h.next_seq


async def test_a_gateway_is_not_held_up_by_a_full_log_while_degraded(
    tmp_path: Path, disk: FullDisk, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # A gateway task that waited for the log's room would stop reading its touches: keepalives left unread,
    # a false offline in waiting. While degraded its attaches and detaches do not wait.
    monkeypatch.setattr(bus_module, "LOG_BACKLOG_LIMIT", 3)
    async with running(tmp_path, tick=0.1) as h:
        gw = await h.gateway("plain")
        await gw.send(Attach(("a", "b"), 1.0))
        users = [await h.user(f"u{i}") for i in range(8)]
        await until(lambda: len(h.records()) == 10)
        disk.full = True
        for user in users:  # their offlines fill what may wait for the writer
            await user.send(BYE)
            assert await user.recv() is None
        await until(lambda: h.server.degraded.reason is not None and h.server.bus.full())
        await gw.send(Detach(("a",)))
        await gw.send(Attach(("b",), 1.0))
        for _ in range(5):  # b keeps talking, and is heard: pongs come back at once
            await gw.send(Touch(("b",)))
            await gw.send(PING)
            with trio.fail_after(0.5):
                assert await gw.recv() is PONG
            await trio.sleep(0.5)
        assert h.server.running.presence is not None and h.server.running.presence.is_online("b")


# -- Logins that add no event: taken while degraded ---------------------------------------------------------
# A false offline is the worst failure. A user who reconnects (a phone changing networks: a new connection,
# the same uid), a second device of a user online, a user back within its offline grace: none of these logins
# adds an event (newest wins; events are per user; the grace is continued), so a degraded server takes them --
# at once, without waiting for the log's room -- and refuses only a login that would bring a user online.


ONLINE_THEN_SHUTDOWN = [("online", "login"), ("offline", "shutdown")]


def their_records(records: list[dict[str, object]], *uids: str) -> list[tuple[object, object]]:
    """Each user's records as (kind, reason), the same for every one of them (asserted): the first user's."""
    per_user = [[(r["kind"], r["reason"]) for r in records if r["uid"] == uid] for uid in uids]
    assert all(rows == per_user[0] for rows in per_user), dict(zip(uids, per_user))
    return per_user[0]


async def device_login(h: Harness, uid: str, device: str) -> Client:
    peer = await h.connect()
    await peer.send(Login("uid", uid, None, None, device=device))
    await peer.expect(Welcome)
    return peer


async def test_a_login_that_adds_no_event_is_taken_while_degraded(
    tmp_path: Path, disk: FullDisk, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setattr(bus_module, "LOG_BACKLOG_LIMIT", 3)  # room() waits once a few events are held
    async with running(tmp_path, offline_grace=60.0) as h:
        presence = h.server.running.presence
        assert presence is not None
        mover = await h.user("mover")
        await h.user("multi")
        returning = await h.user("returning")
        await returning.stream.aclose()  # closed without bye: online for the grace, no event yet
        await until(lambda: presence.in_grace("returning"))
        others = [await h.user(f"u{i}") for i in range(6)]
        await until(lambda: len(h.records()) == 9)
        disk.full = True
        for user in others:  # their offlines fill what may wait for the writer: room() would wait now
            await user.send(BYE)
            assert await user.recv() is None
        await until(lambda: h.server.degraded.reason is not None and h.server.bus.full())
        seq, held = h.next_seq, h.server.status()["events_held"]

        with trio.fail_after(0.5):  # taken at once: not held up by the log's room (virtual time: the writer
            again = await h.user("mover")  # retries every second)
            phone = await device_login(h, "multi", "phone")
            back = await h.user("returning")
        assert await mover.expect_error(ErrorCode.KICKED)  # newest wins, as ever
        refused = await answer_to_login(h, "newcomer")  # it would come online: an event the log cannot take
        assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE
        assert h.next_seq == seq and h.server.status()["events_held"] == held  # nothing added
        assert not presence.in_grace("returning") and presence.keys_of("multi") == ("multi", ("multi", "phone"))
        for peer in (again, phone, back):  # kept, like every session online
            await peer.send(PING)
            assert await peer.recv() is PONG

        disk.full = False
        await until(lambda: h.server.degraded.reason is None and h.server.status()["events_held"] == 0)
        assert presence.is_online("mover") and presence.owner_of("mover") is not None
    assert their_records(assert_gap_free(h), "mover", "multi", "returning") == ONLINE_THEN_SHUTDOWN


async def test_a_gateway_attach_that_adds_no_event_is_taken_while_degraded(
    tmp_path: Path, disk: FullDisk, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, offline_grace=60.0) as h:
        presence = h.server.running.presence
        assert presence is not None
        direct = await h.user("direct")  # moves from its direct connection to the edge
        await h.user("multi")  # gets a second device through the edge
        returning = await h.user("returning")
        await returning.stream.aclose()  # closed without bye: in grace
        edge = await h.connect()
        await edge.send(Login("gateway", "edge-like", ended=True))
        await edge.expect(Welcome)
        plain = await h.gateway("plain")  # takes no notices: a refusal would be its error frame
        await until(lambda: len(h.records()) == 3 and presence.in_grace("returning"))
        disk.full = True
        await h.user("bob")  # accepted: its online is what finds the disk full
        await until(lambda: h.server.degraded.reason is not None)
        seq = h.next_seq

        await edge.send(Attach(("direct", ("multi", "phone"), "returning", "newcomer")))
        assert await edge.expect(Ended) == Ended(("newcomer",), "unavailable")  # only the new user is refused
        assert await direct.expect_error(ErrorCode.KICKED)
        await plain.send(Attach((("multi", "tablet"),)))
        await plain.send(PING)
        assert await plain.recv() is PONG  # taken: no error frame
        assert h.next_seq == seq
        gateway = presence.owner_of("direct")
        assert gateway is presence.owner_of("returning") is presence.owner_of(("multi", "phone")) is not None
        assert presence.owner_of(("multi", "tablet")) is not None and not presence.in_grace("returning")

        disk.full = False
        await until(lambda: h.server.degraded.reason is None and h.server.status()["events_held"] == 0)
    assert their_records(assert_gap_free(h), "direct", "multi", "returning") == ONLINE_THEN_SHUTDOWN
