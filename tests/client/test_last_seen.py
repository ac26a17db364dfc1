"""`query(uids, last_seen=True)` under trio, asyncio and the blocking wrapper, against a real `idled serve`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import pytest
import trio

import idled.client.asyncio as asyncio_lib
import idled.client.trio as trio_lib
from idled.client import UserStatus
from idled.client.blocking import connect_session, query

from tests.client.support import HOST, Idled

pytestmark = pytest.mark.slow  # real idled daemons


async def scenario(lib: ModuleType, sleep: Callable[[float], Awaitable[Any]], idled: Idled) -> None:
    async with lib.open_observer(HOST, idled.port, "obs", subscribe=False) as observer:
        async with lib.open_session(HOST, idled.port, "bob", keepalive=30):
            async with lib.open_session(HOST, idled.port, 42, keepalive=30):
                await sleep(0.1)
                online = await observer.query(["bob", 42, "42"])
                assert online == {"bob": True, 42: True, "42": False}  # without the flag: today's answer
            left = time.time()
            answer = await observer.query(["bob", 42, "42"], last_seen=True)
        assert set(answer) == {"bob", 42, "42"}
        assert answer["bob"].online and answer["bob"].devices == ()
        assert answer["bob"].last_seen is not None and abs(answer["bob"].last_seen - time.time()) < 1.0
        assert answer[42] == UserStatus(False, answer[42].last_seen)
        assert answer[42].last_seen is not None and left - 0.5 <= answer[42].last_seen <= time.time()
        assert answer["42"] == UserStatus(False, None)


async def test_trio(idled: Idled) -> None:
    await scenario(trio_lib, trio.sleep, idled)


def test_asyncio(idled: Idled) -> None:
    asyncio.run(scenario(asyncio_lib, asyncio.sleep, idled))


def test_blocking(idled: Idled) -> None:
    with connect_session(HOST, idled.port, "carol", keepalive=30):
        assert query(HOST, idled.port, ["carol"]) == {"carol": True}
    answer = query(HOST, idled.port, ["carol", "nobody"], last_seen=True)
    assert not answer["carol"].online and answer["carol"].last_seen is not None
    assert answer["nobody"] == UserStatus(False, None, ())
