"""The interface's parts with no etcd: `StatusBoard` (latest value, no queue) and `NoElection`."""

from __future__ import annotations

import pytest
import trio

from idled.server.election import Election, ManualElection, NoElection, NotLeader, Status, StatusBoard


async def test_status_board_gives_the_newest_and_skips_no_change() -> None:
    board = StatusBoard(Status(0, False, None, 0, "start"))
    assert board.set(leader=False, address=None, term=0, reason="same state, other words").version == 0
    board.set(leader=False, address="a:1", term=0, reason="following")
    board.set(leader=True, address="me:1", term=7, reason="elected")
    newest = await board.next(0)  # a slow reader sees the newest, not each step
    assert (newest.version, newest.leader, newest.term) == (2, True, 7)

    async def later() -> None:
        await trio.sleep(0.01)
        board.set(leader=False, address=None, term=0, reason="lost")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        with trio.fail_after(5):
            assert (await board.next(2)).reason == "lost"


async def test_no_election_is_the_only_core_until_it_resigns() -> None:
    election: Election = NoElection("127.0.0.1:7878")
    async with trio.open_nursery() as nursery:
        await nursery.start(election.run)
        assert election.is_leader(0.0) and election.leader() == "127.0.0.1:7878"
        await election.publish_seq(5)
        assert await election.last_seq() == 5
        with pytest.raises(ValueError):
            await election.publish_seq(4)
        await election.resign()  # run returns
    assert not election.is_leader(0.0) and election.status.current.leader is False
    with pytest.raises(NotLeader) as caught:
        await election.publish_seq(6)
    assert caught.value.code == "not_leader"


async def test_a_manual_election_follows_until_promoted_then_leads_for_good() -> None:
    election: Election = ManualElection("10.0.0.1:7878")
    async with trio.open_nursery() as nursery:
        await nursery.start(election.run)
        assert not election.is_leader(0.0) and election.leader() == "10.0.0.1:7878"
        with pytest.raises(NotLeader):
            await election.publish_seq(5)
        assert isinstance(election, ManualElection) and election.promote() and not election.promote()
        status = await election.status.next(0)
        assert (status.leader, status.reason) == (True, "promoted by hand")
        assert election.is_leader(0.0)
        await election.publish_seq(5)
        await election.publish_seq(3, lower=True)  # a clean stop lowers the mark
        assert await election.last_seq() == 3
        await election.resign()
    assert not election.is_leader(0.0)
