"""A test-side HTTP/1.1 client over a real trio socket, with h11: one request at a time, or many pipelined."""

from __future__ import annotations

import json
import re
from typing import Any

import h11
import trio

Header = tuple[str, str]


class Response:
    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = {name.decode().lower(): value.decode() for name, value in headers}
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Response({self.status}, {self.body[:300]!r})"


def request(method: str, target: str, body: Any = None, headers: tuple[Header, ...] = ()) -> h11.Request:
    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    head = [("Host", "127.0.0.1"), *headers]
    if method == "POST":
        head += [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    return h11.Request(method=method, target=target, headers=head)


def _body_of(body: Any) -> bytes:
    return b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()


class HttpClient:
    """Keep-alive client; ``pipeline`` sends several requests before reading any answer."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int, source: str | None = None) -> HttpClient:
        return cls(await trio.open_tcp_stream("127.0.0.1", port, local_address=source))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _encode(self, method: str, target: str, body: Any, headers: tuple[Header, ...]) -> bytes:
        data = self.conn.send(request(method, target, body, headers)) or b""
        data += self.conn.send(h11.Data(data=_body_of(body))) if method == "POST" else b""
        data += self.conn.send(h11.EndOfMessage()) or b""
        return data

    async def call(self, method: str, target: str, body: Any = None, headers: tuple[Header, ...] = ()) -> Response:
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        await self.stream.send_all(self._encode(method, target, body, headers))
        return await self._response()

    async def get(self, target: str, headers: tuple[Header, ...] = ()) -> Response:
        return await self.call("GET", target, headers=headers)

    async def head(self, target: str, headers: tuple[Header, ...] = ()) -> Response:
        return await self.call("HEAD", target, headers=headers)

    async def post(self, target: str, body: Any, headers: tuple[Header, ...] = ()) -> Response:
        return await self.call("POST", target, body, headers)

    async def pipeline(self, requests: list[tuple[str, str, Any]]) -> list[Response]:
        """Send every request at once (raw, as a pipelining client would), then read every answer in order."""
        wire = b""
        for method, target, body in requests:
            scratch = h11.Connection(h11.CLIENT)
            wire += scratch.send(request(method, target, body)) or b""
            wire += scratch.send(h11.Data(data=_body_of(body))) if method == "POST" else b""
            wire += scratch.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(wire)
        out = []
        for method, target, body in requests:
            if self.conn.our_state is h11.DONE:
                self.conn.start_next_cycle()
            self._encode(method, target, body, ())  # moves the client's state on; the bytes went above
            out.append(await self._response())
        return out

    async def _response(self) -> Response:
        status, headers, chunks = 0, [], []
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                status, headers = event.status_code, list(event.headers)
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return Response(status, headers, b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                raise EOFError("closed before a response")


async def raw_exchange(port: int, data: bytes, *, read_timeout: float = 5.0) -> bytes:
    """Send ``data`` as is, read until the server closes (or ``read_timeout``)."""
    return (await talk(port, data, read_timeout=read_timeout))[0]


async def talk(port: int, data: bytes, *, source: str | None = None, read_timeout: float = 5.0) -> tuple[bytes, bool]:
    """Send ``data`` as is (from ``source``, a loopback address), read until the server closes: (what was read,
    whether the server closed it before ``read_timeout``)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    out = b""
    closed = False
    async with stream:
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass  # answered and closed before it read everything: the answer is still there to read
        with trio.move_on_after(read_timeout):
            try:
                while chunk := await stream.receive_some(65536):
                    out += chunk
            except trio.BrokenResourceError:
                pass
            closed = True
    return out, closed


def statuses(raw: bytes) -> list[int]:
    """The status of every response in ``raw`` (bytes read off one connection), in order."""
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)]
