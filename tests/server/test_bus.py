"""The event bus when the log writer is gone (a fatal log error is ending the daemon)."""

from __future__ import annotations

import time

from idled.core.factory import make_detector
from idled.core.presence import PresenceEvent, PresenceTable
from idled.server.bus import EventBus


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
