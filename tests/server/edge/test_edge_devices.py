"""Devices through edges (idled.server.edge.users, .link): every user of an edge is a session key.

First against a scripted core (``tests.server.edge.test_edge_link.ScriptedCore``) on a real loopback socket, an
in-process edge in front of it: what the edge puts on the link for users logging in with devices -- the
attach / touch / detach elements ``[uid, device]``, newest-wins per key at the edge, an ``ended`` notice
matched back to the one connection of that key, the re-attach after the link drops. Then end to end through
a real ``idled serve --workers 2`` (two ``idled edge`` children on one public port): the record the core
keeps of a user whose devices come and go through the edges.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.log.eventlog import iter_records
from idled.ops.config import Config
from idled.protocol import (
    BYE, PING, PONG, Attach, Detach, Ended, FrameDecoder, Login, Subscribe, Touch, Welcome, encode,
)
from idled.server.edge import Edge
from tests import peers
from tests.server.edge.test_edge_link import ScriptedCore, serve_forever, wait_for

PHONE, LAPTOP = ("alice", "phone"), ("alice", "laptop")


class Core:
    """A scripted core that serves every connection as the real one does (frames recorded, pings ponged) and
    keeps each connection's stream, so a test can send it ``ended`` notices."""

    def __init__(self, *first: Any) -> None:
        self.streams: list[trio.SocketStream] = []

        async def keep(stream: trio.SocketStream, decoder: FrameDecoder, seen: list[Any]) -> None:
            self.streams.append(stream)
            await serve_forever(stream, decoder, seen)

        self.scripted = ScriptedCore(*first, *[keep] * 4)

    def frames(self, kind: type, connection: int = -1) -> list[Any]:
        return [m for m in self.scripted.seen[connection] if type(m) is kind]

    def keys(self, kind: type, connection: int = -1) -> list[Any]:
        return [key for m in self.frames(kind, connection) for key in m.uids]


@asynccontextmanager
async def edge_before(core: Core, tmp_path: Path) -> AsyncIterator[int]:
    """An in-process edge linked to `core`; yields the edge's user port."""
    async with trio.open_nursery() as nursery:
        await nursery.start(core.scripted.serve)
        config = Config(port=0, host="127.0.0.1", metrics_port=0, data_dir=str(tmp_path)).validate()
        edge = Edge(config, core=f"127.0.0.1:{core.scripted.port}", name="edge-devices")
        ports = await nursery.start(edge.serve)
        yield ports[0]
        nursery.cancel_scope.cancel()


async def device(port: int, uid: Any, name: str | None, keepalive: float = 30.0) -> peers.Client:
    client = await peers.Client.connect(port)
    await client.send(Login("uid", uid, None, keepalive, device=name))
    await client.expect(Welcome)
    return client


async def pinged(client: peers.Client) -> None:
    await client.send(PING)
    assert await client.recv() is PONG


async def test_an_edge_relays_each_device_as_its_session_key_and_newest_wins_per_key(tmp_path: Path) -> None:
    core = Core()
    async with edge_before(core, tmp_path) as port:
        phone = await device(port, "alice", "phone")
        laptop = await device(port, "alice", "laptop")
        plain = await device(port, "alice", None)  # the plain key is one more session of alice
        await wait_for(lambda: core.keys(Attach) == [PHONE, LAPTOP, "alice"])
        await pinged(phone)
        await pinged(laptop)
        await wait_for(lambda: {PHONE, LAPTOP} <= set(core.keys(Touch)))
        # The same device again: newest wins at the edge -- the first phone is kicked, the laptop stays, and the
        # core sees the key attached again (the same owner: no event there).
        phone2 = await device(port, "alice", "phone")
        await phone.expect_error("kicked")
        await pinged(laptop)
        await wait_for(lambda: core.keys(Attach) == [PHONE, LAPTOP, "alice", PHONE])
        assert core.keys(Detach) == []  # the kicked connection's end detaches nothing: its key has a new owner
        await laptop.send(BYE)
        assert await laptop.recv() is None
        await wait_for(lambda: core.frames(Detach) == [Detach((LAPTOP,), "logout")])
        await pinged(phone2)
        await pinged(plain)


async def test_ended_notices_close_the_connection_of_that_key_only(tmp_path: Path) -> None:
    core = Core()
    async with edge_before(core, tmp_path) as port:
        phone = await device(port, "alice", "phone")
        laptop = await device(port, "alice", "laptop")
        bob = await device(port, "bob", "phone")  # another user's device of the same name
        await wait_for(lambda: len(core.keys(Attach)) == 3)
        await core.streams[-1].send_all(encode(Ended((PHONE,), "kicked")))  # a newer login elsewhere
        await phone.expect_error("kicked")
        await pinged(laptop)
        await pinged(bob)
        # The notice forgot the key: when the link drops and comes back, only the live keys are attached again.
        await core.streams[-1].aclose()
        await wait_for(lambda: len(core.scripted.seen) == 2 and len(core.keys(Attach, 1)) == 2)
        assert set(core.keys(Attach, 1)) == {LAPTOP, ("bob", "phone")}
        await pinged(laptop)
        await pinged(bob)


async def test_the_reattach_after_the_link_drops_carries_every_key(tmp_path: Path) -> None:
    core = Core()
    async with edge_before(core, tmp_path) as port:
        clients = [await device(port, 7, f"d{i}") for i in range(3)] + [await device(port, 8, None)]
        await wait_for(lambda: len(core.keys(Attach)) == 4)
        await core.streams[-1].aclose()  # the link drops with all four attached (not during the logins: a race)
        await wait_for(lambda: len(core.scripted.seen) >= 2 and len(core.keys(Attach, 1)) == 4)
        assert core.frames(Attach, 1)[0] == Attach(((7, "d0"), (7, "d1"), (7, "d2"), 8), 30.0)
        for client in clients:
            await pinged(client)


# ------------------------------------------------------------------------------ through idled serve --workers 2

TICK = 0.1


def _records(data_dir: Path, uid: Any) -> list[tuple[str, str, str | None]]:
    return [(r["kind"], r["reason"], r.get("device")) for r in iter_records(data_dir) if r["uid"] == uid]


@pytest.mark.slow
async def test_devices_of_one_user_through_the_edges_of_workers_2(tmp_path: Path) -> None:
    """Two devices of a uid through the edges: one leaving emits nothing, the last one the user's offline; a
    second login of the same device kicks the first with no event; an idle device ends alone, silently."""
    data_dir = tmp_path / "data"
    command = peers.serve_command(data_dir, "--tick", str(TICK), "--fsync", "never", "--metrics-port", "0",
                                  "--workers", "2")
    async with peers.Daemon(command, tmp_path / "serve.err") as daemon:
        port = daemon.port
        observer = await peers.Client.login(port, "observer", "obs")
        await observer.send(Subscribe(None))
        await observer.drain()  # the subscribe took effect before any login
        phone = await device(port, "alice", "phone")
        laptop = await device(port, "alice", "laptop")
        idler = await device(port, "alice", "watch", keepalive=1.0)  # never pings: its session ends idle
        online, = await observer.drain()
        assert (online.uid, online.kind, online.reason, (online.extra or {}).get("device")) == (
            "alice", "online", "login", "phone")
        phone2 = await device(port, "alice", "phone")  # on either edge: newest wins by the key
        await phone.expect_error("kicked")
        await idler.expect_error("idle_timeout")
        await pinged(laptop)
        await phone2.send(BYE)
        assert await phone2.recv() is None
        events, status = await observer.events_until_status(["alice"])
        assert events == [] and status.online == {"alice": True}  # the laptop still holds the user
        with trio.fail_after(10):  # the two edges' links are independent: phone2's detach may still be in flight
            while (await observer.status_of(["alice"], last_seen=True)).devices != {"alice": ("laptop",)}:
                await trio.sleep(0.02)
        await laptop.send(BYE)
        assert await laptop.recv() is None
        offline = await observer.recv()
        assert (offline.uid, offline.kind, offline.reason, (offline.extra or {}).get("device")) == (
            "alice", "offline", "logout", "laptop")
        assert await daemon.stop(signal.SIGTERM) == 0
    assert _records(data_dir, "alice") == [("online", "login", "phone"), ("offline", "logout", "laptop")]


@pytest.mark.slow
async def test_grace_through_the_edges_of_workers_2(tmp_path: Path) -> None:
    """offline_grace under --workers 2: an edge passes a closed connection on as ``detach closed``, so a reconnect
    within the grace (through either edge) emits nothing, and a missed one gives the offline its original time."""
    grace = 1.0
    data_dir = tmp_path / "data"
    command = peers.serve_command(data_dir, "--tick", str(TICK), "--fsync", "never", "--metrics-port", "0",
                                  "--workers", "2", "--offline-grace", str(grace))
    async with peers.Daemon(command, tmp_path / "serve.err") as daemon:
        port = daemon.port
        observer = await peers.Client.login(port, "observer", "obs")
        await observer.send(Subscribe(None))
        await observer.drain()
        phone = await device(port, "bob", "phone")
        online, = await observer.drain()
        assert (online.uid, online.kind) == ("bob", "online")
        await phone.stream.aclose()  # no bye: closed, the grace starts
        await trio.sleep(grace / 4)
        phone = await device(port, "bob", "phone")  # back within the grace
        await pinged(phone)
        await trio.sleep(grace * 1.5)  # past the first grace: nothing may come
        events, status = await observer.events_until_status(["bob"])
        assert events == [] and status.online == {"bob": True}
        await phone.stream.aclose()
        closed, closed_wall = trio.current_time(), time.time()
        with trio.fail_after(grace + 5):
            offline = await observer.recv()
        assert trio.current_time() - closed >= grace * 0.9  # it waited out the grace
        extra = offline.extra or {}
        assert (offline.uid, offline.kind, offline.reason, extra.get("device"), extra.get("grace")) == (
            "bob", "offline", "closed", "phone", grace)
        assert closed_wall - 0.05 <= offline.ts <= closed_wall + 0.5  # the close time, not the grace's end
        assert await daemon.stop(signal.SIGTERM) == 0
    assert _records(data_dir, "bob") == [("online", "login", "phone"), ("offline", "closed", "phone")]
