"""Gateways with session keys ([uid, device]) and the offline grace, in-process on the autojump clock."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import trio
import trio.testing

from idled.protocol import PING, PONG, Attach, Detach, Ended, Event, Login, Touch, Welcome

from tests import peers

TICK = 0.1
running = functools.partial(peers.running, tick=TICK, timeout=1.0, max_timeout=60.0, login_timeout=2.0)


def shape(event: Event) -> tuple[Any, ...]:
    extra = event.extra or {}
    return event.kind, event.uid, event.reason, extra.get("device"), extra.get("grace")


async def gateway(h: peers.Harness, name: str) -> peers.Client:
    peer = await h.connect()
    await peer.send(Login("gateway", name, ended=True))
    await peer.expect(Welcome)
    return peer


async def sync(gw: peers.Client) -> None:
    await gw.send(PING)
    assert await gw.recv() is PONG


async def test_gateway_keys_user_level_events_and_ended_notices_by_key(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, max_devices=2, timeout=30.0) as h:
        obs = await h.observer()
        gw = await gateway(h, "gw")
        await gw.send(Attach((("alice", "phone"), ("alice", "laptop"), "bob", ("bob", "web"))))
        await gw.send(Touch((("alice", "phone"), "bob")))
        await sync(gw)
        events, status = await obs.events_until_status(["alice", "bob"])
        assert [shape(e) for e in events] == [("online", "alice", "login", "phone", None),
                                              ("online", "bob", "login", None, None)]
        assert status.online == {"alice": True, "bob": True}
        # a third device of alice: past the cap, the oldest (phone) ends and its owner is told by key
        await gw.send(Attach((("alice", "tablet"),)))
        ended = await gw.expect(Ended)
        assert ended == Ended((("alice", "phone"),), "kicked")
        # a direct login of a key the gateway holds takes it over: the gateway is told, no event
        direct = await h.connect()
        await direct.send(Login("uid", "bob", None, 30.0, device="web"))
        await direct.expect(Welcome)
        assert await gw.expect(Ended) == Ended((("bob", "web"),), "kicked")
        await gw.send(Detach((("alice", "laptop"), "bob")))  # alice keeps her tablet, bob his web (direct)
        await sync(gw)
        events, status = await obs.events_until_status(["alice", "bob"])
        assert events == [] and status.online == {"alice": True, "bob": True}
        await gw.send(Detach((("alice", "tablet"),), "logout"))
        await sync(gw)
        events, _ = await obs.events_until_status()
        assert [shape(e) for e in events] == [("offline", "alice", "logout", "tablet", None)]


async def test_gateway_detach_closed_waits_out_the_grace(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, offline_grace=2.0, timeout=30.0) as h:
        obs = await h.observer()
        gw = await gateway(h, "edge")
        await gw.send(Attach((("u", "phone"), "v")))
        await sync(gw)
        await obs.drain()
        detached_at = trio.current_time()
        await gw.send(Detach((("u", "phone"), "v"), "closed"))
        await sync(gw)
        await trio.sleep(1.0)
        await gw.send(Attach(("v",)))  # back within the grace: no event at all
        await sync(gw)
        events, status = await obs.events_until_status(["u", "v"])
        assert events == [] and status.online == {"u": True, "v": True}
        offline = await obs.expect(Event)  # u's grace ends: the tick task wakes for it
        assert shape(offline) == ("offline", "u", "closed", "phone", 2.0)
        assert trio.current_time() - detached_at <= 2.0 + 2 * TICK
        events, status = await obs.events_until_status(["u", "v"])
        assert events == [] and status.online == {"u": False, "v": True}
