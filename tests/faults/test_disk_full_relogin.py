"""A user online logs in again while the disk is full (a real daemon, a small tmpfs): taken, no false offline.

The security review's case: a user online and pinging reconnects (a phone changing networks: a new connection,
a new login of the same uid) while the daemon runs degraded. That login adds no event -- newest wins without an
offline/online pair -- and neither does a second device of a user online (events are per user) nor a user back
within its offline grace. Refused with ``unavailable``, the user would go offline once its old connection
closed (or reached its deadline): a false offline. So they are welcomed -- directly at the core, and through an
edge in front of it (the core's gateway path decides) -- the old connection is told ``kicked``, and no event is
added; a user who is not online is still refused ``unavailable``. After the disk has room again, the log shows
each of them online once, from before the disk filled, until the shutdown.

The data directory is a tmpfs (root only: skipped, with the reason, where mounting is not permitted).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import Error, ErrorCode, Event, Login, Subscribe, Welcome
from tests import peers
from tests.faults.test_disk_full import (
    KEEPALIVE, LEFT_FREE, Pinger, assert_gap_free, churn_until_refused, fill, http, login, until_ready, watching,
)
from tests.peers import Client, Daemon, free_port, scrape, serve_command

pytestmark = pytest.mark.slow

GRACE = "60"  # --offline-grace: longer than the test, so a user in grace stays in it


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with peers.small_tmpfs(tmp_path, "2m") as mount_point:
        yield mount_point


async def welcomed(port: int, uid: str, device: str | None = None) -> Pinger:
    """A user login that must be welcomed; its session kept alive from now on (start ``run``)."""
    client = await Client.connect(port)
    await client.send(Login("uid", uid, None, KEEPALIVE, device=device))
    answer = await client.recv()
    assert isinstance(answer, Welcome), (uid, device, answer)
    return Pinger(client)


async def until_in_grace(metrics: int, users: int) -> None:
    """Until the core counts ``users`` users online, one of them only by its grace (one session fewer)."""
    with trio.fail_after(10):
        while (await trio.to_thread.run_sync(scrape, metrics, "idled_users_online"),
               await trio.to_thread.run_sync(scrape, metrics, "idled_sessions_online")) != (users, users - 1):
            await trio.sleep(0.1)


async def held(metrics: int) -> int:
    return int(json.loads((await trio.to_thread.run_sync(http, metrics, "/status"))[1])["events_held"])


async def keep(nursery: trio.Nursery, pinger: Pinger) -> Pinger:
    nursery.start_soon(pinger.run)
    return pinger


async def all_answered(pingers: list[Pinger]) -> None:
    """Past every deadline a dropped or refused session would have had: each one's pings still answered."""
    before = [p.pongs for p in pingers]
    await trio.sleep(2 * KEEPALIVE)
    assert all(p.pongs > b + 3 for p, b in zip(pingers, before)), [p.pongs - b for p, b in zip(pingers, before)]


def their_records(data: Path, *uids: str) -> dict[str, list[tuple[str, str]]]:
    records = list(iter_records(data))
    assert_gap_free(records)
    return {uid: [(r["kind"], r["reason"]) for r in records if r["uid"] == uid] for uid in uids}


ONLINE_UNTIL_SHUTDOWN = [("online", "login"), ("offline", "shutdown")]


async def test_a_user_online_who_logs_in_again_while_the_disk_is_full_is_welcomed(
    tmp_path: Path, small_disk: Path
) -> None:
    data, metrics = small_disk / "data", free_port()
    command = serve_command(data, "--metrics-port", str(metrics), "--fsync", "always", "--tick", "0.1",
                            "--offline-grace", GRACE)
    async with Daemon(command, tmp_path / "stderr") as daemon, trio.open_nursery() as nursery:
        observer = await Client.login(daemon.port, "observer", "dashboard")
        await observer.send(Subscribe(None))  # live: it sees events as they are published, written or not
        seen: list[Event] = []
        nursery.start_soon(watching, observer, seen)
        mover = await keep(nursery, await welcomed(daemon.port, "mover"))
        multi = await keep(nursery, await welcomed(daemon.port, "multi"))
        client, answer = await login(daemon.port, "returning")
        assert isinstance(answer, Welcome), answer
        await client.stream.aclose()  # closed without bye: online for the grace, no event yet
        await until_in_grace(metrics, 3)

        filler = fill(small_disk, LEFT_FREE)
        await churn_until_refused(daemon.port)
        await until_ready(metrics, 503)
        events_held = await held(metrics)

        # The phone changes networks: a new connection logs the same uid in; the old one is kicked.
        await mover.stop()
        moved = await keep(nursery, await welcomed(daemon.port, "mover"))
        assert await mover.client.expect_error(ErrorCode.KICKED)
        phone = await keep(nursery, await welcomed(daemon.port, "multi", device="phone"))  # a second device
        back = await keep(nursery, await welcomed(daemon.port, "returning"))  # back within the grace
        client, answer = await login(daemon.port, "newcomer")  # it would come online: refused
        assert isinstance(answer, Error) and answer.code == ErrorCode.UNAVAILABLE, answer
        await client.stream.aclose()

        await all_answered([moved, multi, phone, back])
        assert await held(metrics) == events_held  # the logins added nothing to what waits for the disk
        assert [(e.uid, e.kind) for e in seen if e.uid in ("mover", "multi", "returning")] == [
            ("mover", "online"), ("multi", "online"), ("returning", "online")]  # from before: none since
        assert (await trio.to_thread.run_sync(http, metrics, "/readyz"))[0] == 503  # still degraded meanwhile

        filler.unlink()
        await until_ready(metrics, 200)
        for pinger in (moved, multi, phone, back):
            await pinger.stop()
        assert await daemon.stop() == 0
        nursery.cancel_scope.cancel()
    assert their_records(data, "mover", "multi", "returning", "newcomer") == {
        "mover": ONLINE_UNTIL_SHUTDOWN, "multi": ONLINE_UNTIL_SHUTDOWN, "returning": ONLINE_UNTIL_SHUTDOWN,
        "newcomer": []}


async def test_through_an_edge_a_user_online_who_logs_in_again_while_the_core_disk_is_full_is_welcomed(
    tmp_path: Path, small_disk: Path
) -> None:
    data, metrics = small_disk / "data", free_port()
    core = serve_command(data, "--metrics-port", str(metrics), "--fsync", "always", "--tick", "0.1",
                         "--offline-grace", GRACE)
    edge = [sys.executable, "-m", "idled.cli.main", "edge", "--port", "0"]
    async with Daemon(core, tmp_path / "core.stderr") as c, \
            Daemon([*edge, "--core", f"127.0.0.1:{c.port}"], tmp_path / "edge.stderr") as e, \
            trio.open_nursery() as nursery:
        direct = await keep(nursery, await welcomed(c.port, "direct"))  # moves from the core to the edge
        roamer = await keep(nursery, await welcomed(e.port, "roamer"))  # reconnects through the same edge
        multi = await keep(nursery, await welcomed(e.port, "multi"))  # gets a second device through the edge
        client, answer = await login(e.port, "returning")
        assert isinstance(answer, Welcome), answer
        await client.stream.aclose()  # the edge detaches it "closed": in grace at the core
        await until_in_grace(metrics, 4)

        filler = fill(small_disk, LEFT_FREE)
        await churn_until_refused(c.port)
        await until_ready(metrics, 503)
        events_held = await held(metrics)

        taken: list[Pinger] = []
        for old, uid in ((direct, "direct"), (roamer, "roamer")):
            await old.stop()
            taken.append(await keep(nursery, await welcomed(e.port, uid)))
            assert await old.client.expect_error(ErrorCode.KICKED)
        taken.append(await keep(nursery, await welcomed(e.port, "multi", device="phone")))
        taken.append(await keep(nursery, await welcomed(e.port, "returning")))
        client, answer = await login(e.port, "newcomer")  # the core refuses its attach: the edge tells it
        assert isinstance(answer, Error) and answer.code == ErrorCode.UNAVAILABLE, answer

        await all_answered([*taken, multi])  # none closed after its welcome (an ``ended unavailable``)
        assert await held(metrics) == events_held

        filler.unlink()
        await until_ready(metrics, 200)
        for pinger in (*taken, multi):
            await pinger.stop()
        assert await c.stop() == 0
        nursery.cancel_scope.cancel()
    uids = ("direct", "roamer", "multi", "returning")
    records: dict[str, Any] = their_records(data, *uids, "newcomer")
    assert records == {**{uid: ONLINE_UNTIL_SHUTDOWN for uid in uids}, "newcomer": []}
