"""The API of `idled serve --workers 2`: the core serves it; a kick closes the user's connection on its edge."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from idled.log.eventlog import iter_records
from idled.protocol import Error
from tests import peers
from tests.server.api.httpclient import HttpClient


@pytest.mark.slow
async def test_kick_through_an_edge(tmp_path: Path) -> None:
    api_port = peers.free_port()
    data_dir = tmp_path / "data"
    command = peers.serve_command(data_dir, "--metrics-port", "0", "--fsync", "never", "--workers", "2",
                                  "--api-port", str(api_port))
    async with peers.Daemon(command, tmp_path / "idled.stderr") as daemon:
        users = [await peers.Client.login(daemon.port, "uid", f"u{i}", keepalive=60) for i in range(4)]
        async with await HttpClient.connect(api_port) as c:
            with trio.fail_after(10):
                while not all(u["online"] for u in (await c.get("/v1/presence?uid=u0&uid=u3")).json()["users"]):
                    await trio.sleep(0.05)
            stats = (await c.get("/v1/stats")).json()
            assert stats["users_online"] == 4 and len(stats["workers"]) == 2
            r = await c.post("/v1/kick", {"uid": "u2", "reason": "maintenance"})
            assert r.status == 200 and r.json() == {"ended": 1}
            with trio.fail_after(10):
                error = await users[2].expect(Error)
            assert error.code == "kicked"
            with trio.fail_after(10):
                assert await users[2].recv() is None  # the edge closed the connection
            r = await c.get("/v1/presence?uid=u2&uid=u1")
            assert [u["online"] for u in r.json()["users"]] == [False, True]
        await daemon.stop()
    offline = [r for r in iter_records(data_dir) if r["kind"] == "offline" and r["reason"] == "kicked"]
    assert [(r["uid"], r.get("note")) for r in offline] == [("u2", "maintenance")]
