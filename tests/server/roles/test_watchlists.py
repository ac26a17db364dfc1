"""Watchlist observers: `subscribe uids=[...]`, `watch`, `unwatch` -- only their uids' events, in seq order,
live and resumed, with no gap and no duplicate at any seam.

In-process server, memory-stream connections, real clock (replay reads the log in a worker thread). Events
come in bursts from a gateway's attach/detach frames: one frame publishes hundreds of events synchronously,
before any observer's sender runs, which is what fills (and overflows) a watchlist's own queue. A full-stream
observer subscribed throughout is the reference: a watchlist observer must receive exactly the reference's
events of its uids (same frames, same order).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import idled.server.engine.bus
from idled.protocol import PING, PONG, Attach, Detach, Event, Login, Pong, Subscribe, Unwatch, Watch, Welcome

from tests import peers
from tests.peers import Client

running = functools.partial(peers.running, timeout=30.0, metrics=False, recv_timeout=20.0, settle=False)

UIDS = [f"u{i}" for i in range(200)] + list(range(200))  # str and int uids: 42 and "u42" both kinds


async def watcher(h: peers.Harness, uids: Iterable[Any] | None, from_seq: int | None = None, *,
                  durable: bool = False, lockstep: bool = False, name: str = "watcher",
                  before: Iterable[Watch] = ()) -> Client:
    peer = await h.connect(lockstep)
    await peer.send(Login("observer", name))
    await peer.expect(Welcome)
    for message in before:
        await peer.send(message)
    await peer.send(Subscribe(from_seq, durable, None if uids is None else tuple(uids)))
    return peer


async def burst(h: peers.Harness, gateway: Client, uids: list[Any]) -> None:
    """Each uid online, then offline: 2 * len(uids) events, published two frames' worth at a time."""
    await gateway.send(Attach(tuple(uids)))
    await gateway.send(Detach(tuple(uids)))
    await gateway.send(PING)
    assert await gateway.recv() is PONG  # both frames were applied


async def pong(peer: Client) -> list[Event]:
    """Ping, and every event before the pong."""
    await peer.send(PING)
    events = []
    while True:
        message = await peer.recv()
        if isinstance(message, Pong):
            return events
        assert isinstance(message, Event), message
        events.append(message)


def of(events: list[Event], uids: Iterable[Any]) -> list[Event]:
    wanted = set(uids)
    return [e for e in events if e.uid in wanted]


async def test_only_its_uids_in_seq_order_and_a_full_observer_unchanged(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        reference = await h.observer("reference")
        mine = [UIDS[i] for i in range(0, len(UIDS), 7)] + ["never-seen"]
        watch = await watcher(h, mine)
        gateway = await h.gateway()
        for start in range(0, len(UIDS), 50):
            await burst(h, gateway, UIDS[start:start + 50])
        everything = await reference.drain()
        assert [e.seq for e in everything] == list(range(1, 2 * len(UIDS) + 1))  # no change for full observers
        got = await watch.drain()
        assert got == of(everything, mine)
        assert [e.seq for e in got] == sorted({e.seq for e in got})
        assert h.server.bus.undelivered() == 0


async def test_an_empty_watchlist_then_watch_and_unwatch_in_order_with_ping(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        reference = await h.observer("reference")
        watch = await watcher(h, [])
        gateway = await h.gateway()
        await burst(h, gateway, ["a", "b", 7])
        assert await pong(watch) == []
        await watch.send(Watch(("a", 7, "a")))  # duplicates are fine
        assert await pong(watch) == []  # the pong says: in effect
        await burst(h, gateway, ["a", "b", 7])
        await watch.send(Unwatch(("a", "zz")))  # a uid not watched is fine
        got = await pong(watch)
        assert len(got) == 4  # a and 7, online and offline
        await burst(h, gateway, ["a", "b", 7])
        await watch.send(Watch(("b",)))
        await burst(h, gateway, ["a", "b", 7])
        got += await watch.drain()
        everything = await reference.drain()
        assert [e.seq for e in everything] == list(range(1, 25))
        _, second, third, fourth = (everything[i:i + 6] for i in range(0, 24, 6))
        assert got == of(second, ["a", 7]) + of(third, [7]) + of(fourth, ["b", 7])


async def test_watch_before_subscribe_builds_the_list_of_a_resume(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        reference = await h.observer("reference")
        gateway = await h.gateway()
        await burst(h, gateway, UIDS[:100])
        mine = UIDS[:100:3]
        # A list too big for one frame: watch frames first, then the subscribe (here with the last uids).
        resumed = await watcher(h, mine[-2:], from_seq=1, before=[Watch(tuple(mine[:10])), Watch(tuple(mine[10:-2]))])
        await burst(h, gateway, UIDS[:100])
        everything = await reference.drain()
        assert await resumed.drain() == of(everything, mine)


@pytest.mark.parametrize("window", [100_000, 64], ids=["memory", "disk"])
async def test_resume_from_a_seq_no_gap_no_duplicate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     window: int) -> None:
    monkeypatch.setattr(idled.server.engine.bus, "RECENT_EVENTS", window)
    async with running(tmp_path) as h:
        reference = await h.observer("reference")
        mine = UIDS[::5]
        gateway = await h.gateway()
        first = await watcher(h, mine, name="first")
        await burst(h, gateway, UIDS[:150])
        seen = await first.drain()
        await first.stream.aclose()
        await burst(h, gateway, UIDS[150:])  # while it is away (and, with a small window, gone to disk)
        resumed = await watcher(h, mine, from_seq=seen[-1].seq + 1)
        await burst(h, gateway, UIDS[:100])  # live after the resume
        everything = await reference.drain()
        got = await resumed.drain()
        assert seen + got == of(everything, mine)
        if window == 64:
            assert h.server.bus.oldest_recent() > seen[-1].seq + 1  # the replay did read the disk


async def test_durable_watchlist(tmp_path: Path) -> None:
    async with running(tmp_path, fsync="always") as h:
        reference = await h.observer("reference")
        mine = UIDS[1::4]
        watch = await watcher(h, mine, durable=True)
        gateway = await h.gateway()
        await burst(h, gateway, UIDS)
        everything = await reference.drain()
        got = await watch.drain()
        assert got == of(everything, mine)
        assert h.server.bus.durable_seq >= got[-1].seq


async def test_a_full_queue_falls_back_to_replay_and_loses_nothing(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idled.server.engine.bus, "WATCH_QUEUE_BYTES", 2000)  # ~15 event frames
    async with running(tmp_path) as h:
        reference = await h.observer("reference")
        mine = UIDS[::2]
        watch = await watcher(h, mine)
        gateway = await h.gateway()
        for _ in range(3):
            await burst(h, gateway, UIDS)  # 400 matches at once: the queue overflows in every burst
        everything = await reference.drain()
        got = await watch.drain()
        assert got == of(everything, mine)
        assert h.server.bus.undelivered() == 0


async def test_a_slow_watcher_with_changes_pending_during_its_replay(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher reads nothing while bursts overflow its queue and it unwatches/watches: each change
    applies to the events published after the server read it, also for the part it replays."""
    monkeypatch.setattr(idled.server.engine.bus, "WATCH_QUEUE_BYTES", 1000)
    async with running(tmp_path) as h:
        reference = await h.observer("reference")
        watch = await watcher(h, ["a", "b"], lockstep=True)  # the server's writes wait for its reads
        gateway = await h.gateway()
        filler = [f"f{i}" for i in range(30)]
        expected: list[Event] = []
        horizons = []
        for change in (Unwatch(("b",)), Watch(("c", "b")), Unwatch(("a",)), None):
            await burst(h, gateway, ["a", "b", "c", *filler] * 1)
            if change is not None:
                horizons.append((h.next_seq, change))
                await watch.send(change)
                await trio.sleep(0.2)  # read and applied by the requests task (the sender is stuck writing)
        everything = await reference.drain()
        watched = {"a", "b"}
        for event in everything:
            while horizons and event.seq >= horizons[0][0]:
                _, change = horizons.pop(0)
                watched = watched | set(change.uids) if isinstance(change, Watch) else watched - set(change.uids)
            if event.uid in watched:
                expected.append(event)
        got = await watch.drain()
        assert got == expected
        assert {e.uid for e in got} == {"a", "b", "c"}


async def test_limits_and_misuse_are_not_allowed(tmp_path: Path) -> None:
    async with running(tmp_path, max_watch=5) as h:
        over = await watcher(h, ["a", "b", "c", "d", "e", "f"])
        error = await over.expect_error("not_allowed")
        assert "max_watch=5" in error.reason
        at_limit = await watcher(h, ["a", "b", "c", "d", "e", "a"])  # 5 distinct: fine
        await at_limit.send(Watch(("e", "d")))  # already watched: still 5
        assert await pong(at_limit) == []
        await at_limit.send(Watch(("x",)))
        assert "max_watch=5" in (await at_limit.expect_error("not_allowed")).reason
        full = await h.observer("full")
        await full.send(Watch(("a",)))
        assert "watchlist" in (await full.expect_error("not_allowed")).reason
        full = await h.observer("full")
        await full.send(Unwatch(("a",)))
        await full.expect_error("not_allowed")
        first = await h.connect()
        await first.send(Login("observer", "first"))
        await first.expect(Welcome)
        await first.send(Watch(("a",)))
        await first.send(Subscribe())  # no uids after a watch: refused rather than silently filtered
        await first.expect_error("not_allowed")
        twice = await watcher(h, ["a"])
        await twice.send(Subscribe(None, False, ("b",)))
        await twice.expect_error("not_allowed")
        assert h.server.bus._index == {} and not h.server.bus._watchers  # every connection above has ended
        assert h.server.bus.uids_from is None


async def test_a_watcher_costs_nothing_for_events_it_does_not_watch(tmp_path: Path) -> None:
    """Its queue holds its matches only, and the bus never wakes it for anything else."""
    async with running(tmp_path) as h:
        watch = await watcher(h, ["nobody"])
        gateway = await h.gateway()
        await trio.testing.wait_all_tasks_blocked()
        subscription = next(iter(h.server.bus._watchers))
        await burst(h, gateway, UIDS)
        assert not subscription.queue and subscription.stop_at is None
        assert subscription not in h.server.bus._live
        assert await watch.drain() == []


@pytest.mark.parametrize("seed", range(4))
async def test_random_changes_bursts_overflows_and_resumes_match_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Random bursts, watch/unwatch and resumes (from disk with a small window) against a model: the event of
    seq s is delivered iff its uid was on the list when s was published -- or, after a resume from seq N,
    on the list the resuming connection sent, for N <= s < its next change -- once, in order."""
    rng = random.Random(seed)
    monkeypatch.setattr(idled.server.engine.bus, "WATCH_QUEUE_BYTES", rng.choice([300, 1500, 1 << 20]))
    monkeypatch.setattr(idled.server.engine.bus, "RECENT_EVENTS", rng.choice([40, 200, 100_000]))
    population = [f"p{i}" for i in range(30)] + list(range(10))
    async with running(tmp_path) as h:
        reference = await h.observer("reference")
        gateway = await h.gateway()
        watched = set(rng.sample(population, 8))
        history: list[tuple[int, set[Any]]] = [(1, set(watched))]  # (from seq, list) in force
        watch = await watcher(h, sorted(watched, key=str), lockstep=rng.random() < 0.5)
        got: list[Event] = await pong(watch)  # subscribed
        for _ in range(12):
            action = rng.random()
            if action < 0.5:
                await burst(h, gateway, rng.sample(population, rng.randint(1, 20)))
            elif action < 0.85:
                uids = rng.sample(population, rng.randint(1, 5))
                change = Watch(tuple(uids)) if rng.random() < 0.5 else Unwatch(tuple(uids))
                await watch.send(change)
                got += await pong(watch)  # applied: from the next seq on
                watched = watched | set(uids) if isinstance(change, Watch) else watched - set(uids)
                history.append((h.next_seq, set(watched)))
            else:  # the watcher goes away and resumes after the last event it read, with its list
                got += await watch.drain()
                await watch.stream.aclose()
                await burst(h, gateway, rng.sample(population, 10))
                start = got[-1].seq + 1 if got else 1
                ordered = sorted(watched, key=str)
                watch = await watcher(h, ordered[:2], from_seq=start, lockstep=rng.random() < 0.5,
                                      before=[Watch(tuple(ordered[2:]))])
                # The replay from `start` filters with the list the new connection sent: a uid watched since
                # `start` has its events from `start` on (they come after the last one received, in order).
                history = [entry for entry in history if entry[0] <= start] + [(start, set(watched))]
                got += await pong(watch)
        got += await watch.drain()
        everything = await reference.drain()
        expected = []
        for event in everything:
            in_force = [uids for since, uids in history if since <= event.seq][-1]
            if event.uid in in_force:
                expected.append(event)
        assert got == expected
        assert h.server.bus.undelivered() == 0
