"""The client for trio applications: `open_session`, `open_gateway`, `open_observer`.

Each is an async context manager that runs the connection in a background task of its own nursery, returns
once the first login succeeded (or raises its `ClientError`), and on exit logs out and stops::

    async with open_session("127.0.0.1", 7878, uid="alice", keepalive=30) as session:
        await session.send({"hello": "world"})      # pings happen by themselves

This module only adapts trio to the `Runtime` interface of `idled.client.link`; the roles are written once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from idled.client.errors import ClientError, ConnectFailed, ConnectionLost
from idled.client.gateway import Gateway
from idled.client.leader import Hosts
from idled.client.link import TLS, Link
from idled.client.observer import Observer
from idled.client.session import Session
from idled.protocol import Uid
from idled.protocol.address import format_address

__all__ = ["TRIO", "TrioRuntime", "open_session", "open_gateway", "open_observer", "running"]

T = TypeVar("T")
L = TypeVar("L", bound=Link)
_IO_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class TrioConn:
    """A trio SocketStream (or SSLStream over one) whose failures are ConnectionLost."""

    __slots__ = ("stream", "tls")

    def __init__(self, stream: trio.abc.Stream, tls: TLS | None = None) -> None:
        self.stream = stream
        self.tls = tls

    async def receive_some(self, max_bytes: int | None = None, /) -> bytes | bytearray:  # as trio's streams
        try:
            return await self.stream.receive_some(max_bytes)
        except _IO_ERRORS as exc:
            raise ConnectionLost(f"receive failed: {exc!r}") from None

    async def send_all(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except _IO_ERRORS as exc:
            raise ConnectionLost(f"send failed: {exc!r}") from None

    async def aclose(self) -> None:
        if self.tls is not None and isinstance(self.stream, trio.SSLStream):
            session = self.stream.session  # TLS 1.3: the ticket arrived after the handshake, so read it now
            if session is not None and session.has_ticket:
                self.tls.session = session
        with trio.move_on_after(1.0) as scope:  # TLS: close_notify first, bounded; the socket closes regardless
            scope.shield = True
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # (a TLS stream whose socket is already gone: nothing left to close)


class TrioRuntime:
    def now(self) -> float:
        return trio.current_time()

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(max(0.0, seconds))

    async def connect(self, host: str, port: int, tls: TLS | None = None) -> TrioConn:
        try:
            tcp = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise ConnectFailed(host, port, exc) from None
        if tls is None:
            return TrioConn(tcp)
        stream = trio.SSLStream(tcp, tls.context, server_hostname=tls.server_hostname or host)
        if tls.session is not None:
            stream.session = tls.session  # resumed if the server still takes the ticket, else a full handshake
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            await trio.aclose_forcefully(tcp)
            raise ConnectionLost(f"TLS handshake with {format_address((host, port))} failed: {exc.__cause__ or exc}") from None
        return TrioConn(stream, tls)

    async def race(self, *fns: Callable[[], Awaitable[Any]]) -> Any:
        outcome: list[tuple[bool, Any]] = []

        async with trio.open_nursery() as nursery:
            async def one(fn: Callable[[], Awaitable[Any]]) -> None:
                try:
                    outcome.append((True, await fn()))
                except ClientError as exc:  # unwrapped: out of the nursery it would be an ExceptionGroup
                    outcome.append((False, exc))
                nursery.cancel_scope.cancel()

            for fn in fns:
                nursery.start_soon(one, fn)
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    async def with_timeout(self, seconds: float, fn: Callable[[], Awaitable[T]]) -> T:
        with trio.move_on_after(seconds):
            return await fn()
        raise ConnectionLost(f"timed out after {seconds} s")

    def event(self) -> trio.Event:
        return trio.Event()

    def lock(self) -> trio.Lock:
        return trio.Lock()


TRIO = TrioRuntime()


@asynccontextmanager
async def running(link: L) -> AsyncIterator[L]:
    """Run `link` in the background for the block; enter once logged in, leave after `bye`."""
    # An exception of the block (or the login's ClientError) is re-raised outside the nursery, so the caller
    # sees it as raised, not wrapped in an ExceptionGroup.
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        try:
            await link.wait_connected()
            yield link
        except Exception as exc:
            failure = exc
        finally:
            with trio.CancelScope(shield=True):
                await link.aclose()
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


def open_session(host: Hosts, port: int | None, uid: Uid, **options: Any) -> Any:
    """A user session (see `idled.client.session.Session` for the options: token, keepalive, device,
    reconnect...)."""
    return running(Session(TRIO, host, port, uid, **options))


def open_gateway(host: Hosts, port: int | None, name: str, **options: Any) -> Any:
    """A gateway (options: token, flush_interval, max_pending, on_ended, notices, reconnect...)."""
    return running(Gateway(TRIO, host, port, name, **options))


def open_observer(host: Hosts, port: int | None, name: str, **options: Any) -> Any:
    """An observer (options: token, after, durable (default: True when `after` is given), uids (a watchlist:
    only these uids' events; then `watch()` / `unwatch()`), subscribe, buffer, reconnect...)."""
    return running(Observer(TRIO, host, port, name, **options))
