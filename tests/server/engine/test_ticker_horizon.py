"""The tick task never expires a session whose keepalive already waits, unread, in its socket.

A busy event loop (shorter than the stall guard's limit, so no deadline moves) wakes the tick task and the
connection tasks in the same batch, in any order: the tick task must expire only up to the clock it read two
loop turns earlier (idled.server.engine.ticker), by when every task woken by its socket has read and touched.
Real sockets, in this process: the pings are written straight into the kernel, then the loop is held.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import trio

from idled.protocol import PING_FRAME, PONG
from tests.peers import Client, running

USERS = 60


async def test_pings_in_the_socket_before_the_deadline_win_against_a_late_tick(tmp_path: Path) -> None:
    # tick 1 s, keepalive 2 s -> timeout 3 s; the stall guard's limit is 2 ticks: a 0.6 s hold is no pause
    async with running(tmp_path, listen=True, tick=1.0, timeout=3.0) as h:
        start = trio.current_time()
        clients = [await Client.login(h.port, "uid", f"u{i}", keepalive=2.0) for i in range(USERS)]
        assert trio.current_time() - start < 0.5, "the logins took too long for the deadlines below"
        await trio.sleep_until(start + 2.9)  # deadlines: start + 3.0 .. start + 3.5, due at the next whole tick
        for client in clients:
            os.write(client.stream.socket.fileno(), PING_FRAME)  # in the server's socket, not yet read
        # Hold the loop past every due tick (whole seconds of the server clock), for less than 2 ticks: no pause.
        time.sleep(math.ceil(start + 3.5) - trio.current_time() + 0.05)
        for client in clients:
            assert await client.recv(timeout=5.0) is PONG  # not idle_timeout: the ping was there in time
        assert h.metric("idled_presence_events_total", kind="offline", reason="idle") == 0
