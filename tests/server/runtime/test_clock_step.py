"""End to end: `idled serve` under libfaketime, its wall clock stepped back an hour while it runs, and while
it is down.

libfaketime (Debian ``faketime``; see .ci/system-deps) is preloaded into the daemon only, never into this test
process: its wall clock (``CLOCK_REALTIME``) reads the offset held in a timestamp file that the test rewrites
(``FAKETIME_NO_CACHE``: read at every call), and its monotonic clock is left alone
(``FAKETIME_DONT_FAKE_MONOTONIC``), as an NTP step leaves it. Tokens are minted here, on the real clock.

What must hold through a backward step (docs/operations.md, "Clock steps"): every event's ``ts`` is
non-decreasing in seq order, on the wire and in the log; no session is shorter than zero; nobody who pings
goes offline; a token that expired before the step stays refused after it; the status page keeps sampling.
And after a restart onto a clock stepped back while the daemon was down, the first new ``ts`` is not below
the last one logged.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import BYE, PING, Error, Event, Login, Query, Status, Subscribe, Welcome, tokens

from tests import peers

pytestmark = pytest.mark.slow  # real `idled serve` subprocesses, real time

STEP = 3600  # seconds the wall clock is stepped back
SECRET = b"a secret of 32 bytes for steps.."
TTL = 600.0  # a live token's lifetime: shorter than the step, so the step alone would revive an expired one


def faketime_library() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("libfaketime is not installed (Debian: apt-get install faketime; see .ci/system-deps)")
    return found[0]


class SteppedDaemon(peers.Daemon):
    """`idled serve` whose wall clock is the real one plus the offset in ``clock_file`` (rewritten by ``set``)."""

    def __init__(self, tmp_path: Path, clock_file: Path, *extra: str) -> None:
        self.data_dir = tmp_path / "data"
        self.clock_file = clock_file
        secret_file = tmp_path / "secret"
        secret_file.write_bytes(SECRET)
        secret_file.chmod(0o600)
        env = {**os.environ, "LD_PRELOAD": faketime_library(), "FAKETIME_TIMESTAMP_FILE": str(clock_file),
               "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        command = peers.serve_command(self.data_dir, "--tick", "0.1", "--timeout", "1", "--secret-file",
                                      str(secret_file), "--fsync", "never", "--metrics-port", "0", *extra)
        super().__init__(command, tmp_path / f"idled-{time.monotonic_ns()}.stderr", env=env)


def step_to(clock_file: Path, offset: int) -> None:
    """The daemon's wall clock now reads real time plus ``offset`` seconds (atomically: never half a file)."""
    scratch = clock_file.with_suffix(".new")
    scratch.write_text(f"{offset:+d}\n")
    os.replace(scratch, clock_file)


def token(role: str, name: str, expires: float | None = None) -> str:
    return tokens.mint(SECRET, role, name, time.time() + TTL if expires is None else expires)


async def login(port: int, name: str, *, keepalive: float | None = 1.0, token_text: str | None = None) -> Any:
    client = await peers.Client.connect(port)
    await client.send(Login("uid", name, token_text or token("uid", name), keepalive))
    return client, await client.recv()


async def user(port: int, name: str, keepalive: float = 1.0) -> peers.Client:
    client, answer = await login(port, name, keepalive=keepalive)
    assert isinstance(answer, Welcome), answer
    return client


async def observer(port: int) -> peers.Client:
    client = await peers.Client.login(port, "observer", "watch", token=token("observer", "watch"))
    await client.send(Subscribe(None))
    await client.send(Query(("-",)))
    assert isinstance(await client.recv(), Status)
    return client


async def refused(port: int, name: str, token_text: str) -> bool:
    """Whether a login with ``token_text`` is refused as auth_failed (False: welcomed)."""
    client, answer = await login(port, name, token_text=token_text)
    await client.stream.aclose()
    if isinstance(answer, Welcome):
        return False
    assert isinstance(answer, Error) and answer.code == "auth_failed", answer
    return True


def live(metrics_port: int, since: float | None = None) -> list[dict[str, Any]]:
    """The samples /status/live returns (newer than ``since``), read with an API token (auth is on)."""
    query = "" if since is None else f"?since={since!r}"
    token = tokens.mint(SECRET, tokens.API_ROLE, "steps", time.time() + 86400)  # good a day either side of a step
    request = urllib.request.Request(f"http://127.0.0.1:{metrics_port}/status/live{query}",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return list(json.loads(response.read())["vitals"]["history"])


async def pinging(client: peers.Client, stop: trio.Event) -> None:
    while not stop.is_set():
        await client.send(PING)
        with trio.move_on_after(0.3):
            await stop.wait()


def logged(data_dir: Path) -> list[dict[str, Any]]:
    return list(iter_records(str(data_dir)))


def assert_time_goes_forward(events: list[dict[str, Any]]) -> None:
    """``ts`` non-decreasing in seq order; every session (an online to its offline) of length >= 0."""
    events = sorted(events, key=lambda e: e["seq"])
    for before, after in zip(events, events[1:]):
        assert after["ts"] >= before["ts"], f"ts went back {before['ts'] - after['ts']:.3f} s: {before} -> {after}"
    online: dict[Any, dict[str, Any]] = {}
    for event in events:
        if event["kind"] == "online":
            online[event["uid"]] = event
        elif event["uid"] in online:
            start = online.pop(event["uid"])
            assert event["ts"] - start["ts"] >= 0, f"a session of {event['ts'] - start['ts']:.3f} s: {start} -> {event}"


def record(event: Event) -> dict[str, Any]:
    return {"seq": event.seq, "kind": event.kind, "uid": event.uid, "ts": event.ts, "reason": event.reason}


@pytest.mark.parametrize("workers", ["0", "1"], ids=lambda n: f"workers{n}")
async def test_a_step_back_while_serving_moves_no_time_back(tmp_path: Path, workers: str) -> None:
    clock_file = tmp_path / "clock"
    step_to(clock_file, 0)
    mport = peers.free_port()
    async with SteppedDaemon(tmp_path, clock_file, "--metrics-port", str(mport), "--workers", workers) as daemon:
        port = daemon.port
        watch = await observer(port)
        stop_pinging = trio.Event()
        async with trio.open_nursery() as nursery:
            pingers = [await user(port, name) for name in ("ann", "bob")]
            for client in pingers:
                nursery.start_soon(pinging, client, stop_pinging)
            straddling = await user(port, "carl", keepalive=60.0)  # logs in before the step, out after it
            lapsed = token("uid", "eve", time.time() + 0.5)
            await trio.sleep(1.2)
            assert await refused(port, "eve", lapsed), "a token 0.7 s past its expiry was welcomed"
            while not live(mport):  # the first sample (the monitor takes one a second)
                await trio.sleep(0.1)
            quiet = await user(port, "dora")  # never pings: goes offline idle (timeout 1.5 s) after the step
            step_to(clock_file, -STEP)  # the wall clock goes back an hour; the monotonic clock does not
            await trio.sleep(0.3)
            last_sample = live(mport)[-1]["t"]
            assert await refused(port, "eve", lapsed), "a token that expired before the step was welcomed after it"
            await straddling.send(BYE)
            await trio.sleep(1.5)  # dora's deadline passes, ann and bob keep pinging
            later = await user(port, "fay", keepalive=60.0)  # a session wholly after the step
            opened = time.monotonic()
            await trio.sleep(1.0)
            await later.send(BYE)
            lasted = time.monotonic() - opened
            await trio.sleep(1.2)
            newer = [sample["t"] for sample in live(mport, last_sample)]
            assert [t for t in newer if t > last_sample], f"the status page took no sample since the step: {newer}"
            assert STEP - 10 < peers.scrape(mport, "idled_wall_clock_ahead_seconds") <= STEP  # and says why
            stop_pinging.set()
        events = [record(e) for e in await watch.drain()]
        for client in (*pingers, straddling, quiet, later):
            await client.stream.aclose()
        assert await daemon.stop() == 0
    on_disk = logged(daemon.data_dir)
    kinds = [(e["uid"], e["kind"], e["reason"]) for e in events]
    assert ("carl", "offline", "logout") in kinds and ("dora", "offline", "idle") in kinds, kinds
    assert ("fay", "offline", "logout") in kinds, kinds
    assert not [k for k in kinds if k[0] in ("ann", "bob") and k[1] == "offline"], f"a pinging user went offline: {kinds}"
    assert_time_goes_forward(events)  # on the wire
    assert_time_goes_forward(on_disk)  # in the log
    fay = [e["ts"] for e in on_disk if e["uid"] == "fay"]
    # Elapsed time on `ts` stays close to the real one (a slew runs at most 1/12 slower).
    assert 0.8 * lasted - 0.2 <= fay[1] - fay[0] <= lasted + 0.2, (fay, lasted)


async def test_a_restart_onto_a_clock_stepped_back_starts_after_the_last_logged_ts(tmp_path: Path) -> None:
    clock_file = tmp_path / "clock"
    step_to(clock_file, 0)
    async with SteppedDaemon(tmp_path, clock_file) as daemon:
        clients = [await user(daemon.port, name, keepalive=60.0) for name in ("ann", "bob")]
        with trio.fail_after(10):
            while len(logged(daemon.data_dir)) < 2:  # written (fsync never: in the page cache, enough for SIGKILL)
                await trio.sleep(0.05)
        daemon.kill()  # a crash: ann and bob are left online, to be ended "restart" by the next run
        for client in clients:
            await client.stream.aclose()
    before = logged(daemon.data_dir)
    last_ts, last_seq = max(e["ts"] for e in before), max(e["seq"] for e in before)

    step_to(clock_file, -STEP)  # stepped back while the daemon was down
    async with SteppedDaemon(tmp_path, clock_file) as daemon:
        client = await user(daemon.port, "carl", keepalive=60.0)
        await client.send(BYE)
        assert await client.recv() is None
        assert await daemon.stop() == 0
    after = [e for e in logged(daemon.data_dir) if e["seq"] > last_seq]
    assert {(e["uid"], e["reason"]) for e in after} >= {("ann", "restart"), ("bob", "restart"), ("carl", "login")}
    first = min(after, key=lambda e: e["seq"])
    assert first["ts"] >= last_ts, f"the first ts of the new run is {last_ts - first['ts']:.3f} s below the last logged"
    assert_time_goes_forward(before + after)


async def test_a_clock_that_ran_ahead_then_was_corrected_refuses_tokens_only_until_a_restart(tmp_path: Path) -> None:
    """The other side of never going backwards: the clock ran a day ahead while events were logged, then NTP
    stepped it back to the truth. ``ts`` stays ahead (it never decreases: it slews back), and within that run
    tokens minted on correct clocks are judged on the run's clock, a day ahead: refused. A restart judges them
    on the system clock again -- the operator's remedy, said in the warning line -- while ``ts`` goes on from
    the last logged one."""
    day = 86400
    clock_file = tmp_path / "clock"
    step_to(clock_file, day)
    async with SteppedDaemon(tmp_path, clock_file) as daemon:
        ann, answer = await login(daemon.port, "ann", keepalive=60.0, token_text=token("uid", "ann", time.time() + 2 * day))
        assert isinstance(answer, Welcome), answer
        step_to(clock_file, 0)  # corrected, within the run
        assert await refused(daemon.port, "ann2", token("uid", "ann2")), "judged on the run's clock, a day ahead"
        await ann.stream.aclose()
        assert await daemon.stop() == 0
    before = logged(tmp_path / "data")
    last_ts = max(e["ts"] for e in before)
    async with SteppedDaemon(tmp_path, clock_file) as daemon:
        client = await user(daemon.port, "bob", keepalive=60.0)  # a token of ten minutes, on the real clock
        await client.send(BYE)
        assert await client.recv() is None
        assert await daemon.stop() == 0
    assert "the event log's last ts is" in daemon.stderr()
    after = [e for e in logged(tmp_path / "data") if e not in before]
    assert min(e["ts"] for e in after) >= last_ts  # ts still never goes back
    assert_time_goes_forward(before + after)


def role(metrics: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/status", timeout=5) as response:
            return str(json.loads(response.read())["role"])
    except OSError:
        return None  # between two roles nothing listens


async def test_a_standby_promoted_onto_a_clock_stepped_back_starts_after_the_replicated_ts(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "s").mkdir()
    active_clock, standby_clock = tmp_path / "a" / "clock", tmp_path / "s" / "clock"
    step_to(active_clock, 0)
    step_to(standby_clock, 0)
    metrics = peers.free_port()
    async with SteppedDaemon(tmp_path / "a", active_clock) as first:
        async with SteppedDaemon(tmp_path / "s", standby_clock, "--standby-of", f"127.0.0.1:{first.port}",
                                 "--metrics-port", str(metrics)) as follower:
            clients = [await user(first.port, name, keepalive=60.0) for name in ("ann", "bob")]
            with trio.fail_after(10):
                while len(logged(follower.data_dir)) < 2:  # replicated
                    await trio.sleep(0.05)
            first.kill()
            replicated = logged(follower.data_dir)
            step_to(standby_clock, -STEP)  # the standby's clock is stepped back before it takes over
            os.kill(follower.proc.pid, signal.SIGUSR1)  # what `idled promote` sends
            with trio.fail_after(10):
                while role(metrics) != "active":
                    await trio.sleep(0.05)
            carl = await user(follower.port, "carl", keepalive=60.0)
            await carl.send(BYE)
            assert await carl.recv() is None
            assert await follower.stop() == 0
            for client in clients:
                await client.stream.aclose()
    last_ts = max(e["ts"] for e in replicated)
    after = [e for e in logged(follower.data_dir) if e["seq"] > max(e["seq"] for e in replicated)]
    assert {(e["uid"], e["reason"]) for e in after} >= {("ann", "restart"), ("bob", "restart"), ("carl", "login")}
    assert min(e["ts"] for e in after) >= last_ts, f"the promoted core stamped {last_ts - min(e['ts'] for e in after):.3f} s below the replicated log"
    assert_time_goes_forward(replicated + after)
