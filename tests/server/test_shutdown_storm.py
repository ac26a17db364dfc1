"""SIGTERM in the middle of a login storm, `idled serve --workers 2` (issue 24, item 6).

Real processes: the core, its two `idled edge` children, and 5,000 users logging in over loopback as fast as
they can. Once 1,500 (or 3,000) are welcomed -- 1.5-3 s into the storm -- the daemon gets SIGTERM. Shutdown ends the sessions in chunks while the
edges keep attaching; the core refuses each attach from then on (server_shutdown), which drops that edge's
link. Once, each such drop ended the edge's remaining sessions as `gateway_lost` (1,280-2,682 of them in 4 of
5 runs) and, as shutdown stamped every chunk with the time it began, 3-10 events carried a `ts` earlier
than the event before them. The log must show every session ending `shutdown`, and `ts` never going back.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.log.eventlog import iter_records
from tests import peers

pytestmark = pytest.mark.slow  # real `idled serve --workers 2`, thousands of real connections

USERS = 5_000
CONCURRENCY = 200  # logins in flight at once
GONE = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, AssertionError)


async def storm(port: int, clients: list[peers.Client], stopped: Callable[[], bool]) -> None:
    """Log USERS users in, CONCURRENCY at a time, keeping every connection; stops at the first refusal
    once ``stopped()``."""
    limit = trio.Semaphore(CONCURRENCY)

    async def one(uid: str) -> None:
        try:
            clients.append(await peers.Client.login(port, "uid", uid, keepalive=60, recv_timeout=10))
        except GONE:
            if not stopped():
                raise
        finally:
            limit.release()

    async with trio.open_nursery() as nursery:
        for i in range(USERS):
            await limit.acquire()
            if stopped():
                limit.release()
                break
            nursery.start_soon(one, f"s{i}")


@pytest.mark.parametrize("welcomed", [1_500, 3_000])
async def test_sigterm_mid_login_storm_logs_every_session_shutdown(tmp_path: Path, welcomed: int) -> None:
    data_dir = tmp_path / "data"
    command = peers.serve_command(data_dir, "--workers", "2", "--fsync", "never", "--max-connections", "20000")
    daemon = peers.Daemon(command, tmp_path / "idled.stderr", timeout=30.0)
    clients: list[peers.Client] = []
    signalled = False
    try:
        port = await daemon.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(storm, port, clients, lambda: signalled)
            with trio.fail_after(30):
                while len(clients) < welcomed:
                    await trio.sleep(0.01)
            daemon.proc.send_signal(signal.SIGTERM)
            signalled = True
        assert await daemon.wait(timeout=60) == 0
    finally:
        daemon.kill()
        for client in clients:
            stream = client.stream
            assert isinstance(stream, trio.SocketStream)
            stream.socket.close()  # (the daemon is gone: nothing to say goodbye to)
    records: list[dict[str, Any]] = list(iter_records(data_dir))
    stderr = daemon.stderr()
    online = [r for r in records if r["kind"] == "online"]
    offline = [r for r in records if r["kind"] == "offline"]
    backwards = [(a["seq"], b["seq"]) for a, b in itertools.pairwise(records) if b["ts"] < a["ts"]]
    print(f"{len(clients)} users welcomed, {len(online)} logged online; offline reasons:",
          {reason: sum(r["reason"] == reason for r in offline) for reason in {r["reason"] for r in offline}},
          f"; ts going back at {len(backwards)} events")
    assert welcomed <= len(online) < USERS, stderr[-3000:]  # the SIGTERM came mid-storm
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    # every session that began ended, once, and at shutdown's hand
    assert sorted(r["uid"] for r in offline) == sorted(r["uid"] for r in online)
    assert {r["reason"] for r in offline} == {"shutdown"}, stderr[-3000:]
    assert not backwards
    assert "Traceback" not in stderr
