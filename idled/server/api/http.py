"""One HTTP/1.1 connection of the API, served with h11 (sans-IO) on a trio stream.

Theory of operation
-------------------
h11 parses and frames; this loop only moves bytes and enforces the limits, one request at a time:

* **Keep-alive and pipelining.** After a response, ``start_next_cycle`` and the next request is read --
  first from what h11 has already buffered, so a client that sent many requests at once gets every answer,
  in order, on the one connection.
* **Limits.** The request head: h11's ``max_incomplete_event_size`` (beyond: 431), ``max_body`` too, at least
  ``MIN_HEAD``: a GET carries its uids in the request line (10,000 uids: ~100 KB). The body:
  ``max_body`` (a larger ``Content-Length`` is refused before any of it is read, a chunked one once it passes
  the cap: 413, and the connection closes, its remaining bytes unread). Time: each request, from its first
  byte to its last, and its handling, must fit in ``timeout`` (else 408 and close: a slowloris gets nothing
  more); a kept-alive connection waits ``timeout`` at most for the next request, then is closed quietly.
* **Closing.** Any protocol error (h11's ``RemoteProtocolError``) is answered with the status h11 suggests
  when a response can still be sent, then the connection closes. ``closing()`` (the server is stopping)
  makes the current response the last (``Connection: close``); a connection idle between requests is
  cancelled at once through ``idle``, a cancel scope its owner may cancel.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import h11
import trio

from idled.server.api.errors import ApiError
from idled.server.api.routes import OTHER_ROUTE, Answer

__all__ = ["MIN_HEAD", "RECEIVE_BYTES", "HttpConnection", "encode_json"]

log = logging.getLogger("idled.server.api")

MIN_HEAD: Final = 16 * 1024  # bytes of request line + headers allowed at least (h11's own default)
RECEIVE_BYTES: Final = 65536
LINGER: Final = 1.0  # seconds a connection closed after an error answer still reads (see _linger)
LINGER_BYTES: Final = 4 << 20
SERVER_HEADER: Final = (b"Server", b"idled")

Dispatch = Callable[[str, bytes, Sequence[tuple[bytes, bytes]], bytes, str], Awaitable[Answer]]
Observe = Callable[[str, int, float], None]


def encode_json(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class _Close(Exception):
    """End the connection now, without a response (timeout while idle, EOF, a broken stream)."""


class HttpConnection:
    """Serves requests on ``stream`` until the client closes, a limit is hit, or the server stops (``single``:
    after one request)."""

    def __init__(self, stream: trio.abc.Stream, client: str, dispatch: Dispatch, *, max_body: int, timeout: float,
                 observe: Observe, closing: Callable[[], bool], single: bool = False) -> None:
        self.stream = stream
        self.client = client
        self.dispatch = dispatch
        self.max_body = max_body
        self.timeout = timeout
        self.observe = observe
        self.closing = closing
        self.single = single  # answer one request, then close
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max(MIN_HEAD, max_body))
        self.idle: trio.CancelScope | None = None  # set while waiting for the next request
        self.linger = False  # closing after an error answer (see _linger)

    async def serve(self) -> None:
        try:
            while await self._one():
                self.conn.start_next_cycle()
        except _Close:
            pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if self.linger:
                await self._linger()
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await self.stream.aclose()

    async def _linger(self) -> None:
        """After an error answer, with the client's bytes maybe still coming (a body too large): half-close
        and read what comes for a moment, so the kernel does not reset the connection (and lose the answer)."""
        stream = self.stream
        with trio.move_on_after(LINGER):
            try:
                if isinstance(stream, trio.SocketStream):
                    await stream.send_eof()
                drained = 0
                while drained < LINGER_BYTES and (chunk := await stream.receive_some(RECEIVE_BYTES)):
                    drained += len(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _one(self) -> bool:
        """Read, answer and send one request; False: the connection ends after it."""
        try:
            request, deadline = await self._wait_request()
            with trio.move_on_at(deadline) as scope:
                request = await self._head(request)
                body = await self._body(request)
                started = trio.current_time()
                route, status, document, headers = await self.dispatch(
                    request.method.decode("ascii", "replace"), request.target, request.headers, body, self.client)
            if scope.cancelled_caught:
                raise ApiError("timeout", f"the request took more than {self.timeout:g} s")
        except ApiError as exc:
            return await self._fail(OTHER_ROUTE, exc.status, exc.document(), exc.headers)
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            code = "headers_too_large" if status == 431 else "bad_request"
            return await self._fail(OTHER_ROUTE, status, ApiError(code, str(exc) or "bad request").document(), ())
        keep = not (self.single or self.closing())
        await self._respond(status, document, headers, keep)
        self.observe(route, status, trio.current_time() - started)
        return keep and self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE

    async def _wait_request(self) -> tuple[Any, float]:
        """The next request's first event (or NEED_DATA: its head is not whole yet) and the request's deadline,
        counted from its first byte. Raises _Close when the client is gone or stays silent too long."""
        event = self.conn.next_event()  # a pipelined request may be buffered already: no wait
        if event is h11.NEED_DATA:
            data = b""
            with trio.CancelScope(deadline=trio.current_time() + self.timeout) as self.idle:
                data = bytes(await self.stream.receive_some(RECEIVE_BYTES))
            self.idle = None
            if not data or self.closing():
                raise _Close  # closed, silent for too long, or the server stops: nothing to answer
            self.conn.receive_data(data)
            event = self.conn.next_event()
        return event, trio.current_time() + self.timeout

    async def _head(self, event: Any) -> h11.Request:
        if event is h11.NEED_DATA:
            event = await self._next_event()
        if not isinstance(event, h11.Request):
            raise _Close
        return event

    async def _next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = bytes(await self.stream.receive_some(RECEIVE_BYTES))
            if not data and self.conn.their_state is h11.IDLE:
                raise _Close  # closed between requests: nothing to answer
            self.conn.receive_data(data)

    async def _body(self, request: h11.Request) -> bytes:
        length = next((value for name, value in request.headers if name == b"content-length"), None)
        if length is not None and int(length) > self.max_body:
            raise ApiError("too_large", f"the body is larger than {self.max_body} bytes")
        if self.conn.they_are_waiting_for_100_continue:
            await self.stream.send_all(self.conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.max_body:
                    raise ApiError("too_large", f"the body is larger than {self.max_body} bytes")
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:
                raise _Close

    async def _fail(self, route: str, status: int, document: Any, headers: tuple[tuple[str, str], ...]) -> bool:
        """Answer an error that ends the connection (when an answer can still be sent)."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            with trio.move_on_after(self.timeout):
                await self._respond(status, document, headers, keep=False)
            self.observe(route, status, 0.0)
            self.linger = True
        return False

    async def _respond(self, status: int, document: Any, headers: tuple[tuple[str, str], ...], keep: bool) -> None:
        body = encode_json(document)
        head = [(b"Content-Type", b"application/json"), (b"Content-Length", str(len(body)).encode()), SERVER_HEADER,
                *((name.encode(), value.encode("latin-1")) for name, value in headers)]
        if not keep:
            head.append((b"Connection", b"close"))
        conn = self.conn
        data = conn.send(h11.Response(status_code=status, headers=head)) or b""
        data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        with trio.move_on_after(self.timeout):
            await self.stream.send_all(data)
