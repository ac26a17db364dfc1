"""The client for asyncio applications (FastAPI, aiohttp...): `open_session`, `open_gateway`, `open_observer`.

The same roles as `idled.client.trio`, over asyncio streams::

    async with open_gateway("127.0.0.1", 7878, name="edge-1") as gateway:
        await gateway.attach(["alice", "bob"], keepalive=60)
        await gateway.touch(["alice"])               # batched: one frame per flush interval

This module only adapts asyncio to the `Runtime` interface of `idled.client.link`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from idled.client.errors import ConnectFailed, ConnectionLost
from idled.client.gateway import Gateway
from idled.client.leader import Hosts
from idled.client.link import TLS, Link
from idled.client.observer import Observer
from idled.client.session import Session
from idled.protocol import Uid

__all__ = ["ASYNCIO", "AsyncioRuntime", "open_session", "open_gateway", "open_observer", "running"]

T = TypeVar("T")
L = TypeVar("L", bound=Link)


class AsyncioConn:
    """An asyncio (StreamReader, StreamWriter) pair whose failures are ConnectionLost."""

    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def receive_some(self, max_bytes: int | None = None, /) -> bytes:
        try:
            return await self.reader.read(max_bytes or 65536)
        except OSError as exc:
            raise ConnectionLost(f"receive failed: {exc!r}") from None

    async def send_all(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (OSError, RuntimeError) as exc:  # RuntimeError: write after the transport closed
            raise ConnectionLost(f"send failed: {exc!r}") from None

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await self.writer.wait_closed()


class AsyncioRuntime:
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def connect(self, host: str, port: int, tls: TLS | None = None) -> AsyncioConn:
        # (asyncio's streams take no session to resume: a reconnect is a full handshake.)
        options: dict[str, Any] = {} if tls is None else {"ssl": tls.context, "server_hostname": tls.server_hostname or host}
        try:
            return AsyncioConn(*await asyncio.open_connection(host, port, **options))
        except OSError as exc:
            raise ConnectFailed(host, port, exc) from None

    async def race(self, *fns: Callable[[], Awaitable[Any]]) -> Any:
        tasks = [asyncio.ensure_future(fn()) for fn in fns]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return next(iter(done)).result()

    async def with_timeout(self, seconds: float, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(seconds):
                return await fn()
        except TimeoutError:
            raise ConnectionLost(f"timed out after {seconds} s") from None

    def event(self) -> asyncio.Event:
        return asyncio.Event()

    def lock(self) -> asyncio.Lock:
        return asyncio.Lock()


ASYNCIO = AsyncioRuntime()


@asynccontextmanager
async def running(link: L) -> AsyncIterator[L]:
    """Run `link` in a background task for the block; enter once logged in, leave after `bye`."""
    task = asyncio.create_task(link.run())
    try:
        await link.wait_connected()
        yield link
    finally:
        try:
            await link.aclose()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def open_session(host: Hosts, port: int | None, uid: Uid, **options: Any) -> Any:
    """A user session (see `idled.client.session.Session` for the options: token, keepalive, device,
    reconnect...)."""
    return running(Session(ASYNCIO, host, port, uid, **options))


def open_gateway(host: Hosts, port: int | None, name: str, **options: Any) -> Any:
    """A gateway (options: token, flush_interval, max_pending, on_ended, notices, reconnect...)."""
    return running(Gateway(ASYNCIO, host, port, name, **options))


def open_observer(host: Hosts, port: int | None, name: str, **options: Any) -> Any:
    """An observer (options: token, after, durable (default: True when `after` is given), uids (a watchlist:
    only these uids' events; then `watch()` / `unwatch()`), subscribe, buffer, reconnect...)."""
    return running(Observer(ASYNCIO, host, port, name, **options))
