"""A connect that finds nothing listening is a `ConnectFailed`: still a retryable `ConnectionLost` for the
library's reconnect loop, with the operating system's reason said once (not trio's "all attempts to connect
... failed") and `refused` set, so a command line can suggest starting the daemon. Real loopback sockets."""

from __future__ import annotations

import asyncio
import socket

import pytest

from idled.client.asyncio import AsyncioRuntime
from idled.client.errors import ConnectFailed, ConnectionLost
from idled.client.trio import TrioRuntime


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check(error: ConnectFailed, port: int) -> None:
    assert isinstance(error, ConnectionLost) and error.retryable and error.refused
    assert error.reason == f"connect to 127.0.0.1:{port} failed: Connection refused"


async def test_trio_runtime_raises_connect_failed() -> None:
    port = dead_port()
    with pytest.raises(ConnectFailed) as info:
        await TrioRuntime().connect("127.0.0.1", port)
    check(info.value, port)


def test_asyncio_runtime_raises_connect_failed() -> None:
    port = dead_port()
    with pytest.raises(ConnectFailed) as info:
        asyncio.run(AsyncioRuntime().connect("127.0.0.1", port))
    check(info.value, port)


async def test_an_unknown_host_is_not_refused() -> None:
    with pytest.raises(ConnectFailed) as info:
        await TrioRuntime().connect("no-such-host.invalid", 7878)
    assert not info.value.refused and "no-such-host.invalid:7878" in info.value.reason
