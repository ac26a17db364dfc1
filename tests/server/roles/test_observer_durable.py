"""`subscribe durable=true`: only events the writer reported durable under the fsync policy.

In-process server, memory streams, real clock (the writer's interval policy runs on trio's clock and its
commits in worker threads). `fsync=interval` with an hour-long interval makes durability visible: the
writer syncs its first batch at once and then nothing until the shutdown's final sync.
"""

from __future__ import annotations

import functools
from pathlib import Path

import msgpack
import pytest
import trio

from idled.protocol import BYE, Event, FrameDecoder, Login, ProtocolError, Subscribe, Welcome, encode

from tests import peers
from tests.peers import Client, frame

running = functools.partial(peers.running, metrics=False, recv_timeout=20.0, settle=False)


def test_subscribe_durable_on_the_wire() -> None:
    assert msgpack.unpackb(encode(Subscribe(durable=True))[4:]) == {"op": "subscribe", "durable": True}
    assert msgpack.unpackb(encode(Subscribe(7, True))[4:]) == {"op": "subscribe", "from": 7, "durable": True}
    assert msgpack.unpackb(encode(Subscribe(7))[4:]) == {"op": "subscribe", "from": 7}  # false: not sent
    decoder = FrameDecoder(4096)
    decoder.receive_data(frame({"op": "subscribe", "durable": True}) + frame({"op": "subscribe", "durable": None}))
    assert decoder.next_event() == Subscribe(None, True)
    assert decoder.next_event() == Subscribe(None, False)
    decoder.receive_data(frame({"op": "subscribe", "durable": 1}))
    with pytest.raises(ProtocolError) as error:
        decoder.next_event()
    assert error.value.code == "bad_message"


async def durable_observer(h: peers.Harness, from_seq: int | None = None, name: str = "durable") -> Client:
    peer = await h.connect()
    await peer.send(Login("observer", name))
    await peer.expect(Welcome)
    await peer.send(Subscribe(from_seq, durable=True))
    return peer


async def nothing_within(peer: Client, seconds: float) -> bool:
    """True if `peer` receives nothing for `seconds`."""
    with trio.move_on_after(seconds) as waited:
        await peer.recv(timeout=seconds + 1)
    return waited.cancelled_caught


async def test_only_what_is_synced_then_the_rest_at_the_final_sync(tmp_path: Path) -> None:
    async with running(tmp_path, fsync="interval", fsync_interval=3600.0) as h:
        durable = await durable_observer(h)
        live = await h.observer("live")
        await h.user("a")  # seq 1: the writer's first batch, synced at once
        assert (await durable.expect(Event)).seq == 1
        await h.user("b")  # seq 2: written, not synced for an hour
        assert [e.seq for e in await live.drain()] == [1, 2]
        with trio.fail_after(10):
            while h.server.log.last_seq < 2:
                await trio.sleep(0.01)
        assert await nothing_within(durable, 0.5)
        assert h.server.bus.durable_seq == 1
        h.server.stop()  # the final sync makes 2 (and the shutdown offlines 3, 4) durable before the goodbye
        rest = [await durable.expect(Event) for _ in range(3)]
        assert [(e.seq, e.kind) for e in rest] == [(2, "online"), (3, "offline"), (4, "offline")]
        assert (await durable.recv()).code == "server_shutdown"


async def test_fsync_never_delivers_once_written_and_replies_follow_their_events(tmp_path: Path) -> None:
    async with running(tmp_path, fsync="never") as h:
        durable = await durable_observer(h)
        await h.traffic(3)
        events = await durable.drain()  # the status comes after every event published before the query
        assert [e.seq for e in events] == list(range(1, 7))
        assert h.server.log.last_seq >= 6


async def test_durable_replay_across_a_restart(tmp_path: Path) -> None:
    async with running(tmp_path, fsync="always") as h:
        await h.traffic(2)  # 1..4
    async with running(tmp_path, fsync="always") as h:
        durable = await durable_observer(h, from_seq=1)
        await h.traffic(1)  # 5, 6
        got = await durable.drain()
        assert [e.seq for e in got] == list(range(1, 7))
        assert all(isinstance(e, Event) for e in got)


async def test_bye_while_waiting_for_durability(tmp_path: Path) -> None:
    async with running(tmp_path, fsync="interval", fsync_interval=3600.0) as h:
        durable = await durable_observer(h)
        await h.user("a")
        await h.user("b")
        assert (await durable.expect(Event)).seq == 1
        await durable.send(BYE)  # its sender is waiting for seq 2 to become durable: the bye ends it anyway
        assert await durable.recv() is None
