"""The roster the root of `idled serve --workers N` shares with its core (idled.server.workers.roster), and the root's
watchdog built on the core's heartbeat (idled.server.workers.root)."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import cast

import pytest
import trio

from idled.ops.config import Config
from idled.server.workers.children import Child
from idled.server.workers.root import Root, parse_core_fds
from idled.server.workers.roster import Roster


def test_what_the_root_writes_the_core_reads() -> None:
    root_side = Roster.create(3)
    core_side = Roster(root_side.fd)  # what a core does with the descriptor it inherited
    assert core_side.workers == 3 and core_side.worker(1) == (None, 0) and core_side.core_restarts() == 0
    root_side.set_worker(1, 4242, 2)
    root_side.set_core_restarts(5)
    assert core_side.worker(1) == (4242, 2) and core_side.worker(0) == (None, 0) and core_side.core_restarts() == 5
    root_side.set_worker(1, None, 3)  # down, being restarted
    assert core_side.worker(1) == (None, 3)
    assert root_side.heartbeat_age() is None
    core_side.beat()
    age = root_side.heartbeat_age()
    assert age is not None and 0 <= age < 1.0
    root_side.clear_heartbeat()
    assert root_side.heartbeat_age() is None


def test_core_descriptors_parse() -> None:
    assert parse_core_fds("3,4,5,6,7") == (3, 4, 5, [6, 7])
    for bad in ("3,4,5", "3,x,5,6", ""):
        with pytest.raises(ValueError):
            parse_core_fds(bad)


class FakeProcess:
    pid = 4242
    returncode = None

    def __init__(self) -> None:
        self.signals: list[int] = []

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)


async def test_the_watchdog_pings_systemd_and_aborts_a_silent_core(tmp_path: Path) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.setblocking(False)
    root = Root(Config(workers=1).validate(), [], secret=None,
                env={"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "200000"})
    core = FakeProcess()
    root.core.process = cast(Child, core)
    root.core.listening.set()
    core_side = Roster(root.roster.fd)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(root._watchdog, 0.1)
        for _ in range(5):  # a core that beats is left alone
            core_side.beat()
            await trio.sleep(0.1)
        assert core.signals == []
        await trio.sleep(0.5)  # silent for more than the watchdog period (0.2 s)
        assert core.signals == [signal.SIGABRT]
        nursery.cancel_scope.cancel()
    pings = []
    while True:
        try:
            pings.append(notify.recv(100))
        except BlockingIOError:
            break
    assert len(pings) >= 8 and set(pings) == {b"WATCHDOG=1"}  # the root itself keeps answering systemd
    notify.close()
