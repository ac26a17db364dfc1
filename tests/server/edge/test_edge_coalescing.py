"""An edge's user plane coalesces its polls (idled.server.roles.plane, *Coalescing*); an edge answers a mark
only after draining it (idled.server.edge.link, *Watermarks*), so a keepalive it let gather still counts.

In-process: a real core (``tests.peers.running``) on a loopback port, an in-process ``Edge`` linked to it, a
user on the edge. The plane is made to poll at most every 4 s -- far longer than the user's 1.5 s timeout --
so her pings sit unread in the edge's socket when the core holds her session and asks the edge for a mark.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from idled.ops.config import Config
from idled.protocol import Event, Login, Welcome
from idled.server.edge import Edge
from tests import peers
from tests.peers import running
from tests.server.roles.test_plane import pings_through_a_long_coalescing


async def test_keepalives_an_edge_let_gather_count_before_it_answers_a_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import idled.server.roles.plane as plane_module

    monkeypatch.setattr(plane_module, "COALESCE", 4.0)
    async with running(tmp_path, listen=True, tick=0.1, timeout=1.5) as h, trio.open_nursery() as nursery:
        observer = await h.observer()
        config = Config(port=0, host="127.0.0.1", metrics_port=0, data_dir=str(tmp_path / "edge")).validate()
        ports = await nursery.start(Edge(config, core=f"127.0.0.1:{h.port}", name="edge-c").serve)
        alice = await peers.Client.connect(ports[0])
        await alice.send(Login("uid", "alice", None, 1.0))  # timeout 1.5 s
        await alice.expect(Welcome)
        assert (await observer.expect(Event)).kind == "online"
        await pings_through_a_long_coalescing(alice, observer)
        nursery.cancel_scope.cancel()
