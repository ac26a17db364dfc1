"""A daemon whose open-file limit is smaller than --max-connections (the operator's report: `prlimit
--nofile=600:600 idled serve --max-connections 5000` dropped every user when the log rolled to a new segment).

A real `idled serve` under `prlimit`: the limit is capped to the descriptor budget with one warning, excess
connections get `busy` at once (not a hang in the backlog), the log keeps rolling segments, and the users
already in keep getting pongs.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
import trio

from idled.log.eventlog import iter_records, list_segments
from idled.ops.fdbudget import RESERVE
from idled.protocol import BYE, PING, PONG, Error, Login, Welcome
from tests.peers import Client, Daemon

pytestmark = pytest.mark.slow

NOFILE = 200
BUDGET = NOFILE - RESERVE - 1  # one listener
EXTRA = 25  # clients beyond the budget


def start(tmp_path: Path, config: Path) -> Daemon:
    command = ["prlimit", f"--nofile={NOFILE}:{NOFILE}", sys.executable, "-m", "idled.cli.main", "serve",
               "--config", str(config), "--port", "0", "--metrics-port", "0", "--data-dir", str(tmp_path / "data"),
               "--segment-bytes", "4096", "--timeout", "60", "--fsync", "never"]
    return Daemon(command, tmp_path / "stderr", timeout=30)


async def attempt(port: int, uid: str) -> tuple[Client | None, object, float]:
    """Connect and log in: (the client if welcomed, the reply, seconds until it came)."""
    started = time.perf_counter()
    client = await Client.connect(port, recv_timeout=5.0, reset_is_eof=True)
    await client.send(Login("uid", uid, None, None))
    reply = await client.recv()
    seconds = time.perf_counter() - started
    if isinstance(reply, Welcome):
        return client, reply, seconds
    await client.stream.aclose()
    return None, reply, seconds


async def test_connections_past_the_descriptor_budget_are_refused_and_nobody_is_dropped(tmp_path: Path) -> None:
    config = tmp_path / "idled.toml"
    config.write_text("max_connections = 5000\n")
    daemon = start(tmp_path, config)
    users: list[Client] = []
    try:
        port = await daemon.started()
        outcomes: list[tuple[Client | None, object, float]] = []
        limiter = trio.CapacityLimiter(20)

        async def one(i: int) -> None:
            async with limiter:
                outcomes.append(await attempt(port, f"u{i}"))

        async with trio.open_nursery() as nursery:
            for i in range(BUDGET + EXTRA):
                nursery.start_soon(one, i)
        users = [client for client, _, _ in outcomes if client is not None]
        refused = [reply for client, reply, _ in outcomes if client is None]
        assert len(users) == BUDGET
        assert len(refused) == EXTRA and all(isinstance(r, Error) and r.code == "busy" for r in refused), refused
        assert max(seconds for _, _, seconds in outcomes) < 3.0  # answered, not left hanging in the backlog

        # Churn at the budget: users leave, others take their places, the log rolls 4 KiB segments meanwhile.
        segments = len(list_segments(tmp_path / "data"))
        for client in users[:EXTRA]:
            await client.send(BYE)
            assert await client.recv() is None
        del users[:EXTRA]
        first = len(outcomes)
        async with trio.open_nursery() as nursery:
            for i in range(EXTRA):
                nursery.start_soon(one, BUDGET + EXTRA + i)
        users += [client for client, _, _ in outcomes[first:] if client is not None]
        assert len(users) == BUDGET
        over, reply, _ = await attempt(port, "one-too-many")
        assert over is None and isinstance(reply, Error) and reply.code == "busy"
        for client in users:
            await client.send(PING)
        assert [await client.recv() for client in users] == [PONG] * len(users)
        assert daemon.proc.poll() is None
        await trio.sleep(1.5)  # the writer's next batch (fsync never: written as they come, in 4 KiB segments)
        assert len(list_segments(tmp_path / "data")) > segments

        # A reload to another max_connections above the budget is capped too, with the same one line.
        config.write_text("max_connections = 4000\n")
        daemon.proc.send_signal(signal.SIGHUP)
        with trio.fail_after(10):
            while "SIGHUP: reloaded" not in daemon.stderr():
                await trio.sleep(0.05)
    finally:
        for client in users:
            await client.stream.aclose()
        status = await daemon.stop() if daemon.proc.poll() is None else daemon.proc.returncode
        daemon.kill()
    assert status == 0
    stderr = daemon.stderr()
    assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
    warnings = [line for line in stderr.splitlines() if "WARNING" in line]
    math = f"(open-file limit {NOFILE} - reserve {RESERVE} - 1 listener(s) = {BUDGET} connections): capped to {BUDGET}"
    assert len(warnings) == 2, stderr
    assert f"max_connections 5000 is more than the descriptors allow {math}" in warnings[0]
    assert f"max_connections 4000 is more than the descriptors allow {math}" in warnings[1]
    logins = [r for r in iter_records(tmp_path / "data") if r["kind"] == "online"]
    assert len(logins) == BUDGET + EXTRA  # every welcomed user is in the log, no refused one
