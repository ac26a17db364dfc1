"""WebSocket sessions end to end: Python's stock `websockets` client against a real `idled serve` (and `idled edge`).

The client is a library nobody here wrote (websockets 17, its threaded sync client, run off the trio loop);
the observer is a plain TCP peer. Same port as TCP: the doorway tells a WebSocket upgrade by its first byte.
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import pytest
import trio
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from idled.protocol import Event, Query, Status, Subscribe
from tests.peers import Client, Daemon, serve_command
from tests.server.edge.test_edge import edge_command
from tests.tlscerts import Certs

pytestmark = pytest.mark.slow

T = TypeVar("T")
PING = msgpack.packb({"op": "ping"})
PONG = {"op": "pong"}


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(fn, *args)


def daemon(tmp_path: Path, *options: str) -> Daemon:
    command = serve_command(tmp_path / "data", "--tick", "0.1", "--fsync", "never", "--metrics-port", "0",
                            "--login-timeout", "2", *options)
    return Daemon(command, tmp_path / f"idled-{time.monotonic_ns()}.err")


def ws_login(uri: str, uid: str, keepalive: float = 1.0, **options: Any) -> ClientConnection:
    """A stock client's session: connect, log in, the welcome."""
    ws = connect(uri, subprotocols=["idled.v1"], open_timeout=10, legacy=True, **options)  # type: ignore[list-item]
    assert ws.subprotocol == "idled.v1"
    ws.send(msgpack.packb({"op": "login", "uid": uid, "keepalive": keepalive}))
    welcome = msgpack.unpackb(ws.recv(timeout=10))
    assert welcome["op"] == "welcome" and welcome["uid"] == uid, welcome
    return ws


def closed_with(ws: ClientConnection) -> tuple[Any, int, str]:
    """The last message before the close (the error map), and the close's code and reason."""
    last = None
    try:
        while True:
            last = msgpack.unpackb(ws.recv(timeout=10))
    except ConnectionClosed as exc:
        assert exc.rcvd is not None, "no close frame from the server"
        return last, exc.rcvd.code, exc.rcvd.reason


async def watching(port: int) -> Client:
    observer = await Client.login(port, "observer", "watch")
    await observer.send(Subscribe(None))
    await observer.send(Query(("-",)))
    assert isinstance(await observer.recv(), Status)
    return observer


async def next_event(observer: Client) -> Event:
    message = await observer.recv(10)
    assert isinstance(message, Event), message
    return message


def keepalives_then_silence(ws: ClientConnection) -> tuple[Any, int, str]:
    """A control ping (answered, activity), application pings (pongs), one split in two fragments, then nothing."""
    assert ws.ping().wait(5)
    for n in range(4):
        time.sleep(0.25)
        ws.send([PING[:3], PING[3:]] if n == 1 else PING)  # (a list: one message in fragments)
        assert msgpack.unpackb(ws.recv(timeout=5)) == PONG
    return closed_with(ws)


async def expect_session(port: int, uri: str, observer: Client, **options: Any) -> None:
    ws = await off_loop(lambda: ws_login(uri, "alice", **options))
    online = await next_event(observer)
    assert (online.kind, online.uid) == ("online", "alice")
    error, code, reason = await off_loop(keepalives_then_silence, ws)
    assert error["op"] == "error" and error["code"] == "idle_timeout", error
    assert (code, reason) == (4000, "idle_timeout")
    offline = await next_event(observer)
    assert (offline.kind, offline.uid, offline.reason) == ("offline", "alice", "idle")
    assert offline.ts >= offline.deadline


@pytest.mark.parametrize("workers", ["0", "2"])
async def test_a_stock_client_logs_in_pings_and_goes_offline_when_silent(tmp_path: Path, workers: str) -> None:
    async with daemon(tmp_path, "--workers", workers) as d:
        observer = await watching(d.port)
        await expect_session(d.port, f"ws://127.0.0.1:{d.port}/", observer)


async def test_through_idled_edge(tmp_path: Path) -> None:
    async with daemon(tmp_path) as core:
        async with Daemon(edge_command(core.port, "--metrics-port", "0"), tmp_path / "edge.err") as edge:
            observer = await watching(core.port)
            await expect_session(edge.port, f"ws://127.0.0.1:{edge.port}/", observer)


async def test_wss_with_the_test_certificates(tmp_path: Path) -> None:
    certs = Certs(tmp_path / "certs")
    cert, key = certs.server()
    async with daemon(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key)) as d:
        observer = await watching_tls(d.port, certs.client_context())
        await expect_session(d.port, f"wss://127.0.0.1:{d.port}/", observer, ssl=certs.client_context())


async def watching_tls(port: int, context: ssl.SSLContext) -> Client:
    stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=context)
    from idled.protocol import Login, Welcome
    observer = Client(stream)
    await observer.send(Login("observer", "watch"))
    assert isinstance(await observer.recv(), Welcome)
    await observer.send(Subscribe(None))
    await observer.send(Query(("-",)))
    assert isinstance(await observer.recv(), Status)
    return observer


async def test_origin_rule(tmp_path: Path) -> None:
    async with daemon(tmp_path, "--ws-origins", "https://app.example") as d:
        uri = f"ws://127.0.0.1:{d.port}/"

        def refused(origin: str) -> int:
            with pytest.raises(InvalidStatus) as info:
                connect(uri, origin=origin, open_timeout=10, legacy=True)  # type: ignore[arg-type]
            return info.value.response.status_code

        assert await off_loop(refused, "https://evil.example") == 403
        assert await off_loop(refused, "null") == 403  # a file: page, unless listed
        for origin in ("https://app.example", f"http://127.0.0.1:{d.port}"):  # listed; the same origin
            ws = await off_loop(functools.partial(ws_login, uri, "bob", origin=origin))
            ws.close()


async def test_oversize_messages_get_too_large_and_close_1009(tmp_path: Path) -> None:
    async with daemon(tmp_path, "--max-frame", "1000") as d:
        uri = f"ws://127.0.0.1:{d.port}/"

        def before_login() -> tuple[Any, int, str]:
            ws = connect(uri, open_timeout=10, max_size=None, legacy=True)
            ws.send(b"\x81" + b"x" * 5000)  # past the login's 4 KiB
            return closed_with(ws)

        def after_login() -> tuple[Any, int, str]:
            ws = ws_login(uri, "carol", keepalive=30)
            ws.send(msgpack.packb({"op": "msg", "data": "y" * 990}))  # 1000 bytes and more: past --max-frame
            return closed_with(ws)

        for case in (before_login, after_login):
            error, code, reason = await off_loop(case)
            assert error["code"] == "too_large" and (code, reason) == (1009, "too_large"), (error, code, reason)


async def test_half_open_handshakes_from_one_address_are_bounded_by_the_gate(tmp_path: Path) -> None:
    async with daemon(tmp_path, "--max-pending-per-address", "4") as d:
        half_open = []
        for _ in range(4):  # each holds its share, a request head never finished
            sock = socket.create_connection(("127.0.0.1", d.port))
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            half_open.append(sock)
        await trio.sleep(0.3)
        uri = f"ws://127.0.0.1:{d.port}/"

        def fifth() -> None:
            with pytest.raises(InvalidHandshake):  # the gate refuses it before its head is read
                connect(uri, open_timeout=5, legacy=True)

        await off_loop(fifth)
        started = time.monotonic()
        for sock in half_open:  # the login deadline (2 s) closes them
            sock.settimeout(10)
            assert sock.recv(100) == b""
            sock.close()
        assert time.monotonic() - started < 5
        ws = await off_loop(lambda: ws_login(uri, "dave", keepalive=30))  # the share is back
        ws.close()


async def test_a_half_open_handshake_holds_its_head_once(tmp_path: Path) -> None:
    # 1,000 upgrade heads of ~8 KiB that never end (an unauthenticated flood within its share): the daemon's
    # RSS grows by about the head plus an idle connection's cost (~8.8 KiB measured with empty heads), not by
    # the head twice. Measured: ~24 KiB per connection when the doorway kept the first read alive beside the
    # handshake's inbox, ~16 KiB after.
    psutil = pytest.importorskip("psutil")
    head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 7900
    async with daemon(tmp_path, "--max-pending-per-address", "2000", "--login-timeout", "60") as d:
        process = psutil.Process(d.proc.pid)
        await trio.sleep(0.3)
        before = process.memory_info().rss
        socks = []
        try:
            for _ in range(1000):
                sock = socket.create_connection(("127.0.0.1", d.port))
                sock.sendall(head)
                socks.append(sock)
            await trio.sleep(1.5)
            for sock in socks[:: 100]:  # still held: nothing answered, nothing closed
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(100)
            per_connection = (process.memory_info().rss - before) / len(socks)
        finally:
            for sock in socks:
                sock.close()
    assert per_connection < 20 * 1024, f"{per_connection / 1024:.1f} KiB per half-open handshake"


async def http_answer(port: int, request: bytes) -> bytes:
    """What the client port answers a raw request (until it closes)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    answer = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            answer += chunk
    await stream.aclose()
    return answer


UPGRADE_HEADERS = (b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   b"Sec-WebSocket-Version: 13\r\n")


async def test_refused_upgrades_are_one_http_answer(tmp_path: Path) -> None:
    from tests.peers import running

    async with running(tmp_path, listen=True) as h:
        cases = {
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n": b"HTTP/1.1 400 Bad Request",  # not an upgrade
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + UPGRADE_HEADERS + b"Sec-WebSocket-Protocol: mqtt\r\n\r\n":
                b"HTTP/1.1 400 Bad Request",  # another subprotocol
            b"GET / HTTP/1.1\r\nHost: evil.example:7878\r\n" + UPGRADE_HEADERS + b"\r\n":
                b"HTTP/1.1 421 Misdirected Request",  # auth off: a rebound name
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n":
                b"HTTP/1.1 431 Request Header Fields Too Large",  # past the 8 KiB head
        }
        for request, status in cases.items():
            answer = await http_answer(h.port, request)
            assert answer.startswith(status), (request[:80], answer[:200])
        accepted = await http_answer(h.port, b"GET / HTTP/1.1\r\nHost: localhost:1\r\n" + UPGRADE_HEADERS
                                     + b"Sec-WebSocket-Protocol: x, idled.v1\r\n\r\n" + bytes([0x88, 0x80, 1, 2, 3, 4]))
        assert accepted.startswith(b"HTTP/1.1 101 ") and b"idled.v1" in accepted  # then our close, echoed
        assert accepted.endswith(bytes([0x88, 0x00]))
        assert h.metric("idled_frames_rejected_total", reason="websocket_400") == 2


def ws_observer(uri: str) -> ClientConnection:
    """An observer over WebSocket, subscribed from now on (its query's answer proves the subscribe was taken)."""
    ws = connect(uri, open_timeout=10, legacy=True)
    ws.send(msgpack.packb({"op": "login", "observer": "w"}))
    assert msgpack.unpackb(ws.recv(timeout=10))["op"] == "welcome"
    ws.send(msgpack.packb({"op": "subscribe"}))
    ws.send(msgpack.packb({"op": "query", "uids": ["-"]}))
    assert msgpack.unpackb(ws.recv(timeout=10))["op"] == "status"
    return ws


def events_of(ws: ClientConnection, count: int) -> list[tuple[str, str]]:
    out = []
    while len(out) < count:
        message = msgpack.unpackb(ws.recv(timeout=10))
        if message["op"] == "event":
            out.append((message["uid"], message["kind"]))
    return out


async def test_an_observer_over_websocket_direct_and_relayed_by_an_edge(tmp_path: Path) -> None:
    """Every role, not only users: an observer on the core (its own task) and through `idled edge` (the relay
    unwraps its messages into frames for the core, and wraps the core's frames, cut anywhere, into messages)."""
    async with daemon(tmp_path) as core:
        async with Daemon(edge_command(core.port, "--metrics-port", "0"), tmp_path / "edge.err") as edge:
            direct = await off_loop(ws_observer, f"ws://127.0.0.1:{core.port}/")
            relayed = await off_loop(ws_observer, f"ws://127.0.0.1:{edge.port}/")
            user = await Client.login(core.port, "uid", "erin", keepalive=30)
            for ws in (direct, relayed):
                assert await off_loop(events_of, ws, 1) == [("erin", "online")]
            await user.stream.aclose()
            for ws in (direct, relayed):
                assert await off_loop(events_of, ws, 1) == [("erin", "offline")]
                ws.close()
