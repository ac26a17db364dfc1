"""One HTTP/1.1 connection of the API, served with h11 (sans-IO) on a trio stream.

Theory of operation
-------------------
h11 parses and frames; this loop moves bytes, decides what h11 is handed, and enforces the limits, one
request at a time:

* **What h11 sees.** Received bytes wait in an ``Inbox`` (``idled.protocol.httphead``); h11 is handed one whole request head, then
  exactly the body its Content-Length announces -- never the next request, which stays in the inbox. So
  every head is checked there before h11 parses it (CRLF line ends only: a bare LF is ``400``; no obs-fold:
  ``400``; the head limit), and pipelining is the inbox's next head: a client that sent many requests at
  once gets every answer, in order, on the one connection.
* **The head first** (RFC 9112). A head with both Content-Length and Transfer-Encoding is ``400`` and the
  connection closes (6.1: a proxy in front may have framed it by the other header, and what follows would be
  a request it never saw); Transfer-Encoding without Content-Length is ``411 length_required`` and closes
  (6.3 lets a server ask for a length: every body here is a small JSON document, and a length known from the
  head is a limit checked before any of it is read). Then the router (``routes.Router.admit``) judges the
  head: route, browsers, rate limit, bearer token, media type. Refused, the answer goes at once and the body
  is never read: a request without a body keeps the connection, one with a body closes it (its bytes are not
  read to find the next request), and so does a refusal that says ``Connection: close`` (with auth on, every
  refusal of a request that showed no good token: one answer per unauthenticated connection, whatever its
  status). Admitted, ``authenticated()`` tells the door's gate the connection showed a good token (with auth
  off: once a whole request has arrived), and only then is the body read -- ``100 Continue`` first when the
  client waits for it.
* **HEAD** is answered like GET (the router runs GET's handler): same status and headers, the Content-Length
  of the body GET would send, no body. HEAD on a route without GET is ``405`` with ``Allow``.
* **Limits**, exact: the head ``MAX_HEAD`` bytes, request line to the empty line (beyond: ``431``; a GET
  carries its uids in the request line, so a large batch goes by POST); while the head is incomplete the
  connection reads at most what the head may still take, so a client that has shown no token holds at
  most ``MAX_HEAD`` bytes here. The body ``max_body`` bytes (more announced: ``413`` from the head, nothing of
  it read). Time: each request, from its first byte to its last, and its handling, must fit in ``timeout``
  (else ``408`` and close: a slowloris gets nothing more); a kept-alive connection waits ``timeout`` at most
  for the next request, then is closed quietly.
* **Answers** carry the standard reason phrase on the status line (``REASONS``); h11's refusals are said in
  the client's terms (``protocol_error``: its own texts name its internals, ``bytearray(b'...')``).
* **Closing.** Any protocol error (h11's ``RemoteProtocolError``, the inbox's) is answered when a response can
  still be sent, then the connection closes -- after a short linger (``LINGER``): half-closed, the client's
  remaining bytes read and dropped, so the kernel does not reset the connection and lose the answer.
  ``closing()`` (the server is stopping) makes the current response the last (``Connection: close``); a
  connection idle between requests is cancelled at once through ``idle``, a cancel scope its owner may cancel.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any, Final, Protocol

import h11
import trio

from idled.protocol.httphead import HeadError, Inbox
from idled.server.api.errors import ApiError
from idled.server.api.events import EventStream
from idled.server.api.routes import OTHER_ROUTE, Answer, Ticket

__all__ = ["MAX_HEAD", "REASONS", "RECEIVE_BYTES", "Dispatcher", "HttpConnection", "encode_json", "protocol_error"]

log = logging.getLogger("idled.server.api")

MAX_HEAD: Final = 16 * 1024  # bytes of request line + headers + empty line: the usual proxies' default
RECEIVE_BYTES: Final = 65536  # one read of an admitted body
LINGER: Final = 1.0  # seconds a connection closed after an answer still reads (see _linger)
LINGER_BYTES: Final = 4 << 20
SERVER_HEADER: Final = (b"Server", b"idled")
REASONS: Final = {status.value: status.phrase.encode() for status in HTTPStatus}  # the status line's phrase
# h11's messages (they name its internals: "illegal request line: bytearray(b'...')") said in the client's
# terms, by their first words; anything else is a malformed request.
H11_MESSAGES: Final = (
    ("illegal request line", "malformed request line: expected METHOD TARGET HTTP/1.1, the target in ASCII"),
    ("no request line", "malformed request line: expected METHOD TARGET HTTP/1.1, the target in ASCII"),
    ("illegal header line", "malformed header line: expected Name: value"),
    ("continuation line", "a header line begins with a space or a tab (obsolete line folding)"),
    ("bad content-length", "Content-Length must be a decimal number"),
    ("conflicting content-length", "more than one Content-Length, with different values"),
    ("found multiple host", "more than one Host header"),
    ("missing mandatory host", "an HTTP/1.1 request needs a Host header"),
    ("receive buffer too long", f"the request head is larger than {MAX_HEAD} bytes"),
    ("peer unexpectedly closed", "the connection closed in the middle of a request"),
)

Observe = Callable[[str, int, float], None]


class Dispatcher(Protocol):
    """What the loop asks about each request (``routes.Router``; the server's 503 refusal)."""

    def admit(self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]],
              client: str) -> Ticket | Answer: ...

    async def run(self, ticket: Ticket, body: bytes) -> Answer: ...


def encode_json(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class _Close(Exception):
    """End the connection now, without a response (timeout while idle, EOF, a broken stream)."""


class HttpConnection:
    """Serves requests on ``stream`` until the client closes, a limit is hit, or the server stops (``single``:
    after one request). ``authenticated``: called once a request on it showed a good token (auth off: once a
    whole request arrived) -- the door's gate then stops counting it against its address."""

    def __init__(self, stream: trio.abc.Stream, client: str, dispatcher: Dispatcher, *, max_body: int,
                 timeout: float, observe: Observe, closing: Callable[[], bool],
                 authenticated: Callable[[], None] = lambda: None, single: bool = False) -> None:
        self.stream = stream
        self.client = client
        self.dispatcher = dispatcher
        self.max_body = max_body
        self.timeout = timeout
        self.observe = observe
        self.closing = closing
        self.authenticated = authenticated
        self.single = single  # answer one request, then close
        self.inbox = Inbox(MAX_HEAD)
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.idle: trio.CancelScope | None = None  # set while waiting for the next request
        self.linger = False  # closing after an answer, with the client's bytes maybe still coming (see _linger)
        self.head_only = False  # the request is a HEAD: its answers carry no body
        self.streaming: EventStream | None = None  # the event stream being sent (GET /v1/events)

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
        """After a last answer, with the client's bytes maybe still coming (a body not read): half-close and
        read what comes for a moment, so the kernel does not reset the connection (and lose the answer)."""
        stream = self.stream
        self.inbox.data.clear()  # what it still held (a body's first bytes, read with its head) is not needed
        with trio.move_on_after(LINGER):
            try:
                if isinstance(stream, trio.SocketStream):
                    await stream.send_eof()
                drained, read = 0, 1
                while read and drained < LINGER_BYTES:
                    read = await _drain(stream)
                    drained += read
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _one(self) -> bool:
        """Read, answer and send one request; False: the connection ends after it."""
        self.head_only = False
        try:
            deadline = await self._wait_request()
            with trio.move_on_at(deadline) as scope:
                request = await self._head()
                self.head_only = request.method == b"HEAD"
                (route, status, document, headers), keep, started = await self._answer(request)
            if scope.cancelled_caught:
                raise ApiError("timeout", f"the request took more than {self.timeout:g} s")
        except ApiError as exc:
            return await self._fail(OTHER_ROUTE, exc.status, exc.document(), exc.headers)
        except h11.RemoteProtocolError as exc:
            error = protocol_error(exc)
            return await self._fail(OTHER_ROUTE, error.status, error.document(), ())
        keep = keep and not (self.single or self.closing())
        if isinstance(document, EventStream):  # GET /v1/events: streamed until it ends, then the connection
            return await self._stream(route, document, request, started)
        await self._respond(status, document, headers, keep)
        self.observe(route, status, trio.current_time() - started)
        # closing with bytes of the client's maybe unread (a body refused, requests pipelined): see _linger
        self.linger = not keep and (self.conn.their_state is not h11.DONE or bool(self.inbox.data))
        return keep and self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE

    async def _stream(self, route: str, events: EventStream, request: h11.Request, started: float) -> bool:
        """Answer with an event stream (``idled.server.api.events``): refused from the request's headers
        (``Last-Event-ID``, a start no longer retained) like any answer, else streamed until the client goes,
        stalls, or the server stops (``streaming.stop()``); the connection closes after it."""
        try:
            await events.open(request.headers)
        except ApiError as exc:
            return await self._fail(route, exc.status, exc.document(), exc.headers)
        conn = self.conn
        head = conn.send(h11.Response(status_code=200, reason=REASONS[200], headers=[
            (b"Content-Type", b"text/event-stream; charset=utf-8"), (b"Cache-Control", b"no-store"),
            (b"X-Accel-Buffering", b"no"), SERVER_HEADER, (b"Connection", b"close")])) or b""
        self.observe(route, 200, trio.current_time() - started)
        if self.head_only or self.closing():
            await events.run(self.stream, head, False, lambda: conn.send(h11.EndOfMessage()) or b"", once=True)
            return False
        self.streaming = events
        try:
            # h11 frames the head (and the end); chunked (an HTTP/1.1 client) or not, the events are framed by
            # the stream: one chunk's bytes are made once for every follower (idled.server.api.events).
            await events.run(self.stream, head, request.http_version == b"1.1",
                             lambda: conn.send(h11.EndOfMessage()) or b"")
        finally:
            self.streaming = None
        return False

    async def _answer(self, request: h11.Request) -> tuple[Answer, bool, float]:
        """The answer to a request whose head is in, whether the connection may stay open after it, and when
        its handling began: the head judged first, the body read only once it is admitted (module docstring)."""
        length = _body_length(request)
        verdict = self.dispatcher.admit(request.method.decode("ascii", "replace"), request.target, request.headers,
                                        self.client)
        if not isinstance(verdict, Ticket):  # refused from its head: the body is not read
            if length or _closes(verdict[3]):
                return verdict, False, trio.current_time()
            await self._body(0)  # (nothing to read: the end of the request, for h11)
            return verdict, True, trio.current_time()
        if verdict.token:
            self.authenticated()
        if length > self.max_body:
            raise ApiError("too_large", f"the body is larger than {self.max_body} bytes")
        body = await self._body(length)
        self.authenticated()  # (auth off: a whole request arrived; with a token: done already, idempotent)
        started = trio.current_time()
        return await self.dispatcher.run(verdict, body), True, started

    async def _receive(self, max_bytes: int) -> bool:
        """Read up to ``max_bytes`` into the inbox; False: the client closed."""
        data = await self.stream.receive_some(max_bytes)
        self.inbox.data += data
        return bool(data)

    async def _wait_request(self) -> float:
        """Wait for the next request's first byte (it may be in the inbox already: no wait), and return the
        request's deadline, counted from it. Raises _Close when the client is gone or stays silent too long."""
        if not self.inbox.data:
            received = False
            with trio.CancelScope(deadline=trio.current_time() + self.timeout) as self.idle:
                received = await self._receive(self.inbox.room())
            self.idle = None
            if not received or self.closing():
                raise _Close  # closed, silent for too long, or the server stops: nothing to answer
        return trio.current_time() + self.timeout

    async def _head(self) -> h11.Request:
        """The request head, read no further than it (ApiError: bare LF, too large; h11's errors)."""
        try:
            while (head := self.inbox.head()) is None:
                if not await self._receive(self.inbox.room()):
                    raise ApiError("bad_request", "the connection closed in the middle of a request head")
        except HeadError as exc:
            raise ApiError(exc.code, exc.message) from None
        self.conn.receive_data(head)
        event = self.conn.next_event()
        if not isinstance(event, h11.Request):  # (a whole head is a request, or h11 raised)
            raise _Close
        return event

    async def _body(self, length: int) -> bytes:
        """The body: h11 is handed exactly ``length`` bytes, read as they are needed."""
        if length and self.conn.they_are_waiting_for_100_continue:
            await self.stream.send_all(self.conn.send(h11.InformationalResponse(status_code=100, headers=[],
                                                                               reason=REASONS[100])) or b"")
        chunks: list[bytes] = []
        wanted = length
        while True:
            event = self.conn.next_event()
            if isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            elif event is h11.NEED_DATA:
                if self.inbox.data:  # (read with the head, or before it)
                    piece = self.inbox.take(wanted)
                else:  # straight to h11 (bytes() of bytes is no copy): never more than the body still wants
                    piece = bytes(await self.stream.receive_some(min(RECEIVE_BYTES, wanted)))
                wanted -= len(piece)
                self.conn.receive_data(piece)  # (b"": closed mid-body, h11 raises)
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
        if not keep and not _closes(headers):  # (the refusal may say so already)
            head.append((b"Connection", b"close"))
        conn = self.conn
        data = conn.send(h11.Response(status_code=status, headers=head, reason=REASONS.get(status, b""))) or b""
        if not self.head_only:  # HEAD: GET's head, Content-Length included, without the body
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        with trio.move_on_after(self.timeout):
            await self.stream.send_all(data)


_SCRATCH: Final = bytearray(RECEIVE_BYTES)  # where every lingering connection's bytes are dropped


async def _drain(stream: trio.abc.Stream) -> int:
    """Read and drop what ``stream`` has (at most RECEIVE_BYTES); 0: closed. Into one buffer shared by every
    connection, its content never looked at: a trio receive holds what it read across a checkpoint, so a
    buffer of its own for each of a flood's lingering connections would be held at once (500 x 64 KiB)."""
    if isinstance(stream, trio.SocketStream):
        return await stream.socket.recv_into(_SCRATCH)
    return len(await stream.receive_some(RECEIVE_BYTES))


def protocol_error(exc: h11.RemoteProtocolError) -> ApiError:
    """h11's refusal of a request as the API's error, its message in the client's terms (``H11_MESSAGES``)."""
    text = str(exc).lower()
    message = next((said for start, said in H11_MESSAGES if text.startswith(start)), "malformed HTTP/1.1 request")
    return ApiError("headers_too_large" if exc.error_status_hint == 431 else "bad_request", message)


def _closes(headers: tuple[tuple[str, str], ...]) -> bool:
    """Whether an answer's extra headers end the connection (``Connection: close``, from the router)."""
    return any(name.lower() == "connection" and value.lower() == "close" for name, value in headers)


def _body_length(request: h11.Request) -> int:
    """The body's length, from the head (RFC 9112 6.1, 6.3: see the module docstring)."""
    names = {name for name, _ in request.headers}
    if b"transfer-encoding" in names:
        if b"content-length" in names:
            raise ApiError("bad_request", "Content-Length with Transfer-Encoding: one framing only (RFC 9112 6.1)")
        raise ApiError("length_required", "a request body needs a Content-Length (Transfer-Encoding is not accepted)")
    return next((int(value) for name, value in request.headers if name == b"content-length"), 0)  # (h11 checked it)
