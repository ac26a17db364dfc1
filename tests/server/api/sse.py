"""A test-side Server-Sent Events client over a real socket: h11 undoes the HTTP framing (chunked), a few
lines here split the event stream (the WHATWG "event stream interpretation", the parts idled sends)."""

from __future__ import annotations

import json
import socket
from typing import Any

import h11
import trio


class SseClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""  # the refusal's body (not 200)
        self.text = b""  # stream bytes not yet split into blocks
        self.ended = False

    @classmethod
    async def open(cls, port: int, target: str = "/v1/events", *, token: str | None = None,
                   last_event_id: str | None = None, rcvbuf: int | None = None,
                   method: str = "GET") -> SseClient:
        sock = trio.socket.socket()
        if rcvbuf is not None:  # before connect: the window the server may fill
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect(("127.0.0.1", port))
        client = cls(trio.SocketStream(sock))
        headers = [("Host", "127.0.0.1"), ("Accept", "text/event-stream")]
        if token is not None:
            headers.append(("Authorization", f"Bearer {token}"))
        if last_event_id is not None:
            headers.append(("Last-Event-ID", last_event_id))
        data = client.conn.send(h11.Request(method=method, target=target, headers=headers)) or b""
        data += client.conn.send(h11.EndOfMessage()) or b""
        await client.stream.send_all(data)
        while True:
            event = await client._event()
            if isinstance(event, h11.Response):
                client.status = event.status_code
                client.headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                break
        if client.status != 200:
            while not client.ended:
                event = await client._event()
                if isinstance(event, h11.Data):
                    client.body += event.data
        return client

    async def _event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                self.conn.receive_data(data)
                continue
            if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                self.ended = True
            return event

    async def block(self) -> list[str] | None:
        """The next block's lines (a dispatched event, or comments alone); None: the stream ended."""
        while b"\n\n" not in self.text:
            if self.ended:
                return None
            event = await self._event()
            if isinstance(event, h11.Data):
                self.text += event.data
        raw, self.text = self.text.split(b"\n\n", 1)
        return raw.decode().split("\n")

    async def event(self) -> dict[str, Any] | None:
        """The next event with data (comments skipped): {"id", "event", "data" (parsed JSON)}; None: ended."""
        while True:
            lines = await self.block()
            if lines is None:
                return None
            fields: dict[str, Any] = {}
            for line in lines:
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
            if "data" in fields:
                fields["data"] = json.loads(fields["data"])
                return fields

    async def events(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        out = []
        with trio.fail_after(timeout):
            while len(out) < count:
                event = await self.event()
                assert event is not None, f"stream ended after {out}"
                out.append(event)
        return out

    async def aclose(self) -> None:
        await self.stream.aclose()
