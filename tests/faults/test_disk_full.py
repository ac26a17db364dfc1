"""Disk full under a real daemon (a small tmpfs): the daemon degrades, it does not die.

While the event log cannot be written the daemon stays up: /readyz answers 503 naming the full disk, /status and
the metrics say so, logins of users not online are refused with ``unavailable``, sessions online are kept
(keepalives answered), expiries still happen (their events held in memory). Once space is freed it writes what it
held, in seq order, with no gap and no duplicate, by itself; a durable observer receives every event. A daemon
started on a full disk -- even over a log a killed run left with open sessions and a torn tail -- comes up
degraded and recovers the same way, with no restart.

The data directory is a tmpfs (root only: skipped, with the reason, where mounting is not permitted).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.log.eventlog import iter_records, list_segments
from idled.protocol import BYE, PING, Error, ErrorCode, Event, Login, Pong, Subscribe, Welcome
from tests import peers
from tests.peers import Client, Daemon, free_port, scrape, serve_command

pytestmark = pytest.mark.slow

LEFT_FREE = 16 * 1024  # bytes the filler leaves: room for ~100 records, then ENOSPC
KEEPALIVE = 1.0  # the users' keepalive: a silent one goes offline 1.5 s later


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with peers.small_tmpfs(tmp_path, "2m") as mount_point:
        yield mount_point


def fill(mount_point: Path, leave: int) -> Path:
    """A file taking all the free space but ``leave`` bytes; returns its path."""
    path = mount_point / "filler"
    stat = os.statvfs(mount_point)
    with open(path, "ab") as filler:
        filler.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave))
    return path


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def until_ready(metrics: int, want: int, timeout: float = 10.0) -> str:
    """Poll /readyz until it answers ``want``; its body."""
    with trio.fail_after(timeout):
        while True:
            status, body = await trio.to_thread.run_sync(http, metrics, "/readyz")
            if status == want:
                return body
            await trio.sleep(0.1)


async def login(port: int, uid: str) -> tuple[Client, Any]:
    """A user login: the client and the server's answer (a Welcome or an Error)."""
    client = await Client.connect(port)
    await client.send(Login("uid", uid, None, KEEPALIVE))
    return client, await client.recv()


class Pinger:
    """Keeps a session alive: a ping every 0.3 s, each pong counted, until ``stop()`` (then ``done`` is set)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.pongs = 0
        self.stopping = False
        self.done = trio.Event()

    async def run(self) -> None:
        try:
            while not self.stopping:
                await self.client.send(PING)
                assert isinstance(await self.client.recv(), Pong)
                self.pongs += 1
                await trio.sleep(0.3)
        finally:
            self.done.set()

    async def stop(self) -> None:
        self.stopping = True
        await self.done.wait()


async def watching(observer: Client, events: list[Event]) -> None:
    """A durable observer's events, until the server closes it (server_shutdown)."""
    while isinstance(message := await observer.recv(timeout=60), Event):
        events.append(message)


async def churn_until_refused(port: int, limit: int = 3000) -> int:
    """Users log in and out (two records each) until a login is refused with ``unavailable``; how many got in."""
    for i in range(limit):
        client, answer = await login(port, f"churn{i}")
        if isinstance(answer, Error):
            assert answer.code == ErrorCode.UNAVAILABLE, answer
            assert "No space left on device" in answer.reason
            await client.stream.aclose()
            return i
        assert isinstance(answer, Welcome), answer
        await client.send(BYE)
        await client.recv()
        await client.stream.aclose()
    raise AssertionError(f"no login refused after {limit} users on a full disk")


def assert_gap_free(records: list[dict[str, Any]], first: int = 1) -> None:
    seqs = [r["seq"] for r in records]
    assert seqs == list(range(first, first + len(seqs))), "seqs not consecutive (a gap, a duplicate or a reorder)"


async def test_a_full_disk_degrades_the_daemon_and_it_recovers_by_itself(tmp_path: Path, small_disk: Path) -> None:
    data, metrics = small_disk / "data", free_port()
    command = serve_command(data, "--metrics-port", str(metrics), "--fsync", "always", "--tick", "0.1")
    async with Daemon(command, tmp_path / "stderr") as daemon, trio.open_nursery() as nursery:
        observer = await Client.login(daemon.port, "observer", "dashboard")
        await observer.send(Subscribe(1, durable=True))
        seen: list[Event] = []
        nursery.start_soon(watching, observer, seen)
        pingers = []
        for uid in ("stayer", "silent"):
            client, answer = await login(daemon.port, uid)
            assert isinstance(answer, Welcome)
            pingers.append(Pinger(client))
            nursery.start_soon(pingers[-1].run)
        stayer, silent = pingers

        filler = fill(small_disk, LEFT_FREE)
        welcomed = await churn_until_refused(daemon.port)
        assert welcomed > 0 and daemon.proc.poll() is None  # up, and the disk did fill while it ran
        await silent.stop()  # from now on silent: it goes offline while the disk is full
        body = await until_ready(metrics, 503)
        assert "degraded" in body and "No space left on device" in body, body
        status = json.loads((await trio.to_thread.run_sync(http, metrics, "/status"))[1])
        assert status["degraded"] == "event log: No space left on device", status
        assert await trio.to_thread.run_sync(scrape, metrics, "idled_eventlog_degraded") == 1

        client, answer = await login(daemon.port, "newcomer")  # new work: refused, with the code
        assert isinstance(answer, Error) and answer.code == ErrorCode.UNAVAILABLE, answer
        assert "retry later" in answer.reason

        # The silent user goes offline all the same (not late: expiry goes on); its event is held in memory.
        assert await silent.client.expect_error(ErrorCode.IDLE_TIMEOUT)
        on_disk = {(r["uid"], r["kind"]) for r in iter_records(data)}
        assert ("silent", "offline") not in on_disk
        held = json.loads((await trio.to_thread.run_sync(http, metrics, "/status"))[1])["events_held"]
        assert held >= 1
        assert await trio.to_thread.run_sync(scrape, metrics, "idled_eventlog_held_events") >= 1
        before = stayer.pongs
        await trio.sleep(2 * KEEPALIVE)  # the stayer, meanwhile: kept online, its keepalives answered
        assert stayer.pongs > before + 3 and daemon.proc.poll() is None

        filler.unlink()  # room again: everything held is written by itself
        assert await until_ready(metrics, 200) == "ready\n"
        status = json.loads((await trio.to_thread.run_sync(http, metrics, "/status"))[1])
        assert status["degraded"] is None and status["events_held"] == 0
        client, answer = await login(daemon.port, "newcomer")
        assert isinstance(answer, Welcome), answer
        await client.stream.aclose()
        with trio.fail_after(10):
            while not any(e.uid == "newcomer" for e in seen):  # the durable observer caught up
                await trio.sleep(0.05)
        await stayer.stop()
        assert await daemon.stop() == 0
        nursery.cancel_scope.cancel()

    records = list(iter_records(data))
    assert_gap_free(records)
    offline = {r["uid"]: r["reason"] for r in records if r["kind"] == "offline"}
    assert offline["silent"] == "idle" and offline["stayer"] == "shutdown"  # the stayer never went offline early
    assert [e.seq for e in seen] == [r["seq"] for r in records]  # every event, once, in order
    stderr = daemon.stderr()
    assert stderr.count("degraded: event log: No space left on device") == 1, stderr
    assert stderr.count("no longer degraded") == 1, stderr


async def test_a_start_on_a_full_disk_comes_up_degraded_then_recovers(tmp_path: Path, small_disk: Path) -> None:
    data, metrics = small_disk / "data", free_port()
    command = serve_command(data, "--metrics-port", str(metrics), "--fsync", "always")
    async with Daemon(command, tmp_path / "first.stderr") as first:
        users = [(await login(first.port, f"u{i}"))[0] for i in range(5)]
        with trio.fail_after(10):
            while sum(r["kind"] == "online" for r in iter_records(data)) < 5:
                await trio.sleep(0.05)
        first.proc.send_signal(signal.SIGKILL)  # sessions left online, for the next start to close
        await first.wait()
    for user in users:
        await user.stream.aclose()
    last = list_segments(data)[-1][1]
    with open(last, "ab") as segment:
        segment.write(b"\x7f" * 40)  # a torn tail: quarantining it needs room the disk will not have
    written = list(iter_records(data))
    filler = fill(small_disk, 0)

    async with Daemon(command, tmp_path / "second.stderr") as second:  # listening: it did not exit
        body = await until_ready(metrics, 503)
        assert "degraded" in body and "No space left on device" in body, body
        client, answer = await login(second.port, "early")
        assert isinstance(answer, Error) and answer.code == ErrorCode.UNAVAILABLE, answer
        await trio.sleep(1.5)  # retries meanwhile: still up, still degraded, no restart
        assert second.proc.poll() is None and (await trio.to_thread.run_sync(http, metrics, "/readyz"))[0] == 503

        filler.unlink()
        await until_ready(metrics, 200)
        client, answer = await login(second.port, "later")
        assert isinstance(answer, Welcome), answer
        await client.send(BYE)
        await client.recv()
        assert await second.stop() == 0

    records = list(iter_records(data))
    assert records[: len(written)] == written  # nothing written before is lost
    after = records[len(written):]
    assert_gap_free(after, after[0]["seq"])
    assert sorted(r["uid"] for r in after if r["reason"] == "restart") == [f"u{i}" for i in range(5)]
    assert [(r["uid"], r["kind"]) for r in after if r["uid"] == "later"] == [("later", "online"), ("later", "offline")]
    assert list(data.glob("*.quarantine-*")), "the torn tail was not quarantined once there was room"
    stderr = second.stderr()
    assert stderr.count("no longer degraded") == 1, stderr


async def test_an_edge_in_front_of_a_full_core_refuses_new_users_and_keeps_its_own(
    tmp_path: Path, small_disk: Path
) -> None:
    data, metrics = small_disk / "data", free_port()
    core = serve_command(data, "--metrics-port", str(metrics), "--fsync", "always", "--tick", "0.1")
    edge = [sys.executable, "-m", "idled.cli.main", "edge", "--port", "0"]
    async with Daemon(core, tmp_path / "core.stderr") as c, \
            Daemon([*edge, "--core", f"127.0.0.1:{c.port}"], tmp_path / "edge.stderr") as e, \
            trio.open_nursery() as nursery:
        client, answer = await login(e.port, "through-the-edge")
        assert isinstance(answer, Welcome), answer
        kept = Pinger(client)
        nursery.start_soon(kept.run)
        filler = fill(small_disk, LEFT_FREE)
        await churn_until_refused(c.port)
        await until_ready(metrics, 503)

        # The core refuses the edge's attach of a new session (an ``ended`` notice): the edge tells its user.
        client, answer = await login(e.port, "newcomer")
        assert isinstance(answer, Error) and answer.code == ErrorCode.UNAVAILABLE, answer
        before = kept.pongs
        await trio.sleep(2 * KEEPALIVE)
        assert kept.pongs > before + 3  # the edge's own user is kept, and stays online
        status = json.loads((await trio.to_thread.run_sync(http, metrics, "/status"))[1])
        assert status["sessions_online"] >= 1 and status["degraded"]

        filler.unlink()
        await until_ready(metrics, 200)
        client, answer = await login(e.port, "newcomer")
        assert isinstance(answer, Welcome), answer
        await kept.stop()
        nursery.cancel_scope.cancel()
    offline = {r["uid"]: r["reason"] for r in iter_records(data) if r["kind"] == "offline"}
    assert "through-the-edge" not in offline  # never went offline while the disk was full
