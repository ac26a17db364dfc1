"""The examples in examples/, run as subprocesses against a real `idled serve`, watched through the client."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from idled.client.trio import open_gateway, open_observer
from tests.client.scenarios import FAST, collect
from tests.client.support import HOST, Idled

pytestmark = pytest.mark.slow  # real idled daemons

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str, *args: str, out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as sink:
        # SIGINT stops an example: an ignored SIGINT inherited from the test run (a shell's background job
        # ignores it) would leave the example running and the test waiting.
        return subprocess.Popen([sys.executable, str(EXAMPLES / name), *args], stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


async def wait_output(path: Path, text: str, timeout: float = 20.0) -> str:
    with trio.fail_after(timeout):
        while text not in (output := path.read_text()):
            await trio.sleep(0.02)
    return output


async def test_trio_user_stays_online_by_itself_and_says_bye(idled: Idled, tmp_path: Path) -> None:
    async with open_observer(HOST, idled.port, "watch", after=0) as observer:
        out = tmp_path / "user.out"
        proc = example("trio_user.py", "--idled-port", str(idled.port), "--uid", "carol", "--keepalive", "1",
                       "--every", "10", "--duration", "1.5", out=out)
        assert await trio.to_thread.run_sync(proc.wait, 30) == 0, out.read_text()
        events = await collect(observer, lambda e: e.kind == "offline")
    assert [(e.uid, e.kind, e.reason) for e in events] == [("carol", "online", "login"), ("carol", "offline", "logout")]
    assert "BYE pings=" in out.read_text()


async def test_asyncio_gateway_reports_its_users(idled: Idled, tmp_path: Path) -> None:
    out = tmp_path / "gateway.out"
    proc = example("asyncio_gateway.py", "--idled-port", str(idled.port), "--keepalive", "30", out=out)
    try:
        port = int((await wait_output(out, "LISTENING")).split("port=")[1].split()[0])
        async with open_observer(HOST, idled.port, "watch", after=0) as observer:
            users = [await trio.open_tcp_stream(HOST, port) for _ in range(3)]
            for stream, name in zip(users, ["ann", "ben", "cat"]):
                await stream.send_all(name.encode() + b"\nactive\n")
            online = await collect(observer, lambda e: len(seen) == 3, seen := [])
            assert sorted(e.uid for e in online) == ["ann", "ben", "cat"]
            await users[1].aclose()
            [offline] = await collect(observer, lambda e: True)
            assert (offline.uid, offline.kind, offline.reason) == ("ben", "offline", "detach")
            for stream in (users[0], users[2]):
                await stream.aclose()
    finally:
        proc.send_signal(signal.SIGINT)
        await trio.to_thread.run_sync(proc.wait, 20)


async def test_asyncio_gateway_closes_a_user_idled_ended(idled: Idled, tmp_path: Path) -> None:
    out = tmp_path / "gateway.out"
    proc = example("asyncio_gateway.py", "--idled-port", str(idled.port), "--keepalive", "1", out=out)
    try:
        port = int((await wait_output(out, "LISTENING")).split("port=")[1].split()[0])
        async with open_observer(HOST, idled.port, "watch", after=0) as observer:
            silent = await trio.open_tcp_stream(HOST, port)
            await silent.send_all(b"dan\n")  # then nothing: idle after 1.5 s
            events = await collect(observer, lambda e: e.kind == "offline")
            assert [(e.uid, e.kind, e.reason) for e in events] == [("dan", "online", "login"), ("dan", "offline", "idle")]
            received = b""
            with trio.fail_after(10):
                while chunk := await silent.receive_some():
                    received += chunk
            assert received == b"hello dan\nended idle\n"  # and the app closed the connection
            await silent.aclose()
    finally:
        proc.send_signal(signal.SIGINT)
        await trio.to_thread.run_sync(proc.wait, 20)


def table(db_path: Path) -> tuple[list[int], dict[str, int], int]:
    with sqlite3.connect(db_path) as db:
        seqs = [row[0] for row in db.execute("SELECT seq FROM history ORDER BY seq")]
        online = dict(db.execute("SELECT uid, online FROM presence"))
        checkpoint = db.execute("SELECT seq FROM checkpoint").fetchone()
    return seqs, online, 0 if checkpoint is None else checkpoint[0]


def checkpoint_of(db_path: Path) -> int:
    """The observer's checkpoint, 0 while its database is not there yet: sqlite creates the file on connect,
    before the example's schema script has created the tables."""
    try:
        return table(db_path)[2] if db_path.exists() else 0
    except sqlite3.OperationalError:
        return 0


async def wait_checkpoint(db_path: Path, seq: int, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while checkpoint_of(db_path) < seq:
            await trio.sleep(0.05)


async def test_sqlite_observer_survives_its_own_and_the_daemons_restart(idled: Idled, tmp_path: Path) -> None:
    db_path = tmp_path / "presence.sqlite3"
    args = ("--idled-port", str(idled.port), "--db", str(db_path))
    out = tmp_path / "observer-1.out"
    observer = example("sqlite_observer.py", *args, out=out)
    try:
        async with open_observer(HOST, idled.port, "count", after=0, backoff=FAST) as counter:
            async with open_gateway(HOST, idled.port, "edge", backoff=FAST) as gateway:
                await gateway.attach(range(300), keepalive=60)  # seqs 1..300
                await gateway.flush()
                await wait_checkpoint(db_path, 100)
                observer.kill()  # kill -9 mid-stream: whatever was not committed is read again
                observer.wait(10)
                await gateway.detach(range(100))  # seqs 301..400, while the observer is down
                await gateway.flush()
                await collect(counter, lambda e: e.seq >= 400)
                out = tmp_path / "observer-2.out"
                observer = example("sqlite_observer.py", *args, out=out)
                await wait_output(out, "RESUMING after=")
                idled.restart()  # 401..600 shutdown of 200 uids, 601..800 the gateway re-attaches them
                await collect(counter, lambda e: e.seq >= 800)
                await wait_checkpoint(db_path, 800)
                await gateway.detach(range(100, 150))
                await gateway.flush()
                await collect(counter, lambda e: e.seq >= 850)
                await wait_checkpoint(db_path, 850)
                observer.kill()  # before the gateway leaves: its bye sends every live uid offline
                observer.wait(10)
    finally:
        observer.kill()
        observer.wait(10)
    seqs, online, checkpoint = table(db_path)
    assert seqs == list(range(1, 851)), (seqs[:5], len(seqs))  # every event, once, in order
    assert checkpoint == 850
    assert {uid for uid, flag in online.items() if flag} == {repr(uid) for uid in range(150, 300)}
    resumed = int((tmp_path / "observer-2.out").read_text().split("RESUMING after=")[1].split()[0])
    assert resumed >= 100  # the second run started from the first run's checkpoint, not from scratch


async def test_observer_latency_prints_both_views(idled: Idled, tmp_path: Path) -> None:
    out = tmp_path / "latency.out"
    proc = example("observer_latency.py", "--idled-port", str(idled.port), "--logins", "5", out=out)
    assert await trio.to_thread.run_sync(proc.wait, 60) == 0, out.read_text()
    lines = out.read_text().splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["fast", "durable"], lines
    assert all("(n=5)" in line for line in lines)
