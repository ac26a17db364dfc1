"""Disk full under a running daemon: the event log's write fails with ENOSPC. The policy is to exit (systemd
restarts the daemon onto a recovered log) -- with one line naming the log's directory and EXIT_LOG, no
traceback -- and a restart with room again loses nothing that was written.

The data directory is a 1 MiB tmpfs (root only: skipped, with the reason, where mounting is not permitted),
filled up while the daemon runs, then remounted bigger for the restart.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from idled.log.eventlog import iter_records
from idled.ops.fatal import EXIT_LOG
from idled.protocol import BYE, Login, Welcome
from tests.faults.test_fatal import one_line
from tests import peers
from tests.peers import Client, Daemon, serve_command

pytestmark = pytest.mark.slow

LEFT_FREE = 16 * 1024  # bytes the filler leaves: room for ~150 records, then ENOSPC


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with peers.small_tmpfs(tmp_path, "1m") as mount_point:
        yield mount_point


def fill(mount_point: Path, leave: int) -> None:
    stat = os.statvfs(mount_point)
    with open(mount_point / "filler", "wb") as filler:
        filler.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave))


async def churn_until_exit(daemon: Daemon, port: int, limit: int = 5000) -> int:
    """Users log in and out (two records each) until the daemon exits; the number that got a welcome."""
    welcomed = 0
    for i in range(limit):
        if daemon.proc.poll() is not None:
            return welcomed
        try:
            client = await Client.connect(port, recv_timeout=5.0, reset_is_eof=True)
            await client.send(Login("uid", f"u{i}", None, None))
            if isinstance(await client.recv(), Welcome):
                welcomed += 1
                await client.send(BYE)
                await client.recv()
            await client.stream.aclose()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            await trio.sleep(0.05)  # the daemon is going away
    raise AssertionError(f"the daemon still runs after {limit} users on a full disk")


async def test_disk_full_ends_the_daemon_with_one_line_and_loses_nothing(tmp_path: Path, small_disk: Path) -> None:
    data = small_disk / "data"
    command = serve_command(data, "--metrics-port", "0", "--fsync", "always")
    daemon = Daemon(command, tmp_path / "first.stderr")
    try:
        port = await daemon.started()
        fill(small_disk, LEFT_FREE)
        welcomed = await churn_until_exit(daemon, port)
        status = await daemon.wait()
    finally:
        daemon.kill()
    stderr = daemon.stderr()
    assert status == EXIT_LOG, stderr
    assert one_line(stderr) == f"idled: fatal: event log ({data}): No space left on device"
    written = list(iter_records(data))
    assert 0 < len(written) <= 2 * welcomed  # what fitted; the rest never reached the disk

    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    again = Daemon(command, tmp_path / "second.stderr")
    try:
        await again.started()
        assert await again.stop() == 0
    finally:
        again.kill()
    after = list(iter_records(data))
    assert after[: len(written)] == written  # nothing written before the disk filled is lost
    assert {r["reason"] for r in after[len(written):]} <= {"restart"}  # only the sessions the crash left open
