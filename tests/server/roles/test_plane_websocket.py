"""Plain WebSocket users are served by the user plane after the welcome (no task each), like TCP users:
in-process server, real sockets, Python's stock `websockets` client (its threaded sync client, off the loop)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from idled.protocol import Event
from tests.peers import Harness, running

pytestmark = pytest.mark.slow  # real sockets and a client thread

PING, BYE = msgpack.packb({"op": "ping"}), msgpack.packb({"op": "bye"})


def login(port: int, uid: str) -> ClientConnection:
    ws = connect(f"ws://127.0.0.1:{port}/", open_timeout=10, legacy=True)
    ws.send(msgpack.packb({"op": "login", "uid": uid, "keepalive": 30}))
    assert msgpack.unpackb(ws.recv(timeout=10))["op"] == "welcome"
    return ws


async def adopted(h: Harness, uid: str) -> None:
    with trio.fail_after(5):
        while h.server.running.plane is None or not any(
                r.key == uid and r.ws is not None for r in h.server.running.plane.records()):
            await trio.sleep(0.01)


def last_then_close(ws: ClientConnection) -> tuple[Any, int, str]:
    last = None
    try:
        while True:
            last = msgpack.unpackb(ws.recv(timeout=10))
    except ConnectionClosed as exc:
        assert exc.rcvd is not None
        return last, exc.rcvd.code, exc.rcvd.reason


async def test_pings_bye_errors_and_the_clients_close_through_the_plane(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True) as h:
        observer = await h.observer()
        alice = await trio.to_thread.run_sync(login, h.port, "alice")
        await adopted(h, "alice")

        def keepalives() -> None:
            assert alice.ping(b"x").wait(5)  # a control ping: answered by the plane
            for _ in range(3):
                alice.send(PING)
                assert msgpack.unpackb(alice.recv(timeout=5)) == {"op": "pong"}
            alice.send(BYE)

        await trio.to_thread.run_sync(keepalives)
        assert await trio.to_thread.run_sync(last_then_close, alice) == (None, 1000, "")

        bob = await trio.to_thread.run_sync(login, h.port, "bob")
        await adopted(h, "bob")
        await trio.to_thread.run_sync(bob.send, "text")  # a text message: bad_frame, close 1002
        error, code, reason = await trio.to_thread.run_sync(last_then_close, bob)
        assert (error["code"], code, reason) == ("bad_frame", 1002, "bad_frame")

        carol = await trio.to_thread.run_sync(login, h.port, "carol")
        await adopted(h, "carol")
        await trio.to_thread.run_sync(carol.close)  # the client's close: echoed, the session ends
        kinds = [(e.uid, e.kind, e.reason) for e in [await observer.expect(Event) for _ in range(6)]]
        assert kinds == [("alice", "online", "login"), ("alice", "offline", "logout"), ("bob", "online", "login"),
                         ("bob", "offline", "closed"), ("carol", "online", "login"), ("carol", "offline", "closed")]
        with trio.fail_after(5):
            while h.server.connections["user"]:
                await trio.sleep(0.01)  # the plane gave every count back


async def test_control_pings_alone_keep_a_user_online(tmp_path: Path) -> None:
    """A client that can send control pings (not a browser) may keep its session with them alone: each is
    answered and counts as activity; when they stop, the session goes idle as with any keepalive."""
    async with running(tmp_path, listen=True) as h:
        observer = await h.observer()

        def session() -> ClientConnection:
            ws = connect(f"ws://127.0.0.1:{h.port}/", open_timeout=10, legacy=True)
            ws.send(msgpack.packb({"op": "login", "uid": "frank", "keepalive": 1}))  # timeout 1.5 s
            assert msgpack.unpackb(ws.recv(timeout=10))["op"] == "welcome"
            return ws

        frank = await trio.to_thread.run_sync(session)
        await adopted(h, "frank")
        started = trio.current_time()

        def control_pings() -> None:
            for _ in range(10):  # 3 s of control pings, 0.3 s apart: twice the timeout
                assert frank.ping().wait(5)
                time.sleep(0.3)

        await trio.to_thread.run_sync(control_pings)
        assert trio.current_time() - started > 3.0
        online = await observer.expect(Event)
        assert (online.uid, online.kind) == ("frank", "online")
        error, code, reason = await trio.to_thread.run_sync(last_then_close, frank)
        assert (error["code"], code, reason) == ("idle_timeout", 4000, "idle_timeout")
        offline = await observer.expect(Event)
        assert (offline.uid, offline.kind, offline.reason) == ("frank", "offline", "idle")
        assert offline.last_seen >= online.ts + 2.5  # the last control ping was its last activity
