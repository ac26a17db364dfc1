"""The event bus when the log writer is gone (a fatal log error is ending the daemon)."""

from __future__ import annotations

import time

import pytest

from idled.core.factory import make_detector
from idled.core.presence import PresenceEvent, PresenceTable
from idled.server.engine.bus import EventBus, Subscription


class Owner:
    def release(self, uid: object, code: object, reason: str) -> None:
        pass


def test_publish_after_the_writer_stopped_does_not_raise_and_still_reaches_observers() -> None:
    seen: list[PresenceEvent] = []
    bus = EventBus(on_event=seen.append)
    bus.start(1)
    presence = PresenceTable(make_detector("ring-lazy", timeout=300, slots=64), tick=0.1, timeout=30.0,
                             max_timeout=60.0, detector_name="ring-lazy", first_seq=1)
    bus.log_receive.close()  # what the writer's exit does to the channel
    owner = Owner()
    for uid in ("a", "b"):
        _, event = presence.login(uid, owner, 1.0, time.time())
        assert event is not None
        bus.publish(event)  # raised trio.BrokenResourceError (a "bug" traceback in the user plane) before
    assert [e.uid for e in seen] == ["a", "b"]
    assert len(bus.frames(1, 3, 1 << 20)) == 2  # still in the window live observers read


def record(seq: int) -> dict[str, object]:
    return {"seq": seq, "kind": "online", "uid": f"u{seq}", "ts": 1.0, "reason": "login", "last_seen": None,
            "deadline": None}


def test_sync_standby_holds_the_durable_watermark_not_the_feed() -> None:
    bus = EventBus()
    bus.start(1)
    durable, feed = Subscription(), Subscription()
    bus.subscribe(durable, 1, durable=True)
    bus.subscribe(feed, 1, feed=True)
    for seq in range(1, 31):
        bus.relay(record(seq))
    bus.durable_to(10)
    assert bus.durable_seq == bus.log_durable_seq == 10  # no sync standby: the log's, at once
    bus.sync_to(4)  # a standby attaches having acknowledged less: the watermark never moves back
    assert bus.durable_seq == 10
    bus.durable_to(20)
    assert bus.durable_seq == 10 and bus.log_durable_seq == 20
    assert bus.limit(durable) == 11  # durable observers: up to what the standby acknowledged (or before)
    assert bus.limit(feed) == 21  # the feed sends what this disk holds: it cannot wait for acks of it
    bus.sync_to(15)
    assert bus.durable_seq == 15
    bus.sync_to(25)  # an ack never passes the log's own durability
    assert bus.durable_seq == 20
    bus.durable_to(30)
    assert bus.durable_seq == 25
    bus.sync_to(None)  # the standby is lost: back to the log's at once
    assert bus.durable_seq == 30


def test_undelivered_counts_what_waits_for_the_sync_standby() -> None:
    bus = EventBus()
    bus.start(1)
    durable = Subscription()
    bus.subscribe(durable, 1, durable=True)
    for seq in range(1, 6):
        bus.relay(record(seq))
    bus.sync_to(0)
    bus.durable_to(5)
    assert bus.limit(durable) == 1  # nothing acknowledged: nothing may be sent yet
    assert bus.undelivered() == 5  # but a clean stop waits for them


def test_watched_frames_across_pages_and_the_uid_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filtered replay from the window reads frames from sealed pages and from the open one, uids decoded
    below ``uids_from`` and from the ring above it, each frame under its own seq."""
    import idled.server.engine.bus as bus_module
    from idled.server.engine.bus import event_frame

    monkeypatch.setattr(bus_module, "RECENT_EVENTS", 64)  # pages of 8 frames
    bus = EventBus()
    bus.start(1)

    def uid_record(seq: int) -> dict[str, object]:
        return {**record(seq), "uid": f"u{seq % 3}"}

    for seq in range(1, 31):
        bus.relay(uid_record(seq))
    watcher = Subscription()
    bus.watch(watcher, ["u1"])
    bus.subscribe(watcher, 1)
    assert bus.uids_from == 31
    for seq in range(31, 45):
        bus.relay(uid_record(seq))
    frames, resume = bus.watched_frames(3, 45, 1 << 20, 1000, {"u1"})
    assert resume == 45
    assert frames == [event_frame(uid_record(seq)) for seq in range(3, 45) if seq % 3 == 1]
    frames, resume = bus.watched_frames(3, 45, 1, 1000, {"u2"})  # stops at the first frame over max_bytes
    assert frames == [event_frame(uid_record(5))] and resume == 6
