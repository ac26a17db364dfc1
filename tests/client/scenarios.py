"""Client scenarios written once against the public API, run under trio (test_trio.py) and asyncio
(test_asyncio.py). Each takes the adapter module (`idled.client.trio` or `idled.client.asyncio`), its sleep,
and a running `Idled` daemon. Restarts block the event loop for a second: the clients then find their
connection closed, as after any real restart.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import pytest

from idled.client import AuthFailed, Busy, ConnectionLost, Gone, Kicked, Observer
from idled.client.core import Backoff
from idled.protocol import Event
from idled.protocol.tokens import mint
from idled.server.roles.observers import OBSERVER_STALL

from tests.client.support import HOST, Idled

Sleep = Callable[[float], Awaitable[Any]]
FAST = Backoff(base=0.05, cap=0.5)  # reconnect quickly: the tests restart daemons


async def until(sleep: Sleep, condition: Callable[[], bool], timeout: float = 20.0) -> None:
    limit = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < limit, "condition not reached in time"
        await sleep(0.02)


async def collect(observer: Observer, stop: Callable[[Event], bool], sink: list[Event] | None = None) -> list[Event]:
    """Events from `observer` (appended to `sink`) up to and including the first one `stop` accepts."""
    events = [] if sink is None else sink
    async for event in observer:
        events.append(event)
        if stop(event):
            break
    return events


def contiguous(events: list[Event], first: int = 1) -> bool:
    return [e.seq for e in events] == list(range(first, first + len(events)))


async def session_keepalive_and_bye(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    async with lib.open_observer(HOST, idled.port, "watch", after=0) as observer:
        async with lib.open_session(HOST, idled.port, "alice", keepalive=1) as session:
            assert session.timeout == pytest.approx(1.5)
            await session.send({"hello": [1, 2]})
            await sleep(4.0)  # more than two timeouts: only the automatic keepalives keep alice online
            # Most are quiet; one asks for an answer once nothing was heard for two timeouts (3 s).
            assert session.quiet_keepalives >= 2 and session.pings >= 1, (session.quiet_keepalives, session.pings)
            await until(sleep, lambda: session.pongs >= 1)
            assert (await observer.query(["alice"])) == {"alice": True}
        events = await collect(observer, lambda e: e.kind == "offline")
    assert [(e.uid, e.kind, e.reason) for e in events] == [("alice", "online", "login"), ("alice", "offline", "logout")]


async def sessions_come_back_after_a_restart(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    async with lib.open_observer(HOST, idled.port, "watch", after=0, backoff=FAST) as observer, \
            lib.open_session(HOST, idled.port, "alice", keepalive=1, backoff=FAST) as session, \
            lib.open_gateway(HOST, idled.port, "edge", backoff=FAST) as gateway:
        await gateway.attach([1, 2, 3], keepalive=5)
        await gateway.flush()
        await until(sleep, lambda: observer.position is not None and observer.position >= 4)
        idled.restart()
        await until(sleep, lambda: session.connections == 2 and gateway.connections == 2 and observer.connections == 2)
        online = {}
        for _ in range(100):  # the reattach and the relogin land shortly after the reconnects
            online = await observer.query(["alice", 1, 2, 3])
            if all(online.values()):
                break
            await sleep(0.05)
        assert online == {"alice": True, 1: True, 2: True, 3: True}
        assert session.last_error is not None and session.last_error.code in ("server_shutdown", "connection_lost")
        # Across the restart the observer saw every seq once: online x4, shutdown x4, online x4 again.
        events = await collect(observer, lambda e: len(seen) >= 12, seen := [])
    assert contiguous(events), [e.seq for e in events]
    assert sorted(e.reason for e in events) == ["login"] * 8 + ["shutdown"] * 4


async def gateway_batches_touches(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    async with lib.open_gateway(HOST, idled.port, "edge", flush_interval=0.5) as gateway, \
            lib.open_observer(HOST, idled.port, "watch", subscribe=False) as observer:
        await gateway.attach(range(1000), keepalive=30)
        await gateway.flush()
        before = gateway.frames_sent
        for i in range(10_000):
            await gateway.touch([i % 1000])
        # the background flush: it takes what is pending before its write, and counts the frames after it
        await until(sleep, lambda: gateway.batch.pending == 0 and gateway.frames_sent > before)
        touch_frames = gateway.frames_sent - before
        assert 1 <= touch_frames <= 3, touch_frames
        await gateway.detach(range(500))
        await gateway.flush()
        online: dict[Any, bool] = {}
        for _ in range(100):
            online = await observer.query(range(1000))
            if sum(online.values()) == 500:
                break
            await sleep(0.05)
        assert [uid for uid, flag in online.items() if flag] == list(range(500, 1000))


async def gateway_hears_which_sessions_ended(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    """`ended` notices through the client: idle, kicked by a direct login, shutdown; callback and iterator."""
    heard: list[tuple[tuple[Any, ...], str]] = []
    async with lib.open_gateway(HOST, idled.port, "edge", on_ended=lambda uids, reason: heard.append((uids, reason)),
                                notices=True, backoff=FAST) as gateway, \
            lib.open_observer(HOST, idled.port, "watch", subscribe=False, backoff=FAST) as observer:
        with pytest.raises(ValueError):
            await gateway.attach(["quiet"], keepalive=0.5)  # below the protocol's minimum: refused locally
        await gateway.attach(["quiet"], keepalive=1)  # timeout 1.5 s, and never touched
        await gateway.attach(["taken", "stays"], keepalive=30)
        await gateway.flush()
        async with lib.open_session(HOST, idled.port, "taken", keepalive=30):  # newest login wins
            await until(sleep, lambda: len(heard) >= 2)
        assert sorted(heard) == [(("quiet",), "idle"), (("taken",), "kicked")]
        assert set(gateway.batch.live) == {"stays"}  # idle and kicked uids are not re-attached after a reconnect
        idled.restart()
        await until(sleep, lambda: gateway.connections == 2 and observer.connections == 2)
        assert heard[2:] == [(("stays",), "shutdown")]
        online: dict[Any, bool] = {}
        for _ in range(100):  # a shutdown uid stays live: re-attached on the new connection
            online = await observer.query(["quiet", "taken", "stays"])
            if online["stays"]:
                break
            await sleep(0.05)
        assert online == {"quiet": False, "taken": False, "stays": True}
        notices = []
        async for notice in gateway.ended():
            notices.append(notice)
            if len(notices) == 3:
                break
        assert notices == heard
    assert [notice async for notice in gateway.ended()] == []  # closed: the iterator ends


async def gateway_answers_marks(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    """A gateway with `marks=True`: the server's mark requests are answered (after the batch), so the uids it
    keeps touching stay online and the silent one expires."""
    heard: list[tuple[tuple[Any, ...], str]] = []
    async with lib.open_gateway(HOST, idled.port, "edge", marks=True, backoff=FAST,
                                on_ended=lambda uids, reason: heard.append((uids, reason))) as gateway, \
            lib.open_observer(HOST, idled.port, "watch", subscribe=False, backoff=FAST) as observer:
        await gateway.attach(["talk", "quiet"], keepalive=1)  # timeout 1.5 s
        for _ in range(8):
            await sleep(0.5)
            await gateway.touch(["talk"])
        await until(sleep, lambda: heard == [(("quiet",), "idle")])
        assert await observer.query(["talk", "quiet"]) == {"talk": True, "quiet": False}
        assert gateway.connections == 1 and gateway.last_error is None  # every answer was accepted


async def observer_resumes_across_restarts(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    """A server restart in the middle of the stream, then the observer's own restart from a checkpoint."""
    processed: list[Event] = []
    async with lib.open_gateway(HOST, idled.port, "edge", backoff=FAST) as gateway:
        async with lib.open_observer(HOST, idled.port, "watch", after=0, backoff=FAST, buffer=8) as observer:
            await gateway.attach(range(200), keepalive=30)
            await gateway.flush()
            await collect(observer, lambda e: len(processed) >= 50, processed)
            idled.restart()  # 150 events unread, maybe partly in socket buffers: resumed from the last seq
            await until(sleep, lambda: gateway.connections == 2)
            await collect(observer, lambda e: len(processed) >= 600, processed)  # 200 online, shutdown, online
            checkpoint = processed[-1].seq
            await gateway.detach(range(100))
            await gateway.flush()
        # The observer is gone (crash/redeploy) while 100 detaches happen; it restarts from its checkpoint.
        async with lib.open_observer(HOST, idled.port, "watch", after=checkpoint) as observer:
            await collect(observer, lambda e: len(processed) >= 700, processed)
            assert observer.duplicates == 0
    assert contiguous(processed), [e.seq for e in processed][:20]
    assert sum(e.reason == "detach" for e in processed) == 100


async def watchlist_observer_watches_and_resumes(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    """Only its uids; watch/unwatch in effect when they return; after a server restart it resumes with its
    whole list (longer than a frame: sent as watch frames before the subscribe) and misses nothing."""
    many = [f"w{i:04d}" for i in range(1500)]  # ~10 KB of uids: three frames
    got: list[Event] = []

    def seen() -> list[tuple[Any, str]]:
        return [(e.uid, e.kind) for e in got]

    async with lib.open_gateway(HOST, idled.port, "edge", backoff=FAST) as gateway, \
            lib.open_observer(HOST, idled.port, "contacts", uids=many, backoff=FAST) as observer:
        await observer.watch([])  # a round trip: the subscribe is in place
        await gateway.attach(["w0000", "x", "w1499"], keepalive=60)
        await gateway.flush()
        await collect(observer, lambda e: len(got) == 2, got)
        await observer.watch(["x2"])
        await gateway.attach(["x2", "x3"], keepalive=60)
        await gateway.flush()
        await collect(observer, lambda e: len(got) == 3, got)
        await observer.unwatch(["w0000"])
        await gateway.detach(["w0000", "w1499", "x2", "x3"])
        await gateway.flush()
        await collect(observer, lambda e: len(got) == 5, got)
        assert seen() == [("w0000", "online"), ("w1499", "online"), ("x2", "online"), ("w1499", "offline"),
                          ("x2", "offline")]
        assert observer.watchlist == [*many[1:], "x2"]
        idled.restart()  # "x" goes offline (shutdown) and comes back: not watched
        await until(sleep, lambda: gateway.connections == 2)
        await gateway.attach(["w0001", "w0000", "w1499", "x2"], keepalive=60)  # w0001 is in the first frame
        await gateway.flush()
        await collect(observer, lambda e: len(got) == 8, got)
        assert observer.connections == 2 and observer.duplicates == 0
    assert seen()[5:] == [("w0001", "online"), ("w1499", "online"), ("x2", "online")]
    assert [e.seq for e in got] == sorted({e.seq for e in got})


async def slow_observer_is_cut_with_busy_and_resumes(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    n = 50_000
    async with lib.open_gateway(HOST, idled.port, "edge") as gateway, \
            lib.open_observer(HOST, idled.port, "slow", after=0, buffer=16, backoff=FAST) as observer:
        # The observer reads nothing for longer than the server's stall limit while 2n events wait for it.
        await gateway.attach(range(n), keepalive=60)
        await gateway.detach(range(n))
        await gateway.flush()
        await sleep(OBSERVER_STALL + 2.0)
        events = await collect(observer, lambda e: e.seq >= 2 * n)
        # The server cuts it with `busy`, delivered whole if the client reads within ~1 s of the cut, else the
        # client just finds the connection closed; either way it resumes by seq.
        assert isinstance(observer.last_error, (Busy, ConnectionLost)), observer.last_error
        assert observer.connections >= 2
    assert contiguous(events)


async def auth_failed_is_final(lib: ModuleType, sleep: Sleep, idled: Idled, secret: bytes) -> None:
    bad = mint(b"another secret of 32 bytes......", "uid", "alice", time.time() + 60)
    try:
        async with lib.open_session(HOST, idled.port, "alice", token=bad, backoff=FAST):
            raise AssertionError("logged in with a forged token")
    except AuthFailed as exc:
        assert exc.code == "auth_failed" and not exc.retryable
    good = mint(secret, "uid", "alice", time.time() + 60)
    async with lib.open_session(HOST, idled.port, "alice", token=good) as session:
        assert session.connections == 1


async def second_login_kicks_the_first(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    async with lib.open_session(HOST, idled.port, "alice", keepalive=5, backoff=FAST) as first:
        async with lib.open_session(HOST, idled.port, "alice", keepalive=5):
            try:
                await first.wait_done()
                raise AssertionError("the first session was not kicked")
            except Kicked as exc:
                assert exc.code == "kicked" and not exc.retryable
            assert first.connections == 1  # kicked is final: no reconnect that would kick the newer login
            try:
                await first.send("late")
                raise AssertionError("send on a kicked session")
            except Kicked:
                pass


async def gone_says_the_oldest_seq(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    """Events pruned from the log (tiny segments and retention) and the memory window emptied by a restart."""
    async with lib.open_gateway(HOST, idled.port, "edge") as gateway:
        for _ in range(5):
            await gateway.attach(range(200), keepalive=60)
            await gateway.detach(range(200))
        await gateway.flush()
        await sleep(0.5)
    idled.restart()
    async with lib.open_observer(HOST, idled.port, "late", after=0, backoff=FAST) as observer:
        try:
            await collect(observer, lambda e: True)
            raise AssertionError("no gone")
        except Gone as exc:
            assert exc.code == "gone" and not exc.retryable
            assert exc.oldest_seq is not None and exc.oldest_seq > 1
            oldest = exc.oldest_seq
    async with lib.open_observer(HOST, idled.port, "late", after=oldest - 1) as observer:
        [event] = await collect(observer, lambda e: True)
        assert event.seq == oldest


async def devices_are_sessions_of_one_user(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    """`device=`: sessions of one uid coexist; the user's events come with its first and its last session
    (each naming the device that caused it); the same device again replaces the older session (kicked)."""
    async with lib.open_observer(HOST, idled.port, "watch", after=0) as observer:
        async with lib.open_session(HOST, idled.port, "alice", keepalive=1, device="phone") as phone:
            assert (phone.device, phone.key) == ("phone", ("alice", "phone"))
            async with lib.open_session(HOST, idled.port, "alice", keepalive=1, device="laptop") as laptop:
                async with lib.open_session(HOST, idled.port, "alice", keepalive=1, device="laptop"):
                    try:
                        await laptop.wait_done()
                        raise AssertionError("the first laptop session was not kicked")
                    except Kicked:
                        pass
                await sleep(2.0)  # past the 1.5 s timeout: the automatic pings keep the phone's session alive
                assert (await observer.query(["alice"])) == {"alice": True}
        events = await collect(observer, lambda e: e.kind == "offline")
    assert [(e.uid, e.kind, e.reason, (e.extra or {}).get("device")) for e in events] == [
        ("alice", "online", "login", "phone"), ("alice", "offline", "logout", "phone")]


async def gateway_reports_session_keys(lib: ModuleType, sleep: Sleep, idled: Idled) -> None:
    """A gateway attaches (uid, device) keys: one user online while any of its keys lives; `ended` notices
    name the keys as attached."""
    heard: list[tuple[tuple[Any, ...], str]] = []
    async with lib.open_gateway(HOST, idled.port, "edge", on_ended=lambda keys, reason: heard.append((keys, reason)),
                                backoff=FAST) as gateway, \
            lib.open_observer(HOST, idled.port, "watch", after=0) as observer:
        with pytest.raises(ValueError):
            await gateway.attach([["bob", "a"]])  # a list is not a key (nor hashable)
        with pytest.raises(ValueError):
            await gateway.attach([("bob", "")])
        await gateway.attach([("bob", "a"), ("bob", "b")], keepalive=30)
        await gateway.attach([("carol", "x")], keepalive=1)  # never touched: its key ends idle
        await gateway.flush()
        await until(sleep, lambda: heard == [((("carol", "x"),), "idle")])
        await gateway.touch([("bob", "a")])
        await gateway.detach([("bob", "a")])
        await gateway.flush()
        assert (await observer.query(["bob", "carol"])) == {"bob": True, "carol": False}
        await gateway.detach([("bob", "b")])
        events = await collect(observer, lambda e: e.uid == "bob" and e.kind == "offline")
        assert set(gateway.batch.live) == set()
    assert [(e.uid, e.kind, e.reason, (e.extra or {}).get("device")) for e in events] == [
        ("bob", "online", "login", "a"), ("carol", "online", "login", "x"), ("carol", "offline", "idle", "x"),
        ("bob", "offline", "detach", "b")]
