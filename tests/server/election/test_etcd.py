"""`EtcdElection` in this process against a real etcd: campaign, seq fencing, the lease deadline.

Every test here runs on trio's real clock (real etcd, real time) with a 2 s lease: the leader claims at most
2 - 0.4 s past each renewal's start and renews every 0.67 s.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from idled.server.election import NotLeader, Timings, parse_election_url
from idled.server.election.etcd import EtcdElection
from idled.server.election.etcdclient import EtcdClient
from idled.tools.etcd import EtcdServer

pytestmark = pytest.mark.slow

TTL = 2


@asynccontextmanager
async def running(election: EtcdElection) -> AsyncIterator[EtcdElection]:
    async with election, trio.open_nursery() as nursery:
        await nursery.start(election.run)
        yield election
        nursery.cancel_scope.cancel()


async def until_leader(election: EtcdElection, timeout: float = TTL + 1.0) -> None:
    seen = 0
    with trio.fail_after(timeout):
        while not election.is_leader(time.monotonic()):
            seen = (await election.status.next(seen)).version


async def test_one_leader_seq_survives_a_resignation(etcd: EtcdServer, prefix: str) -> None:
    target = parse_election_url(etcd.url(prefix))
    async with running(EtcdElection(target, "a:1", timings=Timings.of(TTL))) as a:
        await until_leader(a)
        async with running(EtcdElection(target, "b:1", timings=Timings.of(TTL))) as b:
            with trio.fail_after(5):
                while b.leader() != "a:1":  # b follows, and knows where to redirect
                    await b.status.next(b.status.current.version)
            assert not b.is_leader(time.monotonic())
            assert await a.last_seq() == 0
            await a.publish_seq(10)
            await a.publish_seq(12)
            with pytest.raises(ValueError):
                await a.publish_seq(11)  # never backwards
            assert await b.last_seq() == 12  # anyone reads it

            started = time.monotonic()
            await a.resign()  # revokes the lease: the key goes at once, b's watch sees it
            assert not a.is_leader(time.monotonic())
            await until_leader(b)
            assert time.monotonic() - started < 1.0
            assert b.leader() == "b:1" and b.status.current.term > 0
            assert await b.last_seq() == 12  # where to continue
            await b.publish_seq(13)
            with pytest.raises(NotLeader) as caught:
                await a.publish_seq(14)
            assert caught.value.code == "not_leader"
            assert await b.last_seq() == 13


async def test_a_deposed_leaders_seq_write_is_fenced_by_etcd(etcd: EtcdServer, prefix: str) -> None:
    # A long renew interval: the leader does not notice by itself before it writes.
    timings = Timings.of(6)
    async with running(EtcdElection(parse_election_url(etcd.url(prefix)), "a:1", timings=timings)) as a:
        await until_leader(a, 3)
        await a.publish_seq(1)
        async with EtcdClient([etcd.endpoint], timeout=1) as operator:
            await operator.revoke(a._lease)  # an operator revokes its lease: the key is gone
        assert a.is_leader(time.monotonic())  # its local view lags until the next renewal...
        with pytest.raises(NotLeader) as caught:
            await a.publish_seq(2)  # ...but etcd refuses the write
        assert caught.value.code == "fenced"
        assert not a.is_leader(time.monotonic())  # and it stepped down then and there


async def test_a_frozen_clock_jump_ends_leadership_before_any_write(etcd: EtcdServer, prefix: str) -> None:
    # The injected clock jumps past the deadline, as CLOCK_MONOTONIC does across a SIGSTOP.
    offset = 0.0

    def clock() -> float:
        return time.monotonic() + offset

    async with running(EtcdElection(parse_election_url(etcd.url(prefix)), "a:1", timings=Timings.of(TTL), clock=clock)) as a:
        await until_leader(a)
        assert a.is_leader(clock())
        offset = TTL  # the next look at the clock is past the deadline
        assert not a.is_leader(clock())
        with pytest.raises(NotLeader) as caught:
            await a.publish_seq(1)
        assert caught.value.code == "not_leader"
        with trio.fail_after(1):  # run steps down at once (its cancel scope's deadline is in the past now)
            while a.status.current.leader:
                await a.status.next(a.status.current.version)


async def test_etcd_dies_the_leader_steps_down_at_its_deadline_not_before(
    own_etcd: Callable[[], EtcdServer], prefix: str,
) -> None:
    etcd = own_etcd()
    timings = Timings.of(TTL)
    async with running(EtcdElection(parse_election_url(etcd.url(prefix)), "a:1", timings=timings)) as a:
        await until_leader(a)
        await trio.sleep(timings.renew_interval * 1.5)  # a renewal or two
        etcd.kill()
        killed = time.monotonic()
        deadline = a.deadline
        assert deadline is not None and deadline <= killed + TTL - timings.margin
        stepped_down = None
        with trio.fail_after(TTL + 1):
            while stepped_down is None:
                now = time.monotonic()
                if a.is_leader(now):
                    assert now < deadline  # never claims past the deadline
                elif not a.status.current.leader:
                    stepped_down = now
                await trio.sleep(0.01)
        assert a.deadline is None
        # It kept serving while the lease was safe, and published its step-down at the deadline (a sample late,
        # plus scheduling on a loaded machine; is_leader itself turned false on time, checked above).
        assert deadline - 0.05 <= stepped_down <= deadline + 0.5, (killed, deadline, stepped_down)
        with pytest.raises(NotLeader):
            await a.publish_seq(1)
