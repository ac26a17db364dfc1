"""`query` with ``last_seen`` against a real server over real loopback sockets (real time, a few seconds)."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from idled.protocol import BYE, PING, PONG, Login, Query, Status, Welcome, encode

from tests import peers
from tests.peers import Client, running


async def ask(observer: Client, *uids: object, last_seen: bool = True) -> Status:
    await observer.send(Query(tuple(uids), last_seen=last_seen))  # type: ignore[arg-type]
    status = await observer.recv()
    assert isinstance(status, Status), status
    return status


async def test_online_offline_and_unknown_users(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True) as h:
        alice = await Client.login(h.port, "uid", "alice", keepalive=30)
        bob = await Client.login(h.port, "uid", 42, keepalive=30)
        await trio.sleep(0.2)
        before_bye = time.time()
        await bob.send(BYE)
        assert await bob.recv() is None
        observer = await Client.login(h.port, "observer", "obs")
        status = await ask(observer, "alice", 42, "42", "nobody")  # right after the bye: no wait on our side
        assert status.online == {"alice": True, 42: False, "42": False, "nobody": False}
        assert status.last_seen is not None and status.devices == {}
        assert status.last_seen["42"] is None and status.last_seen["nobody"] is None
        bob_seen = status.last_seen[42]
        assert bob_seen is not None and before_bye - 0.5 <= bob_seen <= time.time()
        [offline] = [r for r in h.records() if r["uid"] == 42 and r["kind"] == "offline"]
        assert bob_seen == offline["last_seen"]  # exactly the offline's, from the log's map
        alice_seen = status.last_seen["alice"]
        assert alice_seen is not None and time.time() - 1.0 <= alice_seen <= time.time()
        # Activity moves an online user's answer.
        await trio.sleep(0.3)
        await alice.send(PING)
        assert await alice.recv() is PONG
        later = await ask(observer, "alice")
        assert later.last_seen is not None and later.last_seen["alice"] >= alice_seen + 0.25  # type: ignore[operator]
        # Back online: the store forgets the offline, the presence table answers.
        bob = await Client.login(h.port, "uid", 42, keepalive=30)
        again = await ask(observer, 42)
        assert again.online == {42: True} and again.last_seen is not None
        assert again.last_seen[42] is not None and again.last_seen[42] > bob_seen  # type: ignore[operator]


async def test_without_the_flag_the_reply_is_todays_frame(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True) as h:
        alice = await Client.login(h.port, "uid", "alice")
        observer = await Client.connect(h.port)
        await observer.send_raw(peers.frame({"op": "login", "observer": "raw"}))
        await observer.recv()
        await observer.send_raw(peers.frame({"op": "query", "uids": ["alice", 7]}))
        raw = await observer.stream.receive_some(4096)
        assert bytes(raw) == encode(Status({"alice": True, 7: False}))
        await alice.send(BYE)


async def test_idle_offline_answers_its_last_activity_not_its_expiry(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, timeout=1.0) as h:
        quiet = await Client.login(h.port, "uid", "quiet", keepalive=1)  # timeout 1.5 s
        await quiet.send(PING)
        assert await quiet.recv() is PONG
        pinged = time.time()
        observer = await Client.login(h.port, "observer", "obs")
        with trio.fail_after(5):
            while (await ask(observer, "quiet")).online["quiet"]:
                await trio.sleep(0.1)
        status = await ask(observer, "quiet")
        seen = status.last_seen["quiet"]  # type: ignore[index]
        assert seen is not None and pinged - 0.3 <= seen <= pinged + 0.05
        assert time.time() - seen >= 1.4  # the expiry came later: the answer is the activity


async def test_horizon_zero_disables_the_store(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, last_seen_horizon=0.0) as h:
        bob = await Client.login(h.port, "uid", "bob")
        await bob.send(BYE)
        assert await bob.recv() is None
        alice = await Client.login(h.port, "uid", "alice")
        observer = await Client.login(h.port, "observer", "obs")
        status = await ask(observer, "bob", "alice")
        assert status.last_seen is not None and status.last_seen["bob"] is None
        assert status.last_seen["alice"] is not None  # online users are the presence table's, horizon or not
        await alice.send(BYE)


async def test_devices_listed_and_a_user_in_grace_is_online_last_seen_at_its_close(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, offline_grace=30.0) as h:
        phone = await Client.connect(h.port)
        await phone.send(Login("uid", "ann", keepalive=30, device="phone"))
        assert isinstance(await phone.recv(), Welcome)
        plain = await Client.login(h.port, "uid", "ann", keepalive=30)  # the plain key: a session, not a device
        observer = await Client.login(h.port, "observer", "obs")
        status = await ask(observer, "ann", "bob")
        assert status.online == {"ann": True, "bob": False}
        assert status.devices == {"ann": ("phone",)}  # the plain key is not listed; offline users are not either
        await plain.send(BYE)
        assert await plain.recv() is None
        closed = time.time()
        await phone.stream.aclose()  # closed without bye: the grace holds ann online
        with trio.fail_after(5):
            while (status := await ask(observer, "ann")).devices:
                await trio.sleep(0.05)
        assert status.online == {"ann": True} and status.last_seen is not None
        seen = status.last_seen["ann"]
        assert seen is not None and closed - 1.0 <= seen <= closed + 0.05
        assert not [r for r in h.records() if r["kind"] == "offline"]  # no offline while the grace runs
