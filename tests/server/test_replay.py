"""Resuming a subscription: `subscribe from=<last seq + 1>` gets exactly the missed events, then live ones.

In-process server, memory-stream connections, real clock (replay reads the log in a worker thread; nothing
here waits on time except the writer catching up). Events are made by login + bye pairs, so no session is
left to expire mid-test. A second observer stays subscribed throughout and is the reference: the resumed
stream must equal its tail exactly -- same seqs, same fields, no gap and no duplicate at either seam (disk ->
memory window -> live). The disk path is forced by shrinking the in-memory window (`bus.RECENT_EVENTS`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio

import idled.server.engine.bus
from idled.protocol import Error, Event

from tests import peers


# Real clock (replay reads the log in a worker thread), no metrics (the server's NullMetrics), and no settling
# in connect(): one test keeps traffic going while it connects.
running = functools.partial(peers.running, timeout=30.0, metrics=False, recv_timeout=20.0, settle=False)


def seqs(events: list[Event]) -> list[int]:
    return [e.seq for e in events]


async def test_resume_from_the_memory_window(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        reference = await h.observer(name="reference")
        first = await h.observer()
        await h.traffic(5)
        seen = await first.drain()
        assert seqs(seen) == list(range(1, 11))
        await first.stream.aclose()
        await h.traffic(5)  # 11..20 while it is away
        resumed = await h.observer(from_seq=seen[-1].seq + 1)
        await h.traffic(2)  # 21..24 live
        got = await resumed.drain()
        assert seqs(got) == list(range(11, 25))
        assert got == (await reference.drain())[10:]
        assert h.server.bus.oldest_recent() == 1  # all of it was in the window


async def test_resume_from_disk_then_window_then_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idled.server.engine.bus, "RECENT_EVENTS", 8)
    async with running(tmp_path) as h:
        reference = await h.observer(name="reference")
        first = await h.observer()
        await h.traffic(3)
        seen = await first.drain()
        assert seqs(seen) == [1, 2, 3, 4, 5, 6]
        await first.stream.aclose()
        await h.traffic(30)  # 7..66: the window keeps only the last 8
        assert h.server.bus.oldest_recent() == 59
        resumed = await h.observer(from_seq=7)
        await h.traffic(3)  # 67..72 live
        got = await resumed.drain()
        expected = (await reference.drain())[6:]
        assert seqs(got) == list(range(7, 73))
        assert got == expected  # the frames replayed from disk equal the ones sent live


async def test_resume_while_events_keep_coming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seams under concurrent traffic: events published while the replay is being read from disk."""
    monkeypatch.setattr(idled.server.engine.bus, "RECENT_EVENTS", 16)
    async with running(tmp_path) as h:
        reference = await h.observer(name="reference")
        await h.traffic(40)  # 1..80
        stop = trio.Event()

        async def keep_busy() -> None:
            while not stop.is_set():
                await h.traffic(1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_busy)
            await trio.sleep(0.05)
            resumed = [await h.observer(from_seq=start, name=f"r{start}") for start in (3, 41, 80)]
            await trio.sleep(0.2)
            stop.set()
        everything = await reference.drain()
        assert seqs(everything) == list(range(1, h.next_seq))
        for peer, start in zip(resumed, (3, 41, 80)):
            got = await peer.drain()
            assert seqs(got) == list(range(start, h.next_seq)), f"from={start}"
            assert got == everything[start - 1 :]


async def test_resume_across_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idled.server.engine.bus, "RECENT_EVENTS", 4)
    async with running(tmp_path) as h:
        reference = await h.observer(name="reference")
        await h.traffic(6)  # 1..12
        before = await reference.drain()
    async with running(tmp_path) as h:
        assert h.next_seq == 13
        resumed = await h.observer(from_seq=10)
        await h.traffic(2)  # 13..16
        got = await resumed.drain()
        assert seqs(got) == list(range(10, 17))
        assert got[:3] == before[9:]  # 10..12 come from the previous run's log, unchanged
        everything = await (await h.observer(from_seq=1, name="all")).drain()
        assert seqs(everything) == list(range(1, 17))


async def test_from_the_next_seq_is_live_only(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.traffic(2)
        observer = await h.observer(from_seq=h.next_seq)
        await h.traffic(1)
        assert seqs(await observer.drain()) == [5, 6]


async def test_from_older_than_retention_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idled.server.engine.bus, "RECENT_EVENTS", 8)
    async with running(tmp_path, segment_bytes=4096, retention_bytes=4096) as h:
        await h.traffic(60)  # ~18 KB of records in 4 KiB segments: the oldest are deleted
        with trio.fail_after(10):
            while h.server.log.last_seq < 120:
                await trio.sleep(0.01)
        oldest = h.server.log.oldest_seq()
        assert oldest is not None and oldest > 1
        peer = await h.observer(from_seq=1, name="from-1")
        error = await peer.recv()
        assert isinstance(error, Error) and error.code == "gone", error
        assert await peer.recv() is None
        # the oldest still available: the log's, or the memory window's if that reaches further back
        available = int(error.reason.rsplit(" ", 1)[1])
        assert available == min(oldest, h.server.bus.oldest_recent() or oldest)
        peer = await h.observer(from_seq=available - 1, name="just-too-old")
        error = await peer.recv()
        assert isinstance(error, Error) and error.code == "gone", error
        assert f"seq {available - 1} is no longer retained" in error.reason
        peer = await h.observer(from_seq=available, name="ok")
        assert seqs(await peer.drain()) == list(range(available, 121))
