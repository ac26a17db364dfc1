"""SeqBlocks (idled.server.engine.seqs): an extension racing the final mark of a clean stop."""

from __future__ import annotations

from pathlib import Path

import trio

from idled.core.factory import make_detector
from idled.core.presence import PresenceTable
from idled.log.seqs import SEQ_BLOCK, SEQ_HEADROOM, SeqReservation
from idled.server.engine.seqs import SeqBlocks


def table(first_seq: int) -> PresenceTable:
    detector = make_detector("ring-lazy", timeout=10, slots=64)
    return PresenceTable(detector, tick=1.0, timeout=10.0, max_timeout=100.0, detector_name="ring-lazy", first_seq=first_seq)


async def test_extend_and_finish_together_leave_the_final_mark(tmp_path: Path) -> None:
    # Each round is one run of a server: start (reserve the first block), issue seqs up to where the monitor
    # extends, and stop cleanly with that extension still on its way. The next run must start right after the
    # last seq (no gap) from a mark it can read. Unordered, the extension landed after the final mark (a gap
    # of a block) or the two threads corrupted the file (the next start failed).
    reservation = SeqReservation(tmp_path)
    next_seq = 1
    for _ in range(200):
        blocks = SeqBlocks(reservation)
        first = await blocks.start(next_seq)
        assert first == next_seq  # the last run's clean stop left no gap
        presence = table(blocks.reserved - SEQ_BLOCK // 4)  # past half the block: the monitor extends now
        async with trio.open_nursery() as nursery:
            blocks.extend_ahead(presence, nursery)
            nursery.start_soon(blocks.finish, presence.next_seq - 1)
        assert reservation.load() == presence.next_seq - 1
        next_seq = presence.next_seq


async def test_no_extension_after_finish(tmp_path: Path) -> None:
    blocks = SeqBlocks(SeqReservation(tmp_path))
    await blocks.start(1)
    presence = table(blocks.reserved - 10)
    await blocks.finish(presence.next_seq - 1)
    async with trio.open_nursery() as nursery:
        blocks.extend_ahead(presence, nursery)  # the monitor still runs during the rest of the shutdown
    assert blocks.reservation.load() == presence.next_seq - 1


async def test_headroom_extends_when_nobody_else_does(tmp_path: Path) -> None:
    # A burst before the monitor runs (the restart records at start) reserves as it goes, instead of waiting
    # for an extension that nothing would start.
    blocks = SeqBlocks(SeqReservation(tmp_path))
    await blocks.start(1)
    presence = table(blocks.reserved - SEQ_HEADROOM + 1)
    with trio.fail_after(10):
        await blocks.headroom(presence)
    assert blocks.reserved == presence.next_seq + SEQ_BLOCK
    assert blocks.reservation.load() == blocks.reserved
