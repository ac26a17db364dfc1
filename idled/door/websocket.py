"""WebSocket on the client port: the handshake (wsproto, sans-IO) and the stream the roles read it through.

Theory of operation
-------------------
**Same port, told apart by the first byte.** Every TCP client's first frame is its login, at most
``MAX_LOGIN_FRAME`` (4 KiB) long, so its 4-byte length prefix begins with a zero byte; an HTTP request begins
with a method (``GET``: 0x47). The doorway (``idled.server.roles.doorway``) reads the first bytes after the
gate -- the source's share, PROXY and TLS all applied, as for every connection -- and a connection that
begins ``GET `` goes to ``upgrade`` here. (A ``G`` alone already rules out a valid login; the four bytes keep
garbage that happens to begin with one -- a frame's too_large -- answered with an error frame as before.) No port of its own, no flag, nothing a listener could forget:
``wss://`` is WebSocket over the port's TLS, detected after the handshake the same way.

**The handshake** (``upgrade``), within what is left of the login deadline: the request head is read through
``idled.protocol.httphead.Inbox`` (``MAX_HEAD`` bytes, CRLF only, no obs-fold: the only memory an
unauthenticated WebSocket peer holds besides its share of the gate), then parsed by wsproto's
``H11Handshake``. Then, in order:

* **Origin** (cross-site WebSocket hijacking): a request with no ``Origin`` is no browser's and is served; one
  from a page is served only when its origin is the ``Host`` it connected to (``idled.ops.origin.same_origin``,
  the API's rule: a page served behind the same name, e.g. by a reverse proxy in front of both) or is listed
  in ``ws_origins`` (comma-separated ``scheme://host[:port]``, or ``*`` for any; ``null``, a ``file:`` page's,
  only when listed). Otherwise ``403``. With auth off, a ``Host`` that is not an IP or ``localhost`` is ``421``
  (DNS rebinding: a rebound page's origin *is* its Host).
* **Subprotocol** ``idled.v1``: optional -- a client that offers none is served (Python's and most stock
  clients offer none by default) -- but a client that offers some and not ours expects another protocol: ``400``.
* **Extensions** are declined (no permessage-deflate: a keepalive is 15 bytes, and compression before auth
  is memory an attacker chooses).

A refusal is one HTTP response (status, reason phrase, ``text/plain`` body naming the idled error code) and a
close. The doorway counts it like any refusal. Accepted, the connection goes on as a ``WebSocketStream``:
``receive_some`` passes the socket's bytes through to the connection's ``WsDecoder``
(``idled.protocol.websocket``) after sending the control replies it owes (pongs, the close echo) and reports
the end of input once the peer closed; ``send_all`` wraps the idled frames the roles write, each as one binary
message, and remembers the last error code among them, so ``aclose`` sends the close that carries it
(``close_code``: 1009 too_large, 1002 bad_frame, 1001 server_shutdown, else 4000; the reason is the code).
After the welcome a plain WebSocket user is handed over to the user plane like a TCP one
(``idled.server.roles.plane``, which reads the stream's ``raw`` socket through the same decoder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from idled.ops.config import Config
from idled.ops.origin import misdirected, same_origin
from idled.protocol import PONG_FRAME
from idled.protocol.codec import PONG_BODY
from idled.protocol.httphead import HeadError, Inbox
from idled.protocol.websocket import SUBPROTOCOL, WsDecoder, close_code, close_frame, error_of, message, wrap

if TYPE_CHECKING:
    from wsproto.events import Request
    from wsproto.handshake import H11Handshake

__all__ = ["MAX_HEAD", "UPGRADE", "OriginRule", "WebSocketStream", "WsRefused", "head_inbox", "upgrade"]

UPGRADE: Final = b"GET "  # no TCP login frame's prefix begins with it (see the module docstring)
MAX_HEAD: Final = 8192  # bytes of upgrade request head: a browser's, with its cookies (nginx's default buffer)
_WS_PONG: Final = message(PONG_BODY)
_REASONS: Final = {400: "Bad Request", 403: "Forbidden", 421: "Misdirected Request", 431: "Request Header Fields Too Large"}


class WsRefused(Exception):
    """A handshake refused: ``status`` (HTTP), ``code`` (idled's, for counting and the body), ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message

    def response(self) -> bytes:
        body = f"{self.code}: {self.message}\n".encode()
        return (f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Error')}\r\ncontent-type: text/plain; "
                f"charset=utf-8\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


@dataclass(frozen=True, slots=True)
class OriginRule:
    """Which browser origins may open a WebSocket session (module docstring); ``local_host_only``: auth is
    off, so a Host must name this machine."""

    origins: frozenset[str]
    local_host_only: bool

    @classmethod
    def of(cls, config: Config, *, secret: bool) -> OriginRule:
        listed = frozenset(part.strip().lower().rstrip("/") for part in config.ws_origins.split(",") if part.strip())
        return cls(listed, not secret)

    def check(self, origin: str | None, host: str) -> None:
        if self.local_host_only and misdirected(host):
            raise WsRefused(421, "not_allowed", "with auth off the client port answers only a Host that is an IP "
                            "address or localhost (DNS rebinding): use one, or turn auth on")
        if origin is None or "*" in self.origins or origin.strip().lower() in self.origins:
            return
        if same_origin(origin, host):
            return
        raise WsRefused(403, "not_allowed", f"origin {origin[:200]!r} is not allowed: list it in ws_origins")


def head_inbox(first: bytes | bytearray) -> Inbox:
    """The inbox an upgrade request is read into, holding its ``first`` bytes. The caller drops its own
    reference to them: an unauthenticated peer's head is then held once, not twice (measured: ~24 KiB of RSS
    per half-open handshake of 8 KiB when the caller kept the first read alive across the handshake, ~16 after)."""
    inbox = Inbox(MAX_HEAD)
    inbox.data += first
    return inbox


async def upgrade(stream: trio.abc.Stream, inbox: Inbox, rule: OriginRule, max_frame: int) -> WebSocketStream | None:
    """Read the upgrade request whose first bytes are in ``inbox`` (``head_inbox``) and answer it (the caller
    bounds the time): the stream to serve, None if the peer left first; ``WsRefused`` after sending the refusal."""
    try:
        while (head := inbox.head()) is None:
            data = await stream.receive_some(inbox.room())
            if not data:
                return None
            inbox.data += data
        shake, request = _request(head)
        headers = {name.lower(): value for name, value in request.extra_headers}
        origin = headers.get(b"origin")
        rule.check(origin.decode("latin-1") if origin is not None else None, request.host)
        offered = request.subprotocols
        if offered and SUBPROTOCOL not in offered:
            raise WsRefused(400, "bad_frame", f"this server speaks the subprotocol {SUBPROTOCOL}, not "
                            f"{', '.join(offered)[:200]}")
    except HeadError as exc:
        await _refuse(stream, WsRefused(exc.status, exc.code, exc.message))
    except WsRefused as exc:
        await _refuse(stream, exc)
    from wsproto.events import AcceptConnection

    await stream.send_all(shake.send(AcceptConnection(subprotocol=SUBPROTOCOL if offered else None)))
    decoder = WsDecoder(max_frame)
    decoder.receive_data(bytes(inbox.data))  # (a client may not send before our answer; if it did, keep it)
    return WebSocketStream(stream, decoder)


def _request(head: bytes) -> tuple[H11Handshake, Request]:
    # wsproto (with h11: ~4 MiB) is loaded by the first upgrade, not by every process that may see one (issue 36).
    from wsproto import ConnectionType
    from wsproto.events import Request
    from wsproto.handshake import H11Handshake
    from wsproto.utilities import RemoteProtocolError

    shake = H11Handshake(ConnectionType.SERVER)
    try:
        shake.receive_data(head)
        event = next(iter(shake.events()), None)
    except RemoteProtocolError as exc:
        raise WsRefused(400, "bad_frame", f"not a WebSocket upgrade: {exc}") from None
    if not isinstance(event, Request):
        raise WsRefused(400, "bad_frame", "not a WebSocket upgrade request")
    return shake, event


async def _refuse(stream: trio.abc.Stream, refused: WsRefused) -> None:
    try:
        await stream.send_all(refused.response())
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    raise refused


class WebSocketStream(trio.abc.Stream):
    """A WebSocket connection after the handshake, as the roles see it: idled frames in and out (see the
    module docstring). ``raw``: the stream beneath (a socket, or TLS); ``decoder``: the connection's."""

    def __init__(self, raw: trio.abc.Stream, decoder: WsDecoder) -> None:
        self.raw = raw
        self.decoder = decoder
        self.error: str | None = None  # the last error code sent: what the close carries
        self._out = b""  # a relayed frame cut short, until its end arrives
        self._lock = trio.StrictFIFOLock()  # replies from the reader and frames from a writer task
        self._closed = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        decoder = self.decoder
        if decoder.replies:
            await self._send(decoder.take_replies())
        if decoder.closed is not None:
            self._closed = True  # (the echo went out with the replies)
            return b""
        return bytes(await self.raw.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if data is PONG_FRAME:
            await self._send(_WS_PONG)
            return
        frames = data if isinstance(data, (bytes, bytearray)) else bytes(data)
        if self._out:
            frames = self._out + frames
        out, self._out = wrap(frames)
        code = error_of(frames)
        if code is not None:
            self.error = code
        if out:
            await self._send(out)

    async def _send(self, data: bytes) -> None:
        async with self._lock:
            await self.raw.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.raw.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """The close frame (carrying the last error's code), then the stream beneath closes."""
        try:
            if not self._closed:
                self._closed = True
                with trio.move_on_after(1.0) as scope:
                    scope.shield = True
                    await self._send(close_frame(close_code(self.error), self.error or ""))
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            pass
        finally:
            await self.raw.aclose()
