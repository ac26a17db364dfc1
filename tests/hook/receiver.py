"""A real webhook receiver for the tests: `http.server.ThreadingHTTPServer` on 127.0.0.1 in a thread.

Each request takes the next step of a script (then ``ok`` for ever): ``ok`` (204, the body recorded as
acknowledged), ``reset`` (the connection reset with SO_LINGER 0, no answer), ``stall:S`` (sleep S seconds,
then close without answering), ``500``, ``429:N`` / ``503:N`` (that status with ``Retry-After: N``),
``307:URL`` or any 3xx (that status with ``Location: URL``).
``port``: listen there (a receiver brought back after an outage); on exit the listener and every open
connection close. Every attempt is recorded; `acked` holds the bodies answered 2xx, in order, with their headers and time.
"""

from __future__ import annotations

import http.server
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    step: str
    headers: dict[str, str]
    body: bytes
    received: float
    path: str = "/hook"

    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    script: list[str] = field(default_factory=list)
    attempts: list[Request] = field(default_factory=list)
    acked: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: http.server.ThreadingHTTPServer | None = None
    port: int = 0  # 0: any free port
    connections: set[socket.socket] = field(default_factory=set)  # open ones, cut on exit (the receiver goes down)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def next_step(self) -> str:
        with self.lock:
            return self.script.pop(0) if self.script else "ok"

    def acked_events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [event for request in self.acked for event in request.json()["events"]]

    def __enter__(self) -> Receiver:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with receiver.lock:
                    receiver.connections.add(self.connection)

            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                step = receiver.next_step()
                request = Request(step, dict(self.headers.items()), body, time.time(), self.path)
                with receiver.lock:
                    receiver.attempts.append(request)
                if step == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if step.startswith("stall:"):
                    time.sleep(float(step.split(":")[1]))
                    self.close_connection = True
                    return
                status, _, value = step.partition(":")
                code = 204 if status == "ok" else int(status)
                if code == 204:
                    with receiver.lock:
                        receiver.acked.append(request)
                self.send_response(code)
                if value:
                    self.send_header("Location" if 300 <= code < 400 else "Retry-After", value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for connection in self.connections:  # a kept-alive connection must not outlive the receiver
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
