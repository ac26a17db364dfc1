"""Hostile and broken input over real loopback sockets, against a real in-process server (real clock).

Every bad connection must get exactly one `error` frame with the right code and then be closed, while a
well-behaved user connected throughout keeps getting pongs and never goes offline, and the server keeps
accepting. The server runs in this test's trio loop (`tests.peers.running(listen=True)`: its own port-0
listener), so the test can also read its counters; the clients are plain TCP connections.
"""

from __future__ import annotations

import functools
import random
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgpack
import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import PING, PONG, Error, Event, Login, Subscribe, Welcome, encode

from tests import peers
from tests.peers import Client, frame, raw_frame

TICK = 0.1
TIMEOUT = 1.0
MAX_GATEWAY_FRAME = 65536


# A real loopback listener (port 0) and a real clock; the test reads the server's counters.
running = functools.partial(
    peers.running, listen=True, tick=TICK, timeout=TIMEOUT, login_timeout=1.0, max_gateway_frame=MAX_GATEWAY_FRAME
)


async def connect(port: int) -> Client:
    """A connection whose reset (the server dropping a hostile peer) reads as the end of the stream."""
    return await Client.connect(port, reset_is_eof=True)


async def login(port: int, role: str, name: str) -> Client:
    return await Client.login(port, role, name, reset_is_eof=True)


def nested_array(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


def nested_map(depth: int) -> bytes:
    return b"\x81\xa1k" * depth + b"\xc0"


def msg_with_depth(depth: int) -> bytes:
    """{"op": "msg", "data": [[[...]]]} with `depth` levels of arrays, hand-encoded."""
    return raw_frame(b"\x82\xa2op\xa3msg\xa4data" + nested_array(depth))


# (login as None/uid/gateway/observer first, bytes sent, expected error code, half-close after sending)
CASES: list[tuple[str, str | None, bytes, str, bool]] = [
    # truncated frames
    ("truncated msgpack body", None, raw_frame(encode(Login("uid", "x"))[4:-2]), "bad_frame", False),
    ("frame cut by end of stream", None, encode(Login("uid", "x"))[:9], "bad_frame", True),
    ("prefix cut by end of stream", None, b"\x00\x00", "bad_frame", True),
    ("frame cut, connection left open", None, encode(Login("uid", "x"))[:9], "login_timeout", False),
    ("user frame cut by end of stream", "uid", encode(PING)[:5], "bad_frame", True),
    ("empty frame", None, b"\x00\x00\x00\x00", "bad_frame", False),
    ("trailing bytes in a frame", None, raw_frame(msgpack.packb({"op": "ping"}) + b"\x00"), "bad_frame", False),
    # oversized length prefixes
    ("prefix 2**32-1", None, b"\xff\xff\xff\xff", "too_large", False),
    ("prefix max_frame + 1", None, struct.pack(">I", 4097), "too_large", False),
    ("user prefix 2**31", "uid", struct.pack(">I", 1 << 31), "too_large", False),
    ("gateway over its larger limit", "gateway", struct.pack(">I", MAX_GATEWAY_FRAME + 1), "too_large", False),
    ("observer prefix 1 MiB", "observer", struct.pack(">I", 1 << 20), "too_large", False),
    # msgpack bombs
    ("array nesting 4000 deep", None, raw_frame(nested_array(4000)), "bad_frame", False),
    ("map nesting 1300 deep", None, raw_frame(nested_map(1300)), "bad_frame", False),
    ("msg data nesting 40 deep", "uid", msg_with_depth(40), "bad_message", False),
    ("msg data nesting 2000 deep", "uid", msg_with_depth(2000), "bad_frame", False),
    ("array32 header claiming 4G items", None, raw_frame(b"\xdd\xff\xff\xff\xff"), "bad_frame", False),
    ("map32 header claiming 4G pairs", None, raw_frame(b"\xdf\xff\xff\xff\xff"), "bad_frame", False),
    ("str32 header claiming 4 GiB", None, raw_frame(b"\xdb\xff\xff\xff\xff"), "bad_frame", False),
    ("gateway uids array32 claiming 4G", "gateway", raw_frame(b"\x82\xa2op\xa6attach\xa4uids\xdd\xff\xff\xff\xff"), "bad_frame", False),
    # non-map payloads
    ("int payload", None, frame(42), "bad_message", False),
    ("str payload", None, frame("login"), "bad_message", False),
    ("array payload", None, frame(["op", "login"]), "bad_message", False),
    ("nil payload", None, frame(None), "bad_message", False),
    ("bin payload", None, raw_frame(msgpack.packb(b"\x00\x01", use_bin_type=True)), "bad_message", False),
    ("ext payload", None, raw_frame(msgpack.packb(msgpack.ExtType(5, b"xyz"))), "bad_frame", False),
    ("timestamp in msg data", "uid", frame({"op": "msg", "data": msgpack.Timestamp(1, 2)}), "bad_frame", False),
    ("user array payload", "uid", frame([1, 2]), "bad_message", False),
    # wrong types and shapes
    ("op is an int", None, frame({"op": 5}), "bad_message", False),
    ("no op", None, frame({"uid": "a"}), "bad_message", False),
    ("unknown op", None, frame({"op": "hello"}), "bad_message", False),
    ("login without identity", None, frame({"op": "login"}), "bad_message", False),
    ("login with two identities", None, frame({"op": "login", "uid": "a", "gateway": "b"}), "bad_message", False),
    ("uid is a bool", None, frame({"op": "login", "uid": True}), "bad_message", False),
    ("uid is a float", None, frame({"op": "login", "uid": 1.5}), "bad_message", False),
    ("uid too long", None, frame({"op": "login", "uid": "x" * 300}), "bad_message", False),
    ("int uid out of range", None, frame({"op": "login", "uid": 2**63}), "bad_message", False),
    ("keepalive is a str", None, frame({"op": "login", "uid": "a", "keepalive": "30"}), "bad_message", False),
    ("keepalive negative", None, frame({"op": "login", "uid": "a", "keepalive": -1}), "bad_message", False),
    ("keepalive NaN", None, frame({"op": "login", "uid": "a", "keepalive": float("nan")}), "bad_message", False),
    ("misspelt field", None, frame({"op": "login", "uid": "a", "keepalvie": 30}), "bad_message", False),
    ("non-str map key", None, raw_frame(b"\x82\xa2op\xa5login\x01\xa1a"), "bad_frame", False),
    ("invalid utf-8", None, raw_frame(b"\x82\xa2op\xa5login\xa3uid\xa2\xff\xfe"), "bad_frame", False),
    ("attach uids is a str", "gateway", frame({"op": "attach", "uids": "abc"}), "bad_message", False),
    ("touch uid is a float", "gateway", frame({"op": "touch", "uids": ["a", 1.5]}), "bad_message", False),
    ("subscribe from -1", "observer", frame({"op": "subscribe", "from": -1}), "bad_message", False),
    ("query uid nil", "observer", frame({"op": "query", "uids": [None]}), "bad_message", False),
]


async def run_case(port: int, role: str | None, data: bytes, half_close: bool) -> Error:
    client = await login(port, role, f"bad-{random.random()}") if role else await connect(port)
    await client.stream.send_all(data)
    if half_close:
        await client.stream.send_eof()
    message = await client.recv()
    assert isinstance(message, Error), f"expected an error frame, got {message!r}"
    assert await client.recv() is None, "not closed after the error frame"
    await client.stream.aclose()
    return message


class Bystander:
    """A well-behaved user ("good") pinging every 0.2 s (timeout 1 s) and checking every pong comes back, and
    an observer noting every offline, throughout a test's abuse of the server."""

    def __init__(self) -> None:
        self.pongs = 0
        self.offline: list[Event] = []

    async def ping(self, port: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        client = await login(port, "uid", "good")
        task_status.started()
        while True:
            await trio.sleep(0.2)
            await client.stream.send_all(encode(PING))
            reply = await client.recv(timeout=5.0)
            assert reply is PONG, f"well-behaved user got {reply!r}"
            self.pongs += 1

    async def watch(self, port: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        observer = await login(port, "observer", "watch")
        await observer.stream.send_all(encode(Subscribe(None)))
        task_status.started()
        while (message := await observer.recv(timeout=3600)) is not None:
            if isinstance(message, Event) and message.kind == "offline":
                self.offline.append(message)

    async def still_served(self) -> None:
        """Pongs still come back, and the good user never went offline."""
        pongs = self.pongs
        await trio.sleep(0.5)
        assert self.pongs > pongs
        assert "good" not in {e.uid for e in self.offline}


@asynccontextmanager
async def abused(tmp_path: Path) -> AsyncIterator[tuple[peers.Harness, Bystander]]:
    """A listening server with a bystander connected (both stopped when the block ends)."""
    async with running(tmp_path) as h:
        bystander = Bystander()
        async with trio.open_nursery() as background:
            await background.start(bystander.watch, h.port)
            await background.start(bystander.ping, h.port)
            yield h, bystander
            background.cancel_scope.cancel()


@pytest.mark.slow  # real clock: seconds of real time
async def test_every_bad_input_gets_its_error_and_the_server_keeps_serving(tmp_path: Path) -> None:
    async with abused(tmp_path) as (h, bystander):
        server, port = h.server, h.port
        failures = []
        for name, role, data, code, half_close in CASES:
            try:
                error = await run_case(port, role, data, half_close)
            except AssertionError as exc:
                failures.append(f"{name}: {exc}")
                continue
            if error.code != code:
                failures.append(f"{name}: expected {code}, got {error.code} ({error.reason})")
        assert not failures, "\n".join(failures)
        await bystander.still_served()  # still answered after everything
        fresh = await login(port, "uid", "fresh")
        await fresh.stream.send_all(encode(PING))
        assert await fresh.recv() is PONG
        assert server.running.presence is not None and server.running.presence.is_online("good")
        rejected = {code: h.metric("idled_frames_rejected_total", reason=code) for code in {case[3] for case in CASES}}
        expected = {code: float(sum(1 for case in CASES if case[3] == code)) for code in rejected}
        assert rejected == expected


@pytest.mark.slow  # real clock: seconds of real time
async def test_random_bytes_from_many_connections(tmp_path: Path) -> None:
    rng = random.Random(20240601)
    payloads = []
    for _ in range(150):
        size = rng.choice([1, 3, 4, 5, 9, 17, 64, 300, 2000])
        data = bytes(rng.getrandbits(8) for _ in range(size))
        if rng.random() < 0.5:  # half of them look like a frame: a plausible length prefix first
            data = struct.pack(">I", rng.randrange(1, 200)) + data
        payloads.append(data)
    codes: list[str] = []
    async with abused(tmp_path) as (h, bystander):
        limiter = trio.CapacityLimiter(20)

        async def one(data: bytes) -> None:
            async with limiter:
                error = await run_case(h.port, None, data, half_close=True)
                codes.append(error.code)

        async with trio.open_nursery() as clients:
            for data in payloads:
                clients.start_soon(one, data)
        await bystander.still_served()
        assert len(codes) == len(payloads)
        assert set(codes) <= {"bad_frame", "too_large", "bad_message", "not_logged_in"}
        assert h.server.connections["pending"] == 0
    # nothing but the good user's own session reached the log
    assert {r["uid"] for r in iter_records(tmp_path / "data")} == {"good"}


@pytest.mark.parametrize("role", ["uid", "gateway", "observer"])
async def test_slow_drip_of_a_valid_frame_is_accepted(tmp_path: Path, role: str) -> None:
    """The opposite case: a valid frame split into single bytes is reassembled, not rejected."""
    async with running(tmp_path) as h:
        port = h.port
        client = await connect(port)
        for byte in encode(Login(role, "drip")):  # type: ignore[arg-type]
            await client.stream.send_all(bytes([byte]))
            await trio.sleep(0.001)
        assert isinstance(await client.recv(), Welcome)
        for byte in encode(PING):
            await client.stream.send_all(bytes([byte]))
        assert await client.recv() is PONG
