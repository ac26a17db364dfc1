"""The edge's touch ages (idled.server.edge.touches): floored, capped at what the core applies, grouped by age."""

from __future__ import annotations

from idled.client.core import GatewayBatcher
from idled.protocol import FrameDecoder, Touch
from idled.server.edge.touches import AGE_STEP, TOUCH_CLOCK, fold


def frames(batch: GatewayBatcher) -> list[Touch]:
    decoder = FrameDecoder(1 << 20)
    decoder.receive_data(b"".join(batch.take()))
    messages = []
    while type(message := decoder.next_event()) is Touch:
        messages.append(message)
    return messages


def test_ages_are_floored_to_the_step_grouped_oldest_first_and_capped_at_what_the_core_applies() -> None:
    now = TOUCH_CLOCK()
    batch = GatewayBatcher()
    # (3.9 steps old -> 3: younger than it is, never older; 40 s and 2 s old -> the core's 0.5 s, one frame)
    fold({"a": now - 3.9 * AGE_STEP, "b": now - 40.0, "c": now, "d": now - 2.0}, batch, 0.5)
    touches = frames(batch)
    assert touches[0] == Touch(("b", "d"), 0.5)
    ages = {uid: m.ago for m in touches for uid in m.uids}
    assert ages["a"] in (0.03, 0.04) and ages["a"] <= TOUCH_CLOCK() - (now - 3.9 * AGE_STEP)
    assert ages["c"] <= TOUCH_CLOCK() - now
    assert [m.ago for m in touches] == sorted((m.ago for m in touches), reverse=True)


def test_a_core_that_takes_no_ages_gets_plain_touches() -> None:
    batch = GatewayBatcher()
    fold({"a": TOUCH_CLOCK() - 1.0, "b": TOUCH_CLOCK()}, batch, None)
    assert frames(batch) == [Touch(("a", "b"))]
