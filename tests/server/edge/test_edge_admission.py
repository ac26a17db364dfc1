"""A core that cannot keep up pushes back on logins: refused ``busy`` or welcomed after a bounded wait, never
half done (idled.server.edge.users, ``MAX_ATTACHING``).

Real `idled serve --workers 1`, the core SIGSTOPped while 1,500 users log in through the edge: the first
1,000 attaches wait for the core, their users are welcomed after at most ``ATTACH_WAIT``; every login past
them is refused ``busy`` at once. When the core runs again, exactly the welcomed users are online in the
record, none of the refused ones is, and nobody goes offline.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import Error, Login, Welcome
from idled.server.edge.link import MAX_ATTACHING
from idled.server.edge.users import ATTACH_WAIT
from tests import peers

pytestmark = pytest.mark.slow

LOGINS = 1500


async def test_logins_past_the_attach_bound_are_refused_busy_and_the_rest_are_recorded(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    command = peers.serve_command(data_dir, "--workers", "1", "--tick", "0.5", "--fsync", "never",
                                  "--metrics-port", "0")
    outcome: dict[str, str] = {}
    clients: list[peers.Client] = []
    async with peers.Daemon(command, tmp_path / "serve.err") as daemon:
        core = peers.core_pid(daemon.proc.pid)  # the root's child (idled.server.workers.root)
        assert core is not None
        os.kill(core, signal.SIGSTOP)  # the core: the edge keeps accepting
        try:
            async def login(i: int) -> None:
                client = await peers.Client.connect(daemon.port)
                clients.append(client)
                await client.send(Login("uid", f"u{i}", None, 30.0))
                start = trio.current_time()
                answer = await client.recv(timeout=20.0)
                waited = trio.current_time() - start
                if isinstance(answer, Welcome):
                    assert waited <= ATTACH_WAIT + 1.0, waited  # a bounded wait, not a hang
                    outcome[f"u{i}"] = "welcome"
                else:
                    assert isinstance(answer, Error), answer
                    outcome[f"u{i}"] = answer.code

            async with trio.open_nursery() as nursery:
                for i in range(LOGINS):
                    nursery.start_soon(login, i)
        finally:
            os.kill(core, signal.SIGCONT)
        counts = Counter(outcome.values())
        assert counts["welcome"] <= MAX_ATTACHING and counts["busy"] >= LOGINS - MAX_ATTACHING, counts
        assert counts["welcome"] + counts["busy"] == LOGINS, counts
        with trio.fail_after(20):
            while sum(1 for r in iter_records(data_dir) if r["kind"] == "online") < counts["welcome"]:
                await trio.sleep(0.2)
        await trio.sleep(1.0)
        records = list(iter_records(data_dir))
        online = {r["uid"] for r in records if r["kind"] == "online"}
        assert online == {uid for uid, what in outcome.items() if what == "welcome"}
        assert not [r for r in records if r["kind"] == "offline"]
        for client in clients:
            await client.stream.aclose()
