"""Gateways that answer marks (idled.core.watermarks through idled.server.roles.gateways and .outbox), in-process.

A gateway that logs in with ``"marks": true`` is sent ``mark(t)`` requests; its sessions expire ``idle`` only
once an answer has passed their deadline, so a gateway that does not answer -- lagging, stopped -- keeps its
sessions online, and one that answers loses the silent ones.
"""

from __future__ import annotations

import time
from pathlib import Path

import trio
import trio.testing

from idled.protocol import (
    Attach, Ended, Error, ErrorCode, Event, Login, Mark, Marked, Query, Status, Touch, Welcome,
)
from idled.server.roles.gateways import MAX_OUTSTANDING
from tests.peers import Client, Harness, running


async def marking_gateway(h: Harness, name: str = "edge") -> Client:
    peer = await h.connect()
    await peer.send(Login("gateway", name, None, None, ended=True, marks=True))
    await peer.expect(Welcome)
    return peer


async def online(h: Harness, uid: str) -> bool:
    observer = await h.observer()
    await observer.send(Query((uid,)))
    status = await observer.expect(Status)
    await observer.stream.aclose()
    return status.online[uid]


async def test_a_gateway_that_does_not_answer_keeps_its_sessions_online(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=2.0) as h:
        gw = await marking_gateway(h)
        await gw.send(Attach(("a", "b"), 1.0))  # timeout 1.5 s
        requests = []
        with trio.move_on_after(10.0):
            while True:
                message = await gw.recv()
                assert type(message) is Mark, message  # no `ended`: nothing expires while it is silent
                requests.append(message.t)
        assert await online(h, "a") and await online(h, "b")
        assert 1 <= len(requests) <= MAX_OUTSTANDING  # a silent gateway is not flooded
        # It answers the newest request (which covers the older ones), then each new one: the sessions
        # really were silent.
        await gw.send(Marked(requests[-1]))
        while type(message := await gw.recv()) is Mark:
            await gw.send(Marked(message.t))
        assert type(message) is Ended and message.reason == "idle" and sorted(message.uids) == ["a", "b"]


async def test_activity_that_arrives_while_a_session_is_held_keeps_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=2.0) as h:
        gw = await marking_gateway(h)
        await gw.send(Attach(("a", "b"), 1.0))
        first = await gw.expect(Mark)
        await gw.send(Marked(first.t))
        await trio.sleep(3.0)  # both past their deadline, held: no answer since the first
        await gw.send(Touch(("a",)))  # "a" spoke in time: its keepalive was only late to arrive
        while type(message := await gw.recv()) is Mark:  # now it answers, after the touch
            await gw.send(Marked(message.t))
        assert message == Ended(("b",), "idle")
        assert await online(h, "a")


async def test_an_answer_to_a_mark_never_sent_is_a_bad_message(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as h:
        gw = await marking_gateway(h)
        await gw.send(Attach(("a",), 60.0))
        first = await gw.expect(Mark)
        await gw.send(Marked(first.t + 1000.0))  # a watermark it was never asked for
        error = await gw.expect(Error)
        assert error.code == ErrorCode.BAD_MESSAGE and "no such mark" in error.reason


async def test_a_gateway_that_owns_no_session_is_not_asked_until_it_attaches_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # An idle edge must sleep (issue 36): a watermark no session is held by need not be fresh. Periodic
    # marks start with the first attach and stop once its sessions are gone.
    async with running(tmp_path, timeout=2.0) as h:
        gw = await marking_gateway(h)
        with trio.move_on_after(5.0) as waited:  # 20 mark intervals
            message = await gw.recv()
            raise AssertionError(f"a gateway without sessions was sent {message!r}")
        assert waited.cancelled_caught
        await gw.send(Attach(("a",), 60.0))
        first = await gw.expect(Mark)
        await gw.send(Marked(first.t))
        second = await gw.expect(Mark)  # periodic while it owns a session
        assert second.t > first.t


async def test_a_gateway_without_marks_is_never_asked(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, timeout=2.0) as h:
        gw = await h.connect()
        await gw.send(Login("gateway", "old", None, None, ended=True))
        await gw.expect(Welcome)
        await gw.send(Attach(("a",), 1.0))
        assert await gw.recv() == Ended(("a",), "idle")  # the first frame is the notice: no mark came before
        await gw.send(Marked(1.0))
        assert (await gw.expect(Error)).code == ErrorCode.NOT_ALLOWED


async def test_a_gateway_that_answers_promptly_loses_silent_sessions_within_a_tick_and_a_round_trip(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, timeout=2.0) as h:
        gw = await marking_gateway(h)
        observer = await h.observer()
        await gw.send(Attach(("a",), 1.0))
        online_event = await observer.expect(Event)

        async def answer() -> None:
            while True:
                message = await gw.recv()
                if type(message) is Mark:
                    await gw.send(Marked(message.t))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            offline = await observer.expect(Event)
            nursery.cancel_scope.cancel()
        assert offline.reason == "idle"
        assert 0.0 <= offline.ts - offline.deadline <= 0.1 + 0.02  # one tick, plus the answer's round trip
        assert online_event.kind == "online" and time.time() > 0
