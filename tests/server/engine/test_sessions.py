"""Sessions' bursts that are nobody's connection: the restart records at start, and shutdown's end_all.

Both go a chunk at a time through ``room()``: the writer's backlog stays near its limit however many sessions
there are, no seq is issued past the durable reservation (the burst extends it as it goes), and each chunk
is stamped with the time it is made. A slow writer stands in for the disk here, with the limits shrunk so
that a few thousand sessions cross them many times.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.core.factory import make_detector
from idled.core.presence import PresenceEvent, PresenceTable
from idled.log.seqs import SeqReservation
from idled.server.engine import bus as bus_module
from idled.server.engine import seqs as seqs_module
from idled.server.engine.bus import EventBus
from idled.server.engine.seqs import SeqBlocks
from idled.server.engine.sessions import Sessions
from idled.server.runtime.clock import Clock

SESSIONS = 5_000
BACKLOG = 300  # LOG_BACKLOG_LIMIT, shrunk
BLOCK, HEADROOM = 1_000, 200  # SEQ_BLOCK and SEQ_HEADROOM, shrunk: the burst crosses several blocks


class Owner:
    def __init__(self) -> None:
        self.told: list[tuple[Any, str]] = []

    def release(self, uid: Any, code: str, reason: str) -> None:
        self.told.append((uid, code))


class Witness:
    """The bus's on_event: checks every event against the limits as it is published."""

    def __init__(self, tmp_path: Path) -> None:
        self.events: list[PresenceEvent] = []
        self.largest_backlog = 0
        self.beyond_reserved: list[int] = []
        self.bus = EventBus(on_event=self.on_event)
        self.blocks = SeqBlocks(SeqReservation(tmp_path))

    def on_event(self, event: PresenceEvent) -> None:
        self.events.append(event)
        self.largest_backlog = max(self.largest_backlog, self.bus.backlog())
        if event.seq > self.blocks.reservation.load():  # the durable mark, read from the file
            self.beyond_reserved.append(event.seq)


@pytest.fixture(autouse=True)
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bus_module, "LOG_BACKLOG_LIMIT", BACKLOG)
    monkeypatch.setattr(seqs_module, "SEQ_BLOCK", BLOCK)
    monkeypatch.setattr(seqs_module, "SEQ_HEADROOM", HEADROOM)


async def slow_writer(bus: EventBus) -> None:
    """Takes 50 records every 2 ms, until the channel closes."""
    while True:
        for _ in range(50):
            try:
                await bus.log_receive.receive()
            except trio.EndOfChannel:
                return
        await trio.sleep(0.002)


async def sessions_for(witness: Witness) -> Sessions:
    first = await witness.blocks.start(1)
    detector = make_detector("ring-lazy", timeout=300, slots=64)
    presence = PresenceTable(detector, tick=0.1, timeout=30.0, max_timeout=60.0, detector_name="ring-lazy",
                             first_seq=first)
    clock = Clock(stall_limit=5.0)
    clock.start()
    return Sessions(presence, witness.bus, clock, witness.blocks)


async def test_restart_records_are_bounded_and_reserved(tmp_path: Path) -> None:
    witness = Witness(tmp_path)
    sessions = await sessions_for(witness)
    records = ({"kind": "online", "uid": i, "seq": i + 1, "last_seen": 100.0, "timeout": 30.0} for i in range(SESSIONS))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_writer, witness.bus)
        assert await sessions.end_recovered(records) == SESSIONS
        witness.bus.close_log()
    assert [e.seq for e in witness.events] == list(range(1, SESSIONS + 1))
    assert {(e.kind, e.reason) for e in witness.events} == {("offline", "restart")}
    assert {e.uid for e in witness.events} == set(range(SESSIONS))
    assert witness.largest_backlog <= BACKLOG + 128  # at most one chunk past the limit
    assert not witness.beyond_reserved  # the burst reserved as it went (no monitor runs before listening)
    stamps = [e.ts for e in witness.events]
    assert stamps == sorted(stamps) and stamps[-1] > stamps[0]  # a chunk at a time, each at its own time


async def test_shutdown_is_bounded_and_reserved_and_stamped_per_chunk(tmp_path: Path) -> None:
    witness = Witness(tmp_path)
    sessions = await sessions_for(witness)
    owner = Owner()
    now, wall = sessions.clock.now(), time.time()
    for uid in range(SESSIONS):
        _, event = sessions.presence.login(uid, owner, now, wall)
        assert event is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_writer, witness.bus)
        assert await sessions.end_all("shutdown", "server_shutdown", "server is shutting down") == SESSIONS
        witness.bus.close_log()
    assert len(sessions.presence) == 0
    assert [e.seq for e in witness.events] == list(range(SESSIONS + 1, 2 * SESSIONS + 1))
    assert {(e.kind, e.reason) for e in witness.events} == {("offline", "shutdown")}
    assert sorted(uid for uid, _ in owner.told) == list(range(SESSIONS))
    assert witness.largest_backlog <= BACKLOG + 128
    assert not witness.beyond_reserved  # (the logins above ran past the first block: the shutdown extended it)
    stamps = [e.ts for e in witness.events]
    assert stamps == sorted(stamps) and stamps[-1] > stamps[0]
