"""One address cannot lock everyone else out of the client port (idled.door.gate: a share per source address of
the connections that have not logged in yet).

The attacker (tests/door/flooder.py, a process of its own) holds 1,000 connections from 127.0.0.1 that never
log in, re-opened the moment the server closes them, against a daemon limited to 1,200 connections. Before the
door's share they held 1,000 of the 1,200 slots for the whole login deadline, and legitimate logins from other
addresses were refused ``busy``. Now 1,000 legitimate logins from 127.0.0.2-5 must get in: at least 99 %, with
a login p99 (connect to welcome) of 100 ms at most. The figures are printed (``-s``) for the record, with the
daemon's CPU and the flooder's: the flooder runs at the lowest CPU priority, because in the field the
attacker's CPU is another machine's -- on two shared cores, an attacker process spinning at full priority
would measure the measuring client's starvation, not the daemon.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import trio

from idled.protocol import Login, Welcome
from tests.door.flooder import connect_from
from tests.peers import Client, Daemon, serve_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FLOOD = 1000
LEGIT = 1000
SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def test_one_address_flooding_the_login_step_does_not_lock_others_out(tmp_path: Path) -> None:
    command = serve_command(tmp_path / "data", "--max-connections", "1200",
                            "--metrics-port", "0", "--login-timeout", "5")
    async with Daemon(command, tmp_path / "serve.stderr") as daemon:
        flooder = subprocess.Popen([sys.executable, "-m", "tests.door.flooder", str(daemon.port), str(FLOOD),
                                    "127.0.0.1", "60"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            await trio.sleep(3.0)  # the flood is up: every one of its connections opened at least once
            assert flooder.poll() is None
            server, flood = psutil.Process(daemon.proc.pid), psutil.Process(flooder.pid)
            cpu0, flood0, t0 = server.cpu_times(), flood.cpu_times(), time.monotonic()
            latencies: list[float] = []
            failures: list[str] = []
            held: list[Client] = []
            todo = iter(range(LEGIT))

            async def worker(source: str) -> None:
                for i in todo:
                    started = trio.current_time()
                    try:
                        client = Client(await connect_from(source, daemon.port), recv_timeout=5.0)
                        await client.send(Login("uid", f"user-{i}"))
                        answer = await client.recv()
                    except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
                        failures.append(repr(exc))
                        continue
                    if isinstance(answer, Welcome):
                        latencies.append(trio.current_time() - started)
                        held.append(client)  # they stay logged in: the room they take is real
                    else:
                        failures.append(repr(answer))

            async with trio.open_nursery() as nursery:
                for k in range(20):
                    nursery.start_soon(worker, SOURCES[k % len(SOURCES)])
            cpu1, flood1, elapsed = server.cpu_times(), flood.cpu_times(), time.monotonic() - t0
        finally:
            flooder.terminate()
            out, _ = flooder.communicate(timeout=30)
        for client in held:
            await client.stream.aclose()
    ok = len(latencies)
    busy = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed
    attacker = (flood1.user + flood1.system - flood0.user - flood0.system) / elapsed
    print(f"\nflood from 127.0.0.1: {FLOOD} connections never logging in ({out.strip()}); legit logins from "
          f"{len(SOURCES)} other addresses: {ok}/{LEGIT} ok, login p50 {1000 * quantile(latencies, 0.5):.1f} ms, "
          f"p99 {1000 * quantile(latencies, 0.99):.1f} ms, max {1000 * max(latencies):.1f} ms over {elapsed:.1f} s; "
          f"daemon CPU {100 * busy:.0f} % of a core, flooder {100 * attacker:.0f} % (niced); failures {failures[:3]}")
    assert ok >= 0.99 * LEGIT, failures[:5]
    assert quantile(latencies, 0.99) <= 0.100


async def test_many_addresses_each_within_its_share_cannot_fill_every_slot(tmp_path: Path) -> None:
    """Three addresses, each within its share of logins in progress, together hold every one of a daemon's 300
    slots with connections that never log in (re-opened as they are closed). At the limit the newest
    connection takes the slot of the oldest that has not logged in (idled.door.gate): logins from a fourth
    address still get in. Before, they were refused busy for as long as the flood went on."""
    command = serve_command(tmp_path / "data", "--max-connections", "300", "--metrics-port", "0",
                            "--login-timeout", "5")
    async with Daemon(command, tmp_path / "serve.stderr") as daemon:
        flooder = subprocess.Popen([sys.executable, "-m", "tests.door.flooder", str(daemon.port), "300",
                                    "127.0.0.2,127.0.0.3,127.0.0.4", "60"], cwd=ROOT, stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        held: list[Client] = []
        answers = []
        try:
            await trio.sleep(3.0)  # every slot is taken, by connections waiting longer than half the login deadline
            for i in range(20):
                client = Client(await connect_from("127.0.0.9", daemon.port), recv_timeout=5.0)
                await client.send(Login("uid", f"late-{i}"))
                answers.append(await client.recv())
                held.append(client)
        finally:
            flooder.terminate()
            out, _ = flooder.communicate(timeout=30)
        for client in held:
            await client.stream.aclose()
    welcomed = sum(isinstance(answer, Welcome) for answer in answers)
    print(f"\n300 slots held by 3 addresses never logging in ({out.strip()}): {welcomed}/20 logins from a fourth "
          f"address welcomed")
    assert welcomed == 20, answers
