"""A thin blocking (non-async) wrapper for scripts: a trio loop in a daemon thread runs the async client.

    with connect_session("127.0.0.1", 7878, "alice", keepalive=30) as session:
        session.send({"hello": 1})          # pings continue in the background thread
    for event in watch("127.0.0.1", 7878, "script", after=0):
        print(event.seq, event.uid, event.kind)
    query("127.0.0.1", 7878, ["alice", "bob"], last_seen=True)   # {"bob": UserStatus(online=False, ...)}
    with connect_observer("127.0.0.1", 7878, "script", uids=["alice"]) as observer:
        observer.watch(["bob"])             # in effect when it returns
        for event in observer: ...

Each call crosses threads once (`trio.from_thread.run`, tens of microseconds): fine for scripts and CLI
commands, not for a hot path -- use `idled.client.trio` or `idled.client.asyncio` there. Errors are the
same `ClientError` types as in the async API.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, Self, overload

import trio

from idled.client.leader import Hosts
from idled.client.link import Link
from idled.client.observer import Observer, UserStatus
from idled.client.session import Session
from idled.client.trio import TRIO, running
from idled.protocol import Event, Uid

__all__ = ["connect_session", "watch", "query", "connect_observer", "BlockingObserver", "BlockingSession"]


class _Portal:
    """A trio event loop in a daemon thread, holding one link for its lifetime."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name="idled-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        try:
            async with running(self.link):
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # the login failed: handed to the constructor's caller
            self._error = exc
        finally:
            self._ready.set()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def close(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()


class _Blocking:
    """What the blocking wrappers share: their portal, closed (the link logged out) by `close()` or on leaving
    the `with` block."""

    def __init__(self, portal: _Portal) -> None:
        self._portal = portal

    def close(self) -> None:
        self._portal.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingSession(_Blocking):
    """A user session driven from blocking code; `close()` (or leaving the `with` block) says bye."""

    def __init__(self, portal: _Portal) -> None:
        super().__init__(portal)
        self.session: Session = portal.link  # type: ignore[assignment]

    def send(self, data: Any = None) -> None:
        self._portal.run(self.session.send, data)


def connect_session(host: Hosts, port: int | None, uid: Uid, **options: Any) -> BlockingSession:
    """Log in as `uid` (options as for `idled.client.trio.open_session`: keepalive, device, ...); raises
    ClientError on failure."""
    return BlockingSession(_Portal(Session(TRIO, host, port, uid, **options)))


def watch(host: Hosts, port: int | None, name: str, **options: Any) -> Iterator[Event]:
    """Presence events as a blocking iterator (options as for `open_observer`: after, reconnect...).
    Closing the generator (break, or garbage collection) logs the observer out."""
    with connect_observer(host, port, name, **options) as observer:
        yield from observer


@overload
def query(host: Hosts, port: int | None, uids: Iterable[Uid], *, name: str = ..., last_seen: Literal[False] = False,
          **options: Any) -> dict[Uid, bool]: ...


@overload
def query(host: Hosts, port: int | None, uids: Iterable[Uid], *, name: str = ..., last_seen: Literal[True],
          **options: Any) -> dict[Uid, UserStatus]: ...


def query(host: Hosts, port: int | None, uids: Iterable[Uid], *, name: str = "idled-query", last_seen: bool = False,
          **options: Any) -> dict[Uid, bool] | dict[Uid, UserStatus]:
    """One query from a query-only observer (logged in as ``name``, then out): which of ``uids`` are online,
    or with ``last_seen=True`` a `UserStatus` each (options as for `open_observer`: token, ssl_context...)."""
    options.setdefault("reconnect", False)
    portal = _Portal(Observer(TRIO, host, port, name, subscribe=False, **options))
    observer: Observer = portal.link  # type: ignore[assignment]
    try:
        result: dict[Uid, bool] | dict[Uid, UserStatus] = portal.run(
            functools.partial(observer.query, tuple(uids), last_seen=last_seen)
        )
        return result
    finally:
        portal.close()


class BlockingObserver(_Blocking):
    """An observer driven from blocking code: iterate for events; `watch`, `unwatch` and `query` as in the
    async API; `close()` (or leaving the `with` block) logs it out."""

    def __init__(self, portal: _Portal) -> None:
        super().__init__(portal)
        self.observer: Observer = portal.link  # type: ignore[assignment]

    def __iter__(self) -> Iterator[Event]:
        while True:
            try:
                yield self._portal.run(self.observer.__anext__)
            except StopAsyncIteration:
                return

    def watch(self, uids: Iterable[Uid]) -> None:
        self._portal.run(self.observer.watch, uids)

    def unwatch(self, uids: Iterable[Uid]) -> None:
        self._portal.run(self.observer.unwatch, uids)

    def query(self, uids: Iterable[Uid]) -> dict[Uid, bool]:
        result: dict[Uid, bool] = self._portal.run(self.observer.query, uids)
        return result


def connect_observer(host: Hosts, port: int | None, name: str, **options: Any) -> BlockingObserver:
    """An observer (options as for `idled.client.trio.open_observer`: after, durable, uids, reconnect...);
    raises ClientError if its login fails."""
    return BlockingObserver(_Portal(Observer(TRIO, host, port, name, **options)))
