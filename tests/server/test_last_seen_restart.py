"""Last seen survives what the log survives: a retention pass that deleted the offline, a SIGKILL, a clean
restart -- through a real `idled serve` subprocess, with and without edge workers (queries reach the core
through an edge's relay)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from idled.log.eventlog import iter_records
from idled.log.snapshot import list_snapshots
from idled.protocol import BYE, Query, Status

from tests import peers

pytestmark = pytest.mark.slow

OPTIONS = ("--tick", "0.05", "--timeout", "1", "--max-timeout", "600", "--fsync", "always",
           "--segment-bytes", "4096", "--retention-bytes", "4096")


async def ask(port: int, *uids: object) -> Status:
    observer = await peers.Client.login(port, "observer", "obs")
    try:
        await observer.send(Query(tuple(uids), last_seen=True))  # type: ignore[arg-type]
        status = await observer.recv()
        assert isinstance(status, Status), status
        return status
    finally:
        await observer.send(BYE)
        await observer.stream.aclose()


@pytest.mark.parametrize("workers", [0, 2])
async def test_last_seen_survives_retention_sigkill_and_restart(tmp_path: Path, workers: int) -> None:
    data_dir = tmp_path / "data"
    command = peers.serve_command(data_dir, *OPTIONS, "--workers", str(workers))
    daemon = peers.Daemon(command, tmp_path / "run-0.stderr")
    try:
        port = await daemon.started()
        bob = await peers.Client.login(port, "uid", "bob")
        await bob.send(BYE)
        assert await bob.recv() is None
        carol = await peers.Client.login(port, "uid", 7, keepalive=300)  # online when killed
        with trio.fail_after(10):  # through an edge, the bye and the query reach the core by different links
            while not ((first := await ask(port, "bob", 7)).online == {"bob": False, 7: True}):
                await trio.sleep(0.02)
        bob_seen, carol_seen = first.last_seen["bob"], first.last_seen[7]  # type: ignore[index]
        assert first.online == {"bob": False, 7: True} and bob_seen is not None and carol_seen is not None
        for n in range(150):  # other users' logins and byes: rolls, and retention deletes bob's records
            client = await peers.Client.login(port, "uid", f"churn-{n}")
            await client.send(BYE)
            await client.stream.aclose()
        with trio.fail_after(20):
            while not list_snapshots(data_dir) or any(r["uid"] == "bob" for r in iter_records(data_dir)):
                await trio.sleep(0.05)
        assert (await ask(port, "bob")).last_seen == {"bob": bob_seen}
        daemon.kill()  # SIGKILL: carol never logged out
        del carol
    finally:
        daemon.kill()
    # Run 3 starts after a SIGKILL with nobody online: no event is published, and its first seq is past the
    # reservation's gap; a last_seen query must not wait for the writer to reach a seq nobody will write.
    for run, stop in ((1, signal.SIGTERM), (2, signal.SIGKILL), (3, signal.SIGTERM)):
        daemon = peers.Daemon(command, tmp_path / f"run-{run}.stderr")
        try:
            port = await daemon.started()
            with trio.fail_after(2):
                status = await ask(port, "bob", 7, "churn-149", "nobody")
            assert status.online == {"bob": False, 7: False, "churn-149": False, "nobody": False}
            assert status.last_seen is not None
            assert status.last_seen["bob"] == bob_seen  # from the snapshot: its offline record is gone
            # closed by the restart record, with its last activity (asked while online: converted from the server clock)
            assert status.last_seen[7] == pytest.approx(carol_seen, abs=0.05)
            assert status.last_seen["churn-149"] is not None and status.last_seen["nobody"] is None
            if stop == signal.SIGTERM:
                assert await daemon.stop(stop) == 0
        finally:
            daemon.kill()
