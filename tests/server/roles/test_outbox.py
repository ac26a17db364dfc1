"""Session-ended notices (idled.server.roles.gateways.Outbox) from an in-process server, on the autojump clock.

A gateway that logs in with ``"ended": true`` is told which of its sessions the server ended and why; one that
does not is never sent the message (our own parsers reject unknown ops: opt-in is the compatible way).
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from idled.protocol import (
    PING, PONG, Attach, Ended, Error, Login, Pong, Touch, Welcome, encode, parse_client_message,
)
from idled.server.roles.gateways import Outbox
from tests.peers import Client, Harness, running


async def ended_gateway(h: Harness, name: str = "edge") -> tuple[Client, Welcome]:
    peer = await h.connect()
    await peer.send(Login("gateway", name, None, None, True))
    welcome = await peer.expect(Welcome)
    return peer, welcome


def test_login_ended_field_round_trips_and_is_for_gateways_only() -> None:
    login = Login("gateway", "gw", None, None, True)
    assert parse_client_message({"op": "login", "gateway": "gw", "ended": True}) == login
    assert encode(login) != encode(Login("gateway", "gw"))  # old gateways' login bytes are unchanged
    for bad in ({"op": "login", "uid": "u", "ended": True}, {"op": "login", "gateway": "g", "ended": 1}):
        try:
            parse_client_message(bad)
        except Exception as exc:
            assert getattr(exc, "code", None) == "bad_message"
        else:
            raise AssertionError(f"accepted {bad}")


def test_notices_are_split_by_the_frame_limit() -> None:
    notices = Outbox(max_frame=400)
    for i in range(200):
        notices.add(f"user-{i:04d}", "idle_timeout")
    notices.add(7, "kicked")
    frames = notices.take()
    assert all(len(f) - 4 <= 400 for f in frames) and len(frames) > 2
    assert notices.pending == {}


async def test_gateway_welcome_carries_what_an_edge_needs(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, timeout=2.0, max_timeout=60.0) as h:
        peer, welcome = await ended_gateway(h)
        assert (welcome.timeout, welcome.tick, welcome.max_timeout) == (2.0, 0.1, 60.0)


async def test_idle_kicked_and_shutdown_notices(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, timeout=2.0) as h:
        gw, _ = await ended_gateway(h)
        await gw.send(Attach(("a", "b", 3), 1.0))  # timeout 1.5 s
        await trio.sleep(1.0)
        await gw.send(Touch(("b", 3)))
        start = trio.current_time()
        message = await gw.recv()
        assert message == Ended(("a",), "idle")
        assert 0.5 <= trio.current_time() - start <= 0.5 + 0.1 + 0.011  # tick + flush interval
        direct = await h.user("b")
        assert await gw.recv() == Ended(("b",), "kicked")
        await direct.send(PING)
        assert await direct.recv() is PONG
        h.server.stop()
        assert await gw.recv() == Ended((3,), "shutdown")
        error = await gw.recv()
        assert isinstance(error, Error) and error.code == "server_shutdown"


async def test_a_pong_follows_the_notices_generated_before_its_ping(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=2.0) as h:
        gw, _ = await ended_gateway(h)
        await gw.send(Attach(("x",)))
        await h.user("x")  # kicks the gateway's x: the notice is pending for up to 10 ms
        await gw.send(PING)
        assert await gw.recv() == Ended(("x",), "kicked")
        assert isinstance(await gw.recv(), Pong)


async def test_a_gateway_that_did_not_opt_in_never_receives_ended(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=1.0) as h:
        gw = await h.gateway()
        await gw.send(Attach(("idle-1", "kicked-1")))
        await h.user("kicked-1")
        await trio.sleep(3.0)  # idle-1 expired meanwhile
        await gw.send(PING)
        assert await gw.recv() is PONG  # the first frame after the welcome: no ended before it
        h.server.stop()
        error = await gw.recv()
        assert isinstance(error, Error) and error.code == "server_shutdown"


async def test_an_opted_in_gateway_sending_a_bad_frame_gets_its_error_frame(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The notices' flusher runs in a nursery around the gateway's loop: a protocol error raised inside it must
    # still reach the doorway as itself (an error frame, a counted reject), not as an ExceptionGroup (a "bug").
    async with running(tmp_path, timeout=2.0) as h:
        gateway, _ = await ended_gateway(h)
        await gateway.send_raw(b"\x00\x00\x00\x01\xc1")  # 0xc1: a byte msgpack never uses
        await gateway.expect_error("bad_frame")
        assert h.metric("idled_frames_rejected_total", reason="bad_frame") == 1
