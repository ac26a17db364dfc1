"""Resuming a gateway that reports watermarks (idled.server.roles.gateways), in-process on the autojump clock.

An edge that loses its connection without ``bye`` keeps its sessions for ``gateway_grace`` seconds; a login of
the same name resumes them with no event, and its first answer to a mark confirms the users it attached
again: the others end ``gateway_lost``.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from idled.protocol import BYE, Attach, Error, ErrorCode, Event, Login, Mark, Marked, Welcome
from tests.peers import Client, Harness, running


async def edge(h: Harness, name: str = "worker-0") -> Client:
    peer = await h.connect()
    await peer.send(Login("gateway", name, None, None, ended=True, marks=True))
    await peer.expect(Welcome)
    return peer


async def answer_one_mark(gateway: Client) -> None:
    while type(message := await gateway.recv()) is not Mark:
        pass
    await gateway.send(Marked(message.t))


async def events(observer: Client, count: int) -> list[tuple[str, str, str]]:
    return [(e.uid, e.kind, e.reason) for e in [await observer.expect(Event) for _ in range(count)]]


async def attached(h: Harness, *uids: str) -> tuple[Client, Client]:
    """An observer, and an edge that attached ``uids`` (their online events read)."""
    observer = await h.observer()
    gateway = await edge(h)
    await gateway.send(Attach(uids, 20.0))
    assert await events(observer, len(uids)) == [(uid, "online", "login") for uid in uids]
    return observer, gateway


async def nothing_more(observer: Client, seconds: float) -> None:
    with trio.move_on_after(seconds):
        unexpected = await observer.recv()
        raise AssertionError(f"no other event expected, got {unexpected}")


async def test_a_reconnect_within_the_grace_period_resumes_every_session_without_an_event(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=30.0, gateway_grace=5.0) as h:
        observer, first = await attached(h, "a", "b")
        await first.stream.aclose()  # the link breaks: no bye
        await trio.sleep(3.0)
        second = await edge(h)  # back within the grace period
        await second.send(Attach(("a",), 20.0))  # "b" left while it was away
        await answer_one_mark(second)  # follows the attach: confirms it
        assert await events(observer, 1) == [("b", "offline", "gateway_lost")]
        await nothing_more(observer, 10.0)
        assert h.server.running.presence is not None and h.server.running.presence.owner_of("a") is not None


async def test_past_the_grace_period_the_gateway_is_lost(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=30.0, gateway_grace=5.0) as h:
        observer, first = await attached(h, "a", "b")
        await first.stream.aclose()
        start = trio.current_time()
        assert sorted(await events(observer, 2)) == [("a", "offline", "gateway_lost"), ("b", "offline", "gateway_lost")]
        assert 5.0 <= trio.current_time() - start < 5.5
        await edge(h)  # a new gateway of that name starts from nothing
        assert h.server.running.presence is not None and len(h.server.running.presence) == 0


async def test_bye_ends_the_sessions_at_once(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, timeout=30.0, gateway_grace=5.0) as h:
        observer, first = await attached(h, "a")
        start = trio.current_time()
        await first.send(BYE)
        assert await events(observer, 1) == [("a", "offline", "gateway_lost")]
        assert trio.current_time() - start < 0.5


async def test_a_newer_connection_takes_over_one_still_open(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=30.0) as h:
        observer, old = await attached(h, "a")
        new = await edge(h)  # the core had not noticed the old connection die
        while type(message := await old.recv()) is not Error:
            pass
        assert message.code == ErrorCode.KICKED
        await new.send(Attach(("a",), 20.0))
        await answer_one_mark(new)
        await nothing_more(observer, 5.0)


async def test_without_a_grace_period_a_lost_connection_ends_its_sessions_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=30.0, gateway_grace=0.0) as h:
        observer, first = await attached(h, "a")
        await first.stream.aclose()
        assert await events(observer, 1) == [("a", "offline", "gateway_lost")]
