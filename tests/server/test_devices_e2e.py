"""End to end: devices and grace through a real `idled serve` subprocess (real sockets, real time; one process,
`--workers 0`: the edges' side of devices is tested with the edges)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from idled.protocol import BYE, PING, PONG, Event, Login, Query, Status, Subscribe, Welcome

from tests import peers

TICK = 0.1
GRACE = 1.0


class Daemon(peers.Daemon):
    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.data_dir = tmp_path / "data"
        command = peers.serve_command(self.data_dir, "--metrics-port", "0", "--tick", str(TICK), "--timeout", "1",
                                      "--workers", "0", *extra)
        super().__init__(command, tmp_path / f"idled-{time.monotonic_ns()}.stderr")


async def user(port: int, uid: Any, device: str | None = None) -> peers.Client:
    client = await peers.Client.connect(port)
    await client.send(Login("uid", uid, None, 30.0, device=device))
    welcome = await client.recv()
    assert isinstance(welcome, Welcome) and welcome.name == uid, welcome
    return client


async def watching(port: int) -> peers.Client:
    observer = await peers.Client.login(port, "observer", "watch")
    await observer.send(Subscribe(None))
    await observer.send(Query(("-",)))
    assert isinstance(await observer.recv(), Status)
    return observer


async def settle(observer: peers.Client, *uids: Any) -> tuple[list[Event], dict[Any, bool]]:
    """Every event so far, and whether ``uids`` are online: a user's frames are applied in order, so a pong
    proves what it sent before was; then the observer's query answer follows every event before it."""
    events, status = await observer.events_until_status(uids)
    return events, dict(status.online)


async def ping(client: peers.Client) -> None:
    await client.send(PING)
    assert await client.recv() is PONG


async def close(client: peers.Client) -> None:
    """Drop the connection without bye (reason ``closed``)."""
    await client.stream.aclose()


def read_events(data_dir: Path) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "idled.cli.main", "events", "--data-dir", str(data_dir)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def shape(event: Event) -> tuple[Any, ...]:
    extra = event.extra or {}
    return event.kind, event.uid, event.reason, extra.get("device"), extra.get("grace")


@pytest.mark.slow  # a real `idled serve` subprocess, real time
async def test_devices_user_level_events_kicks_and_the_cap(tmp_path: Path) -> None:
    async with Daemon(tmp_path, "--max-devices", "2") as daemon:
        observer = await watching(daemon.port)
        # two devices: one leaves, one stays -> no offline; the last leaves -> one offline, with its reason
        phone = await user(daemon.port, "alice", "phone")
        laptop = await user(daemon.port, "alice", "laptop")
        await phone.send(BYE)
        assert await phone.recv() is None
        events, online = await settle(observer, "alice")
        assert [shape(e) for e in events] == [("online", "alice", "login", "phone", None)] and online["alice"]
        await ping(laptop)
        await close(laptop)
        offline = await observer.expect(Event)
        assert shape(offline) == ("offline", "alice", "closed", "laptop", None)
        # the same device again: the first connection is kicked, no event
        first = await user(daemon.port, "bob", "phone")
        second = await user(daemon.port, "bob", "phone")
        await first.expect_error("kicked")
        # past the cap (2): the oldest device's connection is kicked, no event
        tablet = await user(daemon.port, "bob", "tablet")
        web = await user(daemon.port, "bob", "web")
        error = await second.expect_error("kicked")
        assert "max_devices 2" in error.reason
        await ping(tablet)
        await ping(web)
        events, online = await settle(observer, "bob")
        assert [shape(e) for e in events] == [("online", "bob", "login", "phone", None)] and online["bob"]
        assert await daemon.stop() == 0
    records = read_events(daemon.data_dir)
    assert [(r["kind"], r["uid"], r["reason"], r.get("device")) for r in records[:3]] == [
        ("online", "alice", "login", "phone"), ("offline", "alice", "closed", "laptop"),
        ("online", "bob", "login", "phone"),
    ]
    [last] = records[3:]  # shutdown ends bob's two devices: one offline, caused by whichever ended last
    assert (last["kind"], last["uid"], last["reason"]) == ("offline", "bob", "shutdown")
    assert last["device"] in {"tablet", "web"}


@pytest.mark.slow  # a real `idled serve` subprocess, real time
async def test_grace_reconnect_is_silent_and_a_missed_one_is_offline_with_its_original_time(tmp_path: Path) -> None:
    async with Daemon(tmp_path, "--offline-grace", str(GRACE)) as daemon:
        observer = await watching(daemon.port)
        # a reconnect within the grace: no events at all beyond the first online
        first = await user(daemon.port, "dave", "phone")
        await ping(first)
        await close(first)
        await trio.sleep(0.3)
        events, online = await settle(observer, "dave")
        assert online["dave"]  # online throughout the grace
        again = await user(daemon.port, "dave", "laptop")
        await trio.sleep(GRACE + 3 * TICK)
        await ping(again)
        later, online = await settle(observer, "dave")
        assert [shape(e) for e in events + later] == [("online", "dave", "login", "phone", None)] and online["dave"]
        # no reconnect: the offline comes once the grace is over, with the time the connection closed
        erin = await user(daemon.port, "erin", "tablet")
        await ping(erin)
        closed_at = time.time()
        await close(erin)
        online_event = await observer.expect(Event)
        assert shape(online_event) == ("online", "erin", "login", "tablet", None)
        offline = await observer.expect(Event)
        arrived = time.time()
        assert shape(offline) == ("offline", "erin", "closed", "tablet", GRACE)
        assert closed_at - 0.05 <= offline.ts <= closed_at + 0.5  # the original time, not the grace's end
        assert arrived - closed_at >= GRACE - 0.05
        assert offline.seq == online_event.seq + 1
        assert await daemon.stop() == 0
    records = read_events(daemon.data_dir)
    erin_offline = [r for r in records if r["uid"] == "erin" and r["kind"] == "offline"]
    assert [(r["reason"], r["device"], r["grace"]) for r in erin_offline] == [("closed", "tablet", GRACE)]


def frames(data: bytes) -> list[bytes]:
    out = []
    while len(data) >= 4:
        (n,) = struct.unpack_from(">I", data)
        if len(data) < 4 + n:
            break
        out.append(data[: 4 + n])
        data = data[4 + n:]
    return out


@pytest.mark.slow  # a real `idled serve` subprocess, real time
async def test_a_login_without_device_makes_the_very_frames_and_records_it_made_before(tmp_path: Path) -> None:
    """Old clients: no device, grace 0 -- each event frame holds exactly the fields (in their order) it held
    before devices, byte for byte, and so do the log records."""
    old_keys = ["op", "seq", "kind", "uid", "ts", "reason", "last_seen", "deadline", "timeout", "detector"]
    async with Daemon(tmp_path) as daemon:
        observer = await trio.open_tcp_stream("127.0.0.1", daemon.port)
        await observer.send_all(peers.frame({"op": "login", "observer": "raw"}) + peers.frame({"op": "subscribe"})
                                + peers.frame({"op": "query", "uids": ["-"]}))
        received = b""
        while len(frames(received)) < 2:  # the welcome, the status: subscribed
            received += await observer.receive_some(65536)
        carol = await user(daemon.port, "carol")
        await carol.send(BYE)
        assert await carol.recv() is None
        while len(frames(received)) < 4:
            received += await observer.receive_some(65536)
        online, offline = frames(received)[2:4]
        for raw, kind, reason in ((online, "online", "login"), (offline, "offline", "logout")):
            obj = msgpack.unpackb(raw[4:])
            assert list(obj) == old_keys and (obj["kind"], obj["uid"], obj["reason"]) == (kind, "carol", reason)
            # what the encoder made before devices, from the very values
            expected = {key: obj[key] for key in old_keys}
            body = msgpack.packb(expected)
            assert raw == struct.pack(">I", len(body)) + body
        await observer.aclose()
        assert await daemon.stop() == 0
    records = read_events(daemon.data_dir)
    assert [sorted(r) for r in records] == [sorted(old_keys[1:])] * 2
