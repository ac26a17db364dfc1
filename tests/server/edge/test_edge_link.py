"""The edge's core link (idled.server.edge.link) against a scripted core on a real loopback socket.

The scripted core speaks the gateway side of the protocol by hand, so each test decides exactly when the core
answers, closes or vanishes: the link must treat every end of a connection as a reason to reconnect (or, once
closing, to return) -- never raise out of ``run()`` -- and a login's attach must be done at the core before
the edge may welcome the user. The last tests run the same script against both users of the one gateway
link (``idled.client.gatewaylink``): the edge's ``CoreLink`` and the client library's ``Gateway``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from idled.client.core import Backoff
from idled.client.gateway import Gateway
from idled.client.gatewaylink import GatewayLink
from idled.client.trio import TRIO
from idled.protocol import BYE, PING, PONG_FRAME, Attach, Detach, FrameDecoder, Login, Touch, Welcome, encode, receive_message
from idled.server.edge.link import CoreLink
from idled.server.edge.touches import AGE_STEP

Script = Callable[[trio.SocketStream, FrameDecoder, list[Any]], Awaitable[None]]


class ScriptedCore:
    """A listener whose n-th connection runs ``scripts[n]`` after the login and welcome (``tick``, ``ages``:
    what it says); ``seen`` records every frame each connection sent, in order."""

    def __init__(self, *scripts: Script, tick: float = 0.1, ages: bool = True) -> None:
        self.scripts = list(scripts)
        self.tick, self.ages = tick, ages
        self.seen: list[list[Any]] = []
        self.port = 0

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(1 << 20)
        seen: list[Any] = []
        self.seen.append(seen)
        script = self.scripts.pop(0) if self.scripts else serve_forever
        try:
            login = await receive_message(stream, decoder)
            assert isinstance(login, Login) and login.role == "gateway" and login.ended
            await stream.send_all(encode(Welcome("gateway", login.name, 3.0, 1 << 20, self.tick, 60.0, self.ages)))
            await script(stream, decoder, seen)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()


async def serve_forever(stream: trio.SocketStream, decoder: FrameDecoder, seen: list[Any]) -> None:
    """What the real core does with a gateway: read frames in order, pong the pings, end at bye."""
    while (message := await receive_message(stream, decoder)) is not None:
        seen.append(message)
        if message is PING:
            await stream.send_all(PONG_FRAME)
        if message is BYE:
            return


def vanish_after(frames: int) -> Script:
    """Read ``frames`` frames, then close the connection without a word (a crash, as the link sees it)."""

    async def script(stream: trio.SocketStream, decoder: FrameDecoder, seen: list[Any]) -> None:
        while len(seen) < frames and (message := await receive_message(stream, decoder)) is not None:
            seen.append(message)

    return script


class Linked:
    """A scripted core, and a link to it that has had its first welcome; ``done`` is set once ``run()``
    returned (it must never raise)."""

    def __init__(self, core: ScriptedCore, link: CoreLink) -> None:
        self.core = core
        self.link = link
        self.done = trio.Event()

    async def run(self) -> None:
        await self.link.run()
        self.done.set()

    async def attach(self, uid: Any, keepalive: float | None) -> None:
        """Attach ``uid`` and wait until the core has processed it."""
        attached = self.link.attach(uid, keepalive)
        assert attached is not None
        await attached.wait()


@asynccontextmanager
async def linked(*scripts: Script, tick: float = 0.1, ages: bool = True) -> AsyncIterator[Linked]:
    """``ScriptedCore(*scripts, ...)`` listening, a ``CoreLink`` to it running; both cancelled when the block ends."""
    core = ScriptedCore(*scripts, tick=tick, ages=ages)
    async with trio.open_nursery() as nursery:
        await nursery.start(core.serve)
        link = CoreLink(f"127.0.0.1:{core.port}", "edge-test", secret=None, on_ended=lambda uids, reason: None,
                        backoff=Backoff(base=0.01, cap=0.05))
        peers = Linked(core, link)
        nursery.start_soon(peers.run)
        await link.ready.wait()
        yield peers
        nursery.cancel_scope.cancel()


async def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


async def test_a_core_that_closes_the_link_is_reconnected_and_every_live_user_reattached() -> None:
    # The first connection ends right after the attach and its ping; run() must not raise: a closed link is
    # the normal end of a connection.
    async with linked(vanish_after(2)) as peers:
        core, link = peers.core, peers.link
        link.attach("alice", 30.0)
        link.attach("bob", None)
        await wait_for(lambda: link.connections == 2 and link.connected)
        await wait_for(lambda: len(core.seen) == 2 and len(core.seen[1]) >= 2)
        reattached = {uid for message in core.seen[1] if type(message) is Attach for uid in message.uids}
        assert reattached == {"alice", "bob"}
        await link.close()
    assert core.seen[1][-1] is BYE


async def test_close_returns_at_once_when_the_core_vanishes_during_the_drain() -> None:
    """The core dies while the edge drains (it reads the detaches, never answers the bye): close() returns
    as soon as the connection is gone, not after its timeout, and run() returns without an error."""
    async with linked(vanish_after(1)) as peers:
        core, link = peers.core, peers.link
        link.detach("carol", "shutdown")
        started = trio.current_time()
        await link.close(timeout=30.0)
        assert trio.current_time() - started < 5.0  # not the 30 s timeout
        with trio.fail_after(5):
            await peers.done.wait()  # no reconnect once closing, and nothing raised
    assert core.seen[0][0] == Detach(("carol",), "shutdown") and len(core.seen) == 1


async def test_close_during_a_live_link_sends_the_pending_detaches_then_bye() -> None:
    async with linked(serve_forever) as peers:
        core, link = peers.core, peers.link
        await peers.attach("dave", 10.0)
        link.touch("dave", time.monotonic())
        link.detach("dave", "shutdown")
        with trio.fail_after(10):
            await link.close(timeout=10.0)
        assert not link.connected
    kinds = [type(m).__name__ if m not in (PING, BYE) else repr(m) for m in core.seen[0]]
    assert [m for m in core.seen[0] if type(m) in (Attach, Detach)] == [Attach(("dave",), 10.0), Detach(("dave",), "shutdown")]
    assert core.seen[0][-1] is BYE, kinds


async def test_an_attach_is_done_at_the_core_before_its_event_is_set() -> None:
    """The welcome waits for this event: the core has read the attach (and answered the ping after it)."""
    gate = trio.Event()

    async def slow_core(stream: trio.SocketStream, decoder: FrameDecoder, seen: list[Any]) -> None:
        while (message := await receive_message(stream, decoder)) is not None:
            seen.append(message)
            if message is PING:
                await gate.wait()  # the core is busy: no pong yet
                await stream.send_all(PONG_FRAME)

    async with linked(slow_core) as peers:
        core, link = peers.core, peers.link
        attached = link.attach("erin", None)
        assert attached is not None
        await wait_for(lambda: PING in core.seen[0])
        assert Attach(("erin",), None) in core.seen[0][: core.seen[0].index(PING)]
        await trio.sleep(0.05)
        assert not attached.is_set()  # the ping is not answered yet
        gate.set()
        with trio.fail_after(5):
            await attached.wait()
        later = link.attach("frank", None)
        assert later is not None and not later.is_set()  # a new login waits for its own flush
        with trio.fail_after(5):
            await later.wait()


async def test_logins_waiting_for_an_attach_are_released_when_the_link_is_lost() -> None:
    async def silent_core(stream: trio.SocketStream, decoder: FrameDecoder, seen: list[Any]) -> None:
        while (message := await receive_message(stream, decoder)) is not None:
            seen.append(message)
            if message is PING:
                return  # gone before answering

    async with linked(silent_core) as peers:
        core, link = peers.core, peers.link
        attached = link.attach("gina", None)
        assert attached is not None
        with trio.fail_after(5):
            await attached.wait()  # released by the loss; the next welcome re-attaches gina
        await wait_for(lambda: link.connections == 2)
        await wait_for(lambda: any(type(m) is Attach and "gina" in m.uids for m in core.seen[1]))


# What a touch may take on top of its interval to reach the scripted core over loopback: a few loop turns of
# this one trio loop (link and core share it), with room for a busy 2-core test machine. Far below the link's
# 5 s ping, which a link that stopped flushing on time would wait for.
TOUCH_SLACK = 0.25


async def test_touches_are_sent_within_the_batch_interval() -> None:
    async with linked(serve_forever) as peers:
        core, link = peers.core, peers.link
        await peers.attach("hank", 30.0)
        sent = trio.current_time()
        link.touch("hank", time.monotonic())
        await wait_for(lambda: any(type(m) is Touch for m in core.seen[0]), timeout=10.0)
        took = trio.current_time() - sent
        assert took <= link.touch_interval + TOUCH_SLACK, f"a touch took {took:.3f} s (interval {link.touch_interval} s)"


async def test_touches_say_how_long_ago_they_were_read_never_longer() -> None:
    # Touches wait at the edge for company; each carries its age so the core stamps the activity when the
    # edge read it, not when the batch arrived. Ages are floored (to the link's AGE_STEP): a touch may look
    # younger than it is -- a later deadline -- never older, which would be an early offline.
    async with linked(serve_forever, tick=1.0) as peers:
        core, link = peers.core, peers.link
        await peers.attach("ivy", 30.0)
        await peers.attach("jon", 30.0)
        read_ivy = time.monotonic() - 0.25  # as if read by the plane a quarter of a second ago
        link.touch("ivy", read_ivy)
        link.touch("jon", read_jon := time.monotonic())
        await wait_for(lambda: sum(len(m.uids) for m in core.seen[0] if type(m) is Touch) == 2, timeout=10.0)
        arrived = time.monotonic()
        ago = {uid: m.ago for m in core.seen[0] if type(m) is Touch for uid in m.uids}
        assert 0.0 <= ago["jon"] <= arrived - read_jon
        assert ago["ivy"] <= arrived - read_ivy
        assert ago["ivy"] - ago["jon"] == pytest.approx(0.25, abs=AGE_STEP * 1.01)  # (each floored on its own)


async def test_no_touch_is_older_than_the_core_applies_nor_waits_longer() -> None:
    # The core applies at most half its tick of an age: touches alone wait no longer than that, and an older
    # one (a link that lagged) travels as that old, with the others of that age (one frame, not one per step).
    async with linked(serve_forever, tick=0.04) as peers:
        core, link = peers.core, peers.link
        for uid in ("ivy", "jon", "kim"):
            await peers.attach(uid, 30.0)
        link.touch("ivy", time.monotonic() - 5.0)
        link.touch("jon", time.monotonic() - 0.5)
        sent = time.monotonic()
        link.touch("kim", sent)
        await wait_for(lambda: sum(len(m.uids) for m in core.seen[0] if type(m) is Touch) == 3, timeout=10.0)
        assert time.monotonic() - sent <= 0.02 + TOUCH_SLACK
        touches = [m for m in core.seen[0] if type(m) is Touch]
        ago = {uid: m.ago for m in touches for uid in m.uids}
        assert ago["ivy"] == ago["jon"] == 0.02 and ago["kim"] <= 0.02 and len(touches) <= 2


async def test_a_core_that_does_not_say_ages_gets_none_and_touches_wait_only_the_flush_interval() -> None:
    # An older core refuses a field it does not know (a touch's ``ago``): the link must not send it there, and
    # without ages a wait would move deadlines, so touches go as soon as attaches do.
    async with linked(serve_forever, ages=False) as peers:
        core, link = peers.core, peers.link
        await peers.attach("ivy", 30.0)
        sent = time.monotonic()
        link.touch("ivy", sent - 0.25)
        await wait_for(lambda: any(type(m) is Touch for m in core.seen[0]), timeout=10.0)
        assert time.monotonic() - sent <= link.flush_interval + TOUCH_SLACK
        assert [m for m in core.seen[0] if type(m) is Touch] == [Touch(("ivy",))]


async def test_touches_alone_wait_the_touch_interval_and_a_detach_filed_meanwhile_cuts_it_short() -> None:
    # Touches alone wait for company longer than attaches and detaches (fewer flushes: fewer loop turns at
    # the edge and at the core); a detach -- a logout the observers wait for -- must not wait with them.
    async with linked(serve_forever, tick=20.0) as peers:  # (a tick whose half is longer than the wait below)
        core, link = peers.core, peers.link
        await peers.attach("ivy", 30.0)
        await peers.attach("jon", 30.0)
        link.touch_interval = 5.0
        link.touch("ivy", time.monotonic())
        await trio.sleep(0.3)
        assert not any(type(m) is Touch for m in core.seen[0])  # still waiting for company
        sent = trio.current_time()
        link.detach("jon", "logout")
        await wait_for(lambda: Detach(("jon",), "logout") in core.seen[0], timeout=10.0)
        assert trio.current_time() - sent <= link.flush_interval + TOUCH_SLACK
        assert any(type(m) is Touch and "ivy" in m.uids for m in core.seen[0])  # the touch went with it


async def test_the_edge_freezes_its_long_lived_objects_like_the_core(tmp_path: Any) -> None:
    """Full collections walking every user's task and stream stop the edge's loop (hundreds of ms at 10k+
    connections), and every keepalive read meanwhile reaches the core that much later: the edge runs the
    core's GC policy (idled.ops.gcpolicy)."""
    import gc

    from idled.ops.config import Config
    from idled.ops.gcpolicy import GcPolicy
    from idled.server.edge import Edge

    core = ScriptedCore(serve_forever)
    policy = GcPolicy()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(core.serve)
            config = Config(port=0, host="127.0.0.1", metrics_port=0, data_dir=str(tmp_path)).validate()
            edge = Edge(config, core=f"127.0.0.1:{core.port}", name="gc-test", gc_policy=policy)
            done = trio.Event()

            async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                await edge.serve(task_status=task_status)
                done.set()

            await nursery.start(serve)
            assert gc.get_freeze_count() > 0 and policy._on_gc in gc.callbacks
            edge.stop()
            with trio.fail_after(10):
                await done.wait()  # drained: the link said bye
            nursery.cancel_scope.cancel()
        assert core.seen[0][-1] is BYE
    finally:
        policy.stop()


async def test_a_backlog_past_max_pending_drops_the_connection_and_reattaches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond ``MAX_PENDING`` pending uids the connection is dropped at once -- from the welcome on, whatever its
    writer is doing -- and the next one carries one re-attach of the live uids instead of the backlog."""
    import idled.server.edge.link as edge_link

    monkeypatch.setattr(edge_link, "MAX_PENDING", 10)
    async with linked(serve_forever) as peers:
        core, link = peers.core, peers.link
        for uid in range(11):  # filed in one go: no flush in between
            link.attach(f"u{uid}", 30.0)
        await wait_for(lambda: link.connections == 2 and link.connected)
        await wait_for(lambda: len(core.seen) == 2 and bool(core.seen[1]))
        assert core.seen[1][0] == Attach(tuple(f"u{uid}" for uid in range(11)), 30.0)
        assert not any(type(m) is Attach for m in core.seen[0])  # dropped before its flush

# -- one gateway link, two users ------------------------------------------------------------------------------

LINKS = ["edge", "client"]


@asynccontextmanager
async def gateway_link(kind: str, core: ScriptedCore, backoff: Backoff) -> AsyncIterator[GatewayLink]:
    """The edge's link or the client library's gateway to ``core`` (serving), running; cancelled at the end."""
    link: GatewayLink
    if kind == "edge":
        link = CoreLink(f"127.0.0.1:{core.port}", "edge-test", secret=None, on_ended=lambda uids, reason: None,
                        backoff=backoff)
    else:
        link = Gateway(TRIO, "127.0.0.1", core.port, "gateway-test", on_ended=lambda uids, reason: None,
                       backoff=backoff)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        yield link
        nursery.cancel_scope.cancel()


async def report(link: GatewayLink, attach: list[tuple[str, float | None]], detach: list[str]) -> None:
    """File these operations through the link's own API (each user has its own) and send them."""
    if isinstance(link, CoreLink):
        for uid, keepalive in attach:
            link.attach(uid, keepalive)
        for uid in detach:
            link.detach(uid, "logout")
    else:
        assert isinstance(link, Gateway)
        for uid, keepalive in attach:
            await link.attach([uid], keepalive)
        await link.detach(detach)
        await link.flush()


class CountingBackoff(Backoff):
    """Records the attempt number of every delay asked for (and waits next to nothing)."""

    def __init__(self) -> None:
        super().__init__(base=0.001, cap=0.01)
        self.attempts: list[int] = []

    def delay(self, attempt: int) -> float:
        self.attempts.append(attempt)
        return super().delay(attempt)


@pytest.mark.parametrize("kind", LINKS)
async def test_both_gateway_links_reattach_every_live_uid_first_on_each_welcome(kind: str) -> None:
    core = ScriptedCore(vanish_after(1))  # a crash right after the first frame; then a core that serves
    async with trio.open_nursery() as nursery:
        await nursery.start(core.serve)
        async with gateway_link(kind, core, Backoff(base=0.01, cap=0.05)) as link:
            await wait_for(lambda: link.up)
            await report(link, attach=[("alice", 30.0), ("bob", None), ("carol", 30.0)], detach=["carol"])
            await wait_for(lambda: link.connections == 2 and link.up)
            await wait_for(lambda: len(core.seen) == 2 and len(core.seen[1]) >= 2)
            # The first frames of the new connection: every uid still live, grouped by keepalive.
            assert core.seen[1][:2] == [Attach(("alice",), 30.0), Attach(("bob",), None)]
            assert link.live == 2
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kind", LINKS)
async def test_both_gateway_links_count_the_backoff_from_the_last_login(kind: str) -> None:
    """A connection that logged in resets the backoff: a core that restarts every few minutes must not push
    its gateways towards the cap (the client library's gateway used to count every reconnect since start)."""

    async def welcome_then_close(stream: trio.SocketStream, decoder: FrameDecoder, seen: list[Any]) -> None:
        pass

    core = ScriptedCore(*[welcome_then_close] * 4)
    backoff = CountingBackoff()
    async with trio.open_nursery() as nursery:
        await nursery.start(core.serve)
        async with gateway_link(kind, core, backoff) as link:
            await wait_for(lambda: link.connections == 5 and link.up)
            assert backoff.attempts == [0, 0, 0, 0]
        nursery.cancel_scope.cancel()
