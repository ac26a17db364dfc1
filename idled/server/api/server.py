"""The API's listener: accept, admit (``api_max_clients``), serve each connection, close on shutdown.

Theory of operation
-------------------
``Api.serve`` serves the listeners the door opened on ``api_host:api_port`` (``idled.door``: refused with
auth off on an address that is not local, as every listener is), reports the port through ``task_status`` and
accepts in its own nursery, one task per connection (``http.HttpConnection``), each through the door's gate
first: a share per source address (``max_pending_per_address``) of the connections that have not yet made
a request with a good token (auth off: a whole request) -- beyond it a connection is closed unread, so one
address's silent or slow connections cannot take the room of the others'; the connection tells the gate
once it has shown a token (``entry.authenticated()``), and stops counting against its address. Connections
beyond ``api_max_clients`` are answered ``503 unavailable`` from their head (their body never read) and
closed (a short deadline each; beyond twice the limit they are closed unanswered, so a flood never holds
more than that many tasks). ``close()`` (the server stops): stop
accepting, cancel every connection waiting between requests; a request in progress is answered, with
``Connection: close``. A handler's failure is contained in ``routes.Router`` (500, logged); a connection's
own failure ends that connection only.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Final, NoReturn

import trio

from idled.door.addresses import bound_address, display, host_of
from idled.door.gate import Entry, Gate
from idled.ops.config import Config
from idled.server.api.backend import Backend
from idled.server.api.errors import ApiError
from idled.server.api.http import HttpConnection
from idled.server.api.metrics import ApiMetrics
from idled.server.api.routes import OTHER_ROUTE, Answer, Router, Ticket

__all__ = ["REFUSE_TIMEOUT", "Api"]

log = logging.getLogger("idled.server.api")

REFUSE_TIMEOUT: Final = 1.0  # seconds a connection beyond api_max_clients gets to send its request (then 503)


class Api:
    def __init__(self, config: Config, backend: Backend, *, secret: bytes | None, metrics: ApiMetrics,
                 gate: Gate) -> None:
        self.config = config
        self.gate = gate  # the door's (idled.door.door.api_gate): connections not yet authenticated, per address
        self.metrics = metrics
        self.router = Router(backend, config, secret, api_connections=lambda: self.open)
        self.open = 0  # connections being served
        self.refusing = 0  # connections beyond the limit, being answered 503
        self.closing = False
        self.port = 0
        self._accepting = trio.CancelScope()
        self._connections: set[HttpConnection] = set()

    async def serve(self, listeners: Sequence[trio.SocketListener],
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``listeners`` (opened by the door, ``idled.door.door``) until ``close()`` or cancelled."""
        addresses = [bound_address(listener) for listener in listeners]
        self.port = addresses[0][1] or 0
        # Accept loops under their own scope, connections in the outer nursery: close() stops the accepting (the
        # listeners close) and leaves the connections to end as close() told them.
        async with trio.open_nursery() as handlers:
            with self._accepting:
                async with trio.open_nursery() as accepting:
                    await accepting.start(functools.partial(trio.serve_listeners, self._handle, list(listeners),
                                                            handler_nursery=handlers))
                    if self.router.events is not None:  # the event streams' fan-out (idled.server.api.events)
                        accepting.start_soon(self.router.events.run)  # (ends with the accepting)
                    log.info("HTTP API on http://%s", display(addresses[0][0], self.port))
                    task_status.started(self.port)

    def close(self) -> None:
        """Stop accepting; end idle connections now, busy ones after their response."""
        self.closing = True
        self._accepting.cancel()
        for connection in list(self._connections):
            if connection.idle is not None:
                connection.idle.cancel()
            if connection.streaming is not None:  # an event stream: its end event, then the close
                connection.streaming.stop()

    async def _handle(self, stream: trio.SocketStream) -> None:
        # The gate (idled.door.gate): the source's share; at api_max_clients the oldest connection without an
        # authenticated request makes room, and when every one has shown a token the newcomer is answered 503.
        async with self.gate.enter(stream, self.config.api_request_timeout, self._full) as entry:
            client = host_of(entry.address)
            if entry.refused is None:
                await self._serve(stream, entry, client)
            elif entry.refused.reason == "busy":
                await self._refuse(stream, client)
            else:
                await trio.aclose_forcefully(stream)  # one address's share is full: not even read

    def _full(self) -> bool:
        return self.open >= self.config.api_max_clients

    async def _serve(self, stream: trio.SocketStream, entry: Entry, client: str) -> None:
        connection = HttpConnection(stream, client, self.router, max_body=self.config.api_max_body,
                                    timeout=self.config.api_request_timeout, observe=self.metrics.observe,
                                    closing=lambda: self.closing, authenticated=entry.authenticated)
        self.open += 1
        self.metrics.connections.inc()
        self._connections.add(connection)
        try:
            await connection.serve()
        except Exception:  # a bug of this connection's own: it ends, the API and the daemon go on
            log.exception("HTTP API: connection from %s failed", client)
        finally:
            self._connections.discard(connection)
            self.open -= 1
            self.metrics.connections.dec()

    async def _refuse(self, stream: trio.SocketStream, client: str) -> None:
        if self.refusing >= self.config.api_max_clients:
            await trio.aclose_forcefully(stream)
            return
        self.refusing += 1
        try:
            connection = HttpConnection(stream, client, _Busy(self.config.api_max_clients),
                                        max_body=self.config.api_max_body, timeout=REFUSE_TIMEOUT,
                                        observe=self.metrics.observe, closing=lambda: False, single=True)
            await connection.serve()
        finally:
            self.refusing -= 1


class _Busy:
    """The dispatcher of a connection beyond ``api_max_clients``: every request is refused from its head."""

    def __init__(self, max_clients: int) -> None:
        self.answer: Answer = (OTHER_ROUTE, 503, ApiError("unavailable", f"more than {max_clients} HTTP API "
                               "connections").document(), (("Retry-After", "1"),))

    def admit(self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], client: str) -> Answer:
        return self.answer

    async def run(self, ticket: Ticket, body: bytes) -> NoReturn:
        raise AssertionError("never admitted")
