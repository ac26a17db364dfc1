"""A gateway's ``touch`` may say how long ago it read the activity (``ago``): the core stamps it that much earlier.

An edge batches its users' touches for up to ``touch_interval`` before they travel; without ``ago`` the core
stamped each at arrival, so every deadline moved later by the touch's wait at the edge (the *deadline shift*
the load tests print). The core takes ``ago`` at its word up to half a tick -- a later stamp is never early, and
capped so, a deadline never lands on a tick already judged -- and never moves a session's activity back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from idled.protocol import Attach, Touch, encode
from tests.peers import Harness, running


async def last_seen(h: Harness, *uids: str) -> dict[str, float]:
    observer = await h.observer()
    status = await observer.status_of(uids, last_seen=True)
    await observer.stream.aclose()
    assert status.last_seen is not None
    return {uid: status.last_seen[uid] for uid in uids}  # type: ignore[misc]


async def test_a_touch_is_stamped_ago_seconds_before_it_arrived_at_most_half_a_tick(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, tick=1.0, timeout=30.0) as h:
        gw = await h.gateway()
        await gw.send(Attach(("a", "b", "c"), 20.0))
        await trio.sleep(5.0)
        # One write: the core reads the three frames at the same moment.
        await gw.stream.send_all(encode(Touch(("a",), 0.3)) + encode(Touch(("b",))) + encode(Touch(("c",), 9.0)))
        await trio.sleep(0.01)
        seen = await last_seen(h, "a", "b", "c")
        assert seen["b"] - seen["a"] == pytest.approx(0.3, abs=1e-6)
        assert seen["b"] - seen["c"] == pytest.approx(0.5, abs=1e-6)  # capped: half of the 1 s tick


async def test_a_touch_older_than_the_sessions_attach_leaves_its_activity_where_it_was(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, tick=1.0, timeout=30.0) as h:
        gw = await h.gateway()
        await gw.stream.send_all(encode(Attach(("a", "b"), 20.0)) + encode(Touch(("a",), 0.4)))
        await trio.sleep(0.01)
        seen = await last_seen(h, "a", "b")
        assert seen["a"] == seen["b"]  # the attach's time: read before the attach, the touch adds nothing
