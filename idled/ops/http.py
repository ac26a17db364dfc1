"""The daemon's HTTP endpoint: ``/metrics`` for Prometheus, and the health probes and status beside it.

Theory of operation
-------------------
The endpoint (:func:`serve_metrics`) is a deliberately tiny HTTP/1.1 responder: one request per
connection, ``GET``/``HEAD /metrics`` -> 200 with the text exposition format, other paths 404,
other methods 405; the request head is capped (``max_request_bytes``) and must arrive within ``head_timeout``
(2 s: a prober or scraper sends it at once), the whole exchange has a deadline (``timeout``). Of the head it
reads the request line and two headers, ``Host`` and ``Authorization``; whatever follows the head (a body, a
pipelined request) is never read as a request: the answer says ``Connection: close``, then the connection is
drained and closed. So that a proxy in front cannot read those headers one way and this endpoint another,
the head is held to what RFC 9112 allows a server to insist on, ``400`` otherwise, at once: every line ends
with CR LF (a bare LF or a bare CR is refused as soon as it arrives, not at the head deadline), no line begins
with a space or tab (obs-fold, 5.2), at most one ``Host`` (3.2). Its listeners
come from the door (``idled.door``), and every connection passes the door's gate first: a few connections per
address, and when the endpoint is full the oldest that has not been answered makes room, so a flood of idle
connections cannot keep a liveness probe out. Each client is handled in the server's nursery and any error
in a handler is logged, never propagated: a bad client cannot take the daemon down.

Given a :class:`Health`, the same endpoint answers the probes and the status document:

* ``/healthz`` -- 200 ``ok`` whenever the process answers at all (a liveness probe: restart if it fails);
* ``/readyz`` -- 200 ``ready`` when the client listener is open and the event log's directory takes a
  write, else 503 with the reason (a readiness probe: stop routing to it). The write is a real probe file
  (create, write, fsync, unlink) in a worker thread -- ``os.access`` says nothing about a full disk, a
  read-only remount or a removed directory -- and its result is cached for ``cache_seconds`` (1 s), so a
  probe storm costs one write per second;
* ``/status`` -- a JSON document (version, uptime, sessions, connections by role, next seq, readiness),
  what ``idled status`` prints. Like NATS's ``/varz``: plain HTTP, readable with curl, no client library
  and no protocol change. The server's part is read on the event loop (the handler runs there);
* ``/status/live?after=SEQ&since=T`` -- the same with a ``vitals`` part: what the status page polls.

With auth on (``Health.secret``), user ids, events and paths are for the HTTP API's bearer token only: the
request's ``Authorization`` header is read from its head and judged by ``Health.access`` (see
`idled.ops.health`): ``/status/live`` answers 401 without a good token, ``/status`` a redacted document,
``/readyz`` a reason without paths; ``/healthz`` and ``/metrics`` answer anyone. A good token also tells the
door's gate the connection is authenticated: it no longer counts against its address's share, and is not
evicted to make room.

With auth off (no ``Health``, or one without a secret: the endpoint is on loopback), DNS rebinding is what is
left to fear: a web page whose own name was made to resolve to 127.0.0.1 reads what this port answers, as
its same origin. So the ``Host`` must then be an IP literal or ``localhost`` (`idled.ops.origin`), any port,
else ``421 Misdirected Request`` -- on every path but ``/healthz`` and ``/metrics``, which answer anyone with
auth on as well (a Prometheus target or a probe by DNS name keeps working). The status page and its data stay
same-origin at ``http://127.0.0.1:9878/``, ``http://localhost:9878/`` and through an SSH tunnel to localhost.
With auth on the token guards the data and operators reach the port by name: the Host is not checked.

And always ``/``, the status page (`idled.ops.statuspage`: three files served from memory, with their
security headers; for an edge -- ``page=False``, or no ``Health`` -- a note that the page is the core's and
that the edge's own ``/status`` is there for ``idled status``). Every response
carries ``X-Content-Type-Options: nosniff``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Final, Protocol

import trio
from prometheus_client import CollectorRegistry, generate_latest

from idled.ops.health import Health, health_response
from idled.ops.metrics import CONTENT_TYPE
from idled.ops.origin import misdirected, misdirected_text
from idled.ops.statuspage import LIVE_PATH, PAGE_HEADERS, Asset, load_assets
from idled.protocol.httphead import HeadError, Inbox

__all__ = ["HEAD_TIMEOUT", "Admitted", "Gate", "serve_metrics"]

log = logging.getLogger("idled.ops.metrics")

HEAD_TIMEOUT: Final = 2.0  # seconds a client has to send its whole request head (probes and scrapes: at once)
PLAIN: Final = "text/plain; charset=utf-8"

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

class _HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


async def _read_head(stream: trio.abc.Stream, limit: int) -> bytes | None:
    """The request head up to its empty line (``idled.protocol.httphead.Inbox``: CR LF lines only, no obs-fold,
    at most ``limit`` bytes, each byte scanned once); None if the client closed first. ``_HttpError``: 400 or
    431 as the inbox says, as soon as it is read."""
    inbox = Inbox(limit)
    try:
        while (head := inbox.head()) is None:
            chunk = await stream.receive_some(inbox.room())
            if not chunk:
                return None
            inbox.data += chunk
    except HeadError as exc:
        raise _HttpError(exc.status) from None
    return head[:-4]  # (without the empty line's CR LF CR LF)


async def _linger(stream: trio.SocketStream, *, seconds: float = 1.0, max_bytes: int = 65536) -> None:
    """Half-close, then discard what the client still sends until it closes (bounded in time and bytes).

    Closing a socket with unread input makes the kernel send RST, which can destroy the response
    before the client reads it (an oversized request leaves input unread). Apache calls this a
    lingering close.
    """
    await stream.send_eof()
    drained = 0
    with trio.move_on_after(seconds):
        while drained < max_bytes:
            chunk = await stream.receive_some(16384)
            if not chunk:
                return
            drained += len(chunk)


Headers = tuple[tuple[str, str], ...]


def _response(status: int, body: bytes, content_type: str, *, head_only: bool = False, headers: Headers = ()) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "X-Content-Type-Options: nosniff\r\n"
        f"{extra}"
        "Connection: close\r\n"
        "\r\n"
    ).encode("ascii")
    return head if head_only else head + body


_HEALTH_PATHS = ("/healthz", "/readyz", "/status", LIVE_PATH)
OPEN_PATHS: Final = ("/healthz", "/metrics")  # answered to any Host: they say nothing of users or paths
MISDIRECTED: Final = f"Misdirected Request: {misdirected_text('this endpoint')}\n".encode()


@dataclass(frozen=True, slots=True)
class _Request:
    """What the endpoint reads of a request head: its request line and its header fields."""

    method: str
    path: str
    query: str
    fields: tuple[tuple[bytes, bytes], ...]  # (lower-case name, value without surrounding whitespace)

    def values(self, name: bytes) -> list[str]:
        """The values of the header ``name`` (lower case), in order."""
        return [value.decode("latin-1") for field, value in self.fields if field == name]


def _parse(head: bytes) -> _Request:
    """The request in a head (CR LF lines and no obs-fold: checked by ``_read_head``); ``_HttpError(400)``: a
    request line that is not ``METHOD TARGET HTTP/1.x``, a bare CR, a header line without a colon, more than
    one Host."""
    request_line, *lines = head.split(b"\r\n")
    parts = request_line.split(b" ")
    if b"\r" in request_line:
        raise _HttpError(400)
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _HttpError(400)
    fields = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if b"\r" in line or not colon:  # (a CR left in a line once split at CR LF is a bare one)
            raise _HttpError(400)
        fields.append((name.strip().lower(), value.strip()))
    method, target = parts[0].decode("ascii", "replace"), parts[1].decode("ascii", "replace")
    path, _, query = target.partition("?")
    request = _Request(method, path, query, tuple(fields))
    if len(request.values(b"host")) > 1:
        raise _HttpError(400)
    return request


def _route(request: _Request, paths: Collection[str], check_host: bool) -> int:
    """The status a request gets before its path is served: 404 for a path not in ``paths``, 405 for a method
    other than GET and HEAD, 421 (``check_host``: auth is off) for a Host that is not an IP literal or
    localhost, on every path but those that answer anyone; else 200."""
    if request.path not in paths:
        return 404
    if request.method not in ("GET", "HEAD"):
        return 405
    hosts = request.values(b"host")
    if check_host and request.path not in OPEN_PATHS and misdirected(hosts[0] if hosts else None):
        return 421
    return 200


async def _receive(stream: trio.abc.Stream, head_deadline: float, limit: int) -> _Request | None:
    """The request whose head arrives by ``head_deadline``; None when the client closed or stayed silent, or
    when its head broke a rule (answered here: 400, 431)."""
    try:
        head = None
        with trio.move_on_at(head_deadline):
            head = await _read_head(stream, limit)
        return None if head is None else _parse(head)
    except _HttpError as exc:
        await stream.send_all(_response(exc.status, f"{_REASONS[exc.status]}\n".encode(), PLAIN))
        return None


class Admitted(Protocol):
    """A connection through the door's gate (``idled.door.gate.Entry``, typed here by what this module uses)."""

    stream: trio.abc.Stream
    deadline: float
    refused: object | None

    def authenticated(self) -> None: ...


class Gate(Protocol):
    """The door's gate for this endpoint (``idled.door.door.metrics_gate``): a few connections per address,
    and the oldest idle one evicted when full."""

    def enter(self, stream: trio.abc.Stream, timeout: float) -> AbstractAsyncContextManager[Admitted]: ...


async def serve_metrics(
    registry: CollectorRegistry,
    listeners: Sequence[trio.SocketListener],
    gate: Gate,
    *,
    max_request_bytes: int = 8192,
    head_timeout: float = HEAD_TIMEOUT,
    timeout: float = 10.0,
    health: Health | None = None,
    page: bool | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` for ``registry`` and the status page (``/``) on ``listeners`` (opened by the door)
    until cancelled (and, given ``health``, ``/healthz``, ``/readyz``, ``/status`` and ``/status/live``).
    ``page``: whether ``/`` is the daemon's live page, polling ``/status/live`` (default: given ``health``); an
    edge has a status of its own but no live figures, so its ``/`` stays a note and it has no ``/status/live``.

    Use with ``port = await nursery.start(serve_metrics, registry, listeners, gate)``: the first listener's port
    is reported once serving. Each connection passes ``gate`` first; its request head must arrive within
    ``head_timeout`` (a prober sends it at once: a silent connection is dropped soon, not held), the whole
    exchange within ``timeout``."""
    renderer = trio.CapacityLimiter(1)  # concurrent scrapes queue for one worker thread, not forty
    page = health is not None if page is None else page and health is not None
    assets: dict[str, Asset] = load_assets(full=page)
    paths = {"/metrics", *assets, *(path for path in _HEALTH_PATHS if health is not None and (page or path != LIVE_PATH))}
    # auth off: the Host rule (module docstring). Without a Health (an edge, idled hook) there is nothing to
    # read but /metrics and a static note, so nothing to check.
    check_host = health is not None and health.secret is None

    async def respond(stream: trio.abc.Stream, head_deadline: float, authenticated: Callable[[], None]) -> None:
        request = await _receive(stream, head_deadline, max_request_bytes)
        if request is None:
            return
        head_only, path = request.method == "HEAD", request.path
        status = _route(request, paths, check_host)
        if status != 200:
            body = MISDIRECTED if status == 421 else f"{_REASONS[status]}\n".encode()
            await stream.send_all(_response(status, body, PLAIN, head_only=head_only))
            return
        asset = assets.get(path)
        if asset is not None:
            await stream.send_all(_response(200, asset.body, asset.content_type, head_only=head_only,
                                            headers=PAGE_HEADERS))
            return
        if health is not None and path != "/metrics":
            access = health.access(request.values(b"authorization"))
            if access.token:
                authenticated()
            code, body, kind, headers = await health_response(health, path, request.query, access)
            await stream.send_all(_response(code, body, kind, head_only=head_only, headers=headers))
            return
        try:
            body = await trio.to_thread.run_sync(generate_latest, registry, limiter=renderer)
        except Exception:
            log.exception("rendering metrics failed")
            await stream.send_all(_response(500, b"Internal Server Error\n", PLAIN))
            return
        await stream.send_all(_response(200, body, CONTENT_TYPE, head_only=head_only))

    async def handle(stream: trio.SocketStream) -> None:
        try:
            async with gate.enter(stream, head_timeout) as entry:
                if entry.refused is not None:
                    return  # a few per address, and room made for the newest: closed below
                with trio.move_on_after(timeout):
                    await respond(entry.stream, entry.deadline, entry.authenticated)
                    await _linger(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:
            log.exception("metrics client handler failed")
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        task_status.started(listeners[0].socket.getsockname()[1] if listeners else 0)
        await trio.serve_listeners(handle, list(listeners), handler_nursery=nursery)
