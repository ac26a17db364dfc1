"""Test-side peers of idled: a framed-msgpack client and an `idled serve` subprocess.

Shared by the tests that talk to a server (in-process over memory streams or loopback TCP, or a real daemon).
Imported as a plain module, `from tests.peers import Client, Daemon`: tests/ has no __init__.py, so pytest's default
("prepend") import mode puts tests/ itself on sys.path when it loads tests/conftest.py and the test modules.

Only what the files really share lives here; a file's own variant (its command line, its /metrics scrape, its
receive timeout) stays in that file and reaches these helpers as a parameter.
"""

from __future__ import annotations

import math
import signal
import socket
import subprocess
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import msgpack
import trio

from idled.protocol import NEED_DATA, Error, Event, FrameDecoder, Login, Query, Status, Welcome, encode, parse_server_message

MAX_FRAME = 1 << 24  # the client accepts any frame the server may send
NO_TIMEOUT = math.inf  # a `recv_timeout`: wait for as long as it takes


def raw_frame(body: bytes) -> bytes:
    """`body` behind a length prefix, whatever it holds."""
    return struct.pack(">I", len(body)) + body


def frame(obj: Any) -> bytes:
    """Any msgpack-able object as a frame, valid message or not (encode() only takes the protocol's types)."""
    return raw_frame(msgpack.packb(obj))


class Client:
    """One client connection over any trio stream (TCP or trio.testing memory streams): typed frames out,
    typed frames in (server messages, leniently parsed).

    `recv_timeout` is the default limit of one `recv` (math.inf: none); `reset_is_eof` makes a connection
    reset read as the end of the stream, for tests that expect the server to drop them abruptly.
    """

    def __init__(self, stream: trio.abc.Stream, recv_timeout: float = 10.0, reset_is_eof: bool = False) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(MAX_FRAME, parse=parse_server_message)
        self.recv_timeout = recv_timeout
        self.reset_is_eof = reset_is_eof

    @classmethod
    async def connect(cls, port: int, recv_timeout: float = 10.0, reset_is_eof: bool = False) -> Self:
        """A TCP connection to a loopback port."""
        return cls(await trio.open_tcp_stream("127.0.0.1", port), recv_timeout, reset_is_eof)

    @classmethod
    async def login(cls, port: int, role: str, name: Any, keepalive: float | None = None, token: str | None = None,
                    recv_timeout: float = 10.0, reset_is_eof: bool = False) -> Self:
        """Connect and log in as `role` `name`; the server must answer with a welcome."""
        client = await cls.connect(port, recv_timeout, reset_is_eof)
        await client.send(Login(role, name, token, keepalive))  # type: ignore[arg-type]
        welcome = await client.recv()
        assert isinstance(welcome, Welcome), welcome
        return client

    async def send(self, message: Any) -> None:
        await self.stream.send_all(encode(message))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv(self, timeout: float | None = None) -> Any:
        """The next message, or None once the server closed the connection."""
        with trio.fail_after(self.recv_timeout if timeout is None else timeout):
            while True:
                message = self.decoder.next_event()
                if message is not NEED_DATA:
                    return message
                data = await self._receive_some()
                if not data:
                    return None
                self.decoder.receive_data(data)

    async def _receive_some(self) -> bytes:
        try:
            return await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            if self.reset_is_eof:
                return b""
            raise

    async def expect(self, kind: type) -> Any:
        message = await self.recv()
        assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}"
        return message

    async def expect_error(self, code: str) -> Error:
        """An error frame with `code`, then the connection closes."""
        message = await self.recv()
        assert isinstance(message, Error) and message.code == code, f"expected error {code}, got {message!r}"
        assert await self.recv() is None, "connection not closed after the error frame"
        return message

    async def events_until_status(self, uids: Sequence[Any] = ()) -> tuple[list[Event], Status]:
        """Flush an observer: query, then collect every event queued before the reply."""
        await self.send(Query(tuple(uids)))
        events = []
        while True:
            message = await self.recv()
            if isinstance(message, Status):
                return events, message
            assert isinstance(message, Event), message
            events.append(message)


def free_port() -> int:
    """A loopback port nobody listens on right now (for listeners that cannot take port 0, e.g. /metrics)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(data_dir: Path, *options: str) -> list[str]:
    """`python -m idled.cli.main serve` on a port-0 listener; `options` come last, so they win over the defaults."""
    return [sys.executable, "-m", "idled.cli.main", "serve", "--port", "0", "--data-dir", str(data_dir), *options]


class Daemon:
    """An `idled serve` subprocess; its stderr goes to `stderr_path`, polled for the IDLED_LISTENING line.

    `timeout` is the default limit of waiting for it to start listening, or to exit.
    """

    def __init__(self, command: list[str], stderr_path: Path, env: dict[str, str] | None = None,
                 pass_fds: tuple[int, ...] = (), timeout: float = 20.0) -> None:
        self.stderr_path = stderr_path
        self.timeout = timeout
        with open(stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                         env=env, pass_fds=pass_fds)
        self.port = 0

    async def started(self, timeout: float | None = None) -> int:
        """The port from `IDLED_LISTENING host=... port=N`, once the daemon has printed it."""
        with trio.fail_after(self.timeout if timeout is None else timeout):
            while True:
                for line in self.stderr().splitlines():
                    if line.startswith("IDLED_LISTENING"):
                        self.port = int(line.rsplit("port=", 1)[1])
                        return self.port
                assert self.proc.poll() is None, f"idled exited early:\n{self.stderr()}"
                await trio.sleep(0.02)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def wait(self, timeout: float | None = None) -> int:
        """Its exit status."""
        return await trio.to_thread.run_sync(self.proc.wait, self.timeout if timeout is None else timeout)

    async def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int:
        """Send `sig`, then its exit status."""
        self.proc.send_signal(sig)
        return await self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL if still running, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
