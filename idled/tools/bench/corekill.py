"""What a core crash costs the users of ``idled serve --workers 2``: SIGKILL the core under real users.

Theory of operation
-------------------
One daemon (``idled.tools.bench.daemon.Daemon``, ``--workers 2 --tick 0.1``), ``users`` TCP users logged in
through its two edges, each pinging every ``PING_EVERY`` seconds (keepalive 10 s) and reading every answer.
An observer is subscribed through an edge. Per run: the core (the root's child started with
``--core-of-workers``) is SIGKILLed; the root restarts it. Measured from the kill:

* ``closed``: users whose connection ended or who read anything but a pong (an error frame) until the end of
  the run (must be 0);
* ``core back``: until the new core's process listens (its ``IDLED_LISTENING`` behind ``core:``);
* ``login recorded``: until a fresh login through the public port is recorded ``online`` by the new core --
  what a consumer of the record waits for (a login is *accepted* by an edge throughout: while the core is away
  the edge welcomes it at once and re-attaches it later);
* ``re-attached``: until every user's ``online`` after its ``restart`` offline is in the event log.

One trio task per user: at 2,000 users and a ping every 2 s this costs the generator ~1,000 reads a second,
far below what the daemon serves. ``report_lines`` prints one line per run and a summary.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil
import trio

from idled.log.eventlog import iter_records
from idled.protocol import (
    PING, PONG, Event, FrameDecoder, Login, Subscribe, Welcome, encode, parse_server_message, receive_message,
)
from idled.tools.bench.daemon import Daemon

__all__ = ["Run", "measure", "report_lines"]

PING_EVERY = 2.0
KEEPALIVE = 10.0
SETTLE = 3.0  # seconds of pinging after a run's last figure, before the closed users are counted
MAX_FRAME = 1 << 20


@dataclass(slots=True, frozen=True)
class Run:
    closed: int  # users closed or sent an error, out of ``users``
    core_back: float  # seconds from the kill until the new core listens
    login_recorded: float  # ... until a fresh login is recorded online
    reattached: float  # ... until every user is online again in the log


class _Conn:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(MAX_FRAME, parse=parse_server_message)

    @classmethod
    async def login(cls, port: int, role: Literal["uid", "observer"], name: str, keepalive: float | None = None) -> _Conn:
        conn = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await conn.stream.send_all(encode(Login(role, name, None, keepalive)))
        welcome = await conn.recv()
        if not isinstance(welcome, Welcome):
            raise RuntimeError(f"login of {name}: {welcome!r}")
        return conn

    async def recv(self) -> Any:
        with trio.fail_after(10):
            return await receive_message(self.stream, self.decoder)


async def _ping(conn: _Conn, closed: list[str], uid: str) -> None:
    try:
        while True:
            await trio.sleep(PING_EVERY)
            await conn.stream.send_all(encode(PING))
            if (answer := await conn.recv()) is not PONG:
                closed.append(f"{uid}: {answer!r}")
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError) as exc:
        closed.append(f"{uid}: {exc!r}")


def _core_pid(root: int) -> int | None:
    for child in psutil.Process(root).children():
        try:
            if "--core-of-workers" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                return child.pid
        except psutil.NoSuchProcess:
            continue
    return None


def _core_listened(daemon: Daemon) -> int:
    """How many cores the root has seen listening so far (its ``core (pid N) listening`` lines)."""
    return sum(1 for line in daemon.stderr().splitlines() if "idled.server.workers.root: core (pid" in line and line.endswith(") listening"))


async def _until(predicate: Any, timeout: float = 60.0) -> float:
    """Wait for ``predicate()``; the monotonic time it first held."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)
    return time.monotonic()


async def _one_run(daemon: Daemon, data: Path, users: int, closed: list[str], run: int) -> Run:
    core = _core_pid(daemon.proc.pid)
    assert core is not None
    seq = max((r["seq"] for r in iter_records(data)), default=0)
    listened = _core_listened(daemon)
    killed = time.monotonic()
    os.kill(core, signal.SIGKILL)
    back = await _until(lambda: _core_listened(daemon) > listened)
    late = await _Conn.login(daemon.port, "uid", f"late-{run}", KEEPALIVE)
    observer = await _Conn.login(daemon.port, "observer", f"obs-{run}")
    await observer.stream.send_all(encode(Subscribe(seq + 1)))
    while not isinstance(event := await observer.recv(), Event) or event.uid != f"late-{run}":
        pass
    recorded = time.monotonic()
    expected = {f"u{i}" for i in range(users)}

    def reattached() -> bool:
        return expected <= {r["uid"] for r in iter_records(data) if r["seq"] > seq and r["kind"] == "online"}

    all_back = await _until(reattached)
    await observer.stream.aclose()
    await late.stream.aclose()
    return Run(len(closed), back - killed, recorded - killed, all_back - killed)


async def measure(users: int = 2000, runs: int = 3, directory: Path | None = None) -> list[Run]:
    """Start the daemon, log ``users`` in, kill its core ``runs`` times (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="idled-corekill-") as scratch:
        where = directory or Path(scratch)
        daemon = await trio.to_thread.run_sync(
            lambda: Daemon(where, "--workers", "2", "--tick", "0.1", "--metrics-port", "0", "--fsync", "never"))
        results: list[Run] = []
        closed: list[str] = []
        try:
            async with trio.open_nursery() as nursery:
                for i in range(users):
                    conn = await _Conn.login(daemon.port, "uid", f"u{i}", KEEPALIVE)
                    nursery.start_soon(_ping, conn, closed, f"u{i}")
                await trio.sleep(PING_EVERY)
                for run in range(runs):
                    results.append(await _one_run(daemon, where / "data", users, closed, run))
                    await trio.sleep(SETTLE)
                    results[-1] = Run(len(closed), results[-1].core_back, results[-1].login_recorded,
                                      results[-1].reattached)
                nursery.cancel_scope.cancel()
        finally:
            await trio.to_thread.run_sync(daemon.stop)
        return results


def report_lines(results: list[Run], users: int) -> Iterator[str]:
    yield f"idled serve --workers 2, {users} users pinging every {PING_EVERY:g} s through the edges; core SIGKILLed"
    for n, run in enumerate(results, 1):
        yield (f"run {n}: users closed {run.closed}/{users}; core back {1000 * run.core_back:.0f} ms; fresh login "
               f"recorded online {1000 * run.login_recorded:.0f} ms; all {users} re-attached {1000 * run.reattached:.0f} ms")
