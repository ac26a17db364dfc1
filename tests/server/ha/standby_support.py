"""Helpers for the standby scenarios: daemons, a gateway that makes events, status, the logs' record bytes."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any


from idled.log.shipping import RawReader
from idled.protocol import NEED_DATA, Attach, Detach, Event, FrameDecoder, Login, Subscribe, encode, tokens
from idled.protocol import parse_server_message
from idled.tools.bench.daemon import Daemon, free_port


def token_for(secret: bytes | None, role: str, name: str) -> str | None:
    """A token for ``role`` ``name`` (valid for an hour), or None with auth off (``secret`` None)."""
    return None if secret is None else tokens.mint(secret, role, name, time.time() + 3600)


def active(directory: Path, *flags: str) -> Daemon:
    directory.mkdir(parents=True, exist_ok=True)
    return Daemon(directory, "--metrics-port", "0", "--log-level", "info", *flags)


def sync_active(directory: Path, *flags: str) -> tuple[Daemon, int]:
    """An active core with ``--sync-standby --fsync always`` and its metrics port."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    daemon = Daemon(directory, "--sync-standby", "--fsync", "always", "--metrics-port", str(port),
                      "--log-level", "info", *flags)
    return daemon, port


def metric(metrics_port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


class Watcher(threading.Thread):
    """An observer reading in the background: ``last`` is the highest seq it has received so far."""

    def __init__(self, port: int, durable: bool, secret: bytes | None = None) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        name = "durable" if durable else "fast"
        self.sock.sendall(encode(Login("observer", name, token_for(secret, "observer", name)))
                          + encode(Subscribe(1, durable)))
        self.last = 0
        self.seen: list[tuple[int, str, Any]] = []  # (seq, kind, uid) of every event, in order
        self.start()

    def run(self) -> None:
        decoder = FrameDecoder(1 << 20, parse=parse_server_message)
        try:
            while data := self.sock.recv(65536):
                decoder.receive_data(data)
                while (message := decoder.next_event()) is not NEED_DATA:
                    if type(message) is Event:
                        self.seen.append((message.seq, message.kind, message.uid))
                        self.last = message.seq
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


def standby(directory: Path, of: Daemon, *flags: str) -> tuple[Daemon, int]:
    """A standby of ``of`` and its metrics port."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    daemon = Daemon(directory, "--standby-of", f"127.0.0.1:{of.port}", "--metrics-port", str(port),
                    "--log-level", "info", *flags)
    return daemon, port


def status(metrics_port: int, secret: bytes | None = None) -> dict[str, Any]:
    """A daemon's /status; with ``secret`` (auth on) read with an API token: the whole document, not the
    redacted one (idled.ops.redact)."""
    headers = {}
    if secret is not None:
        headers["Authorization"] = "Bearer " + tokens.mint(secret, tokens.API_ROLE, "tests", time.time() + 600)
    request = urllib.request.Request(f"http://127.0.0.1:{metrics_port}/status", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        document: dict[str, Any] = json.loads(response.read())
    return document


def wait_for(predicate: Any, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Gateway:
    """A gateway connection making events: ``churn(n)`` attaches n uids and detaches half of them."""

    def __init__(self, port: int, name: str = "g", host: str = "127.0.0.1", secret: bytes | None = None) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.sendall(encode(Login("gateway", name, token_for(secret, "gateway", name))))
        self.next = 0

    def churn(self, users: int, prefix: str = "u") -> None:
        uids = tuple(f"{prefix}{self.next + i}" for i in range(users))
        self.next += users
        self.sock.sendall(encode(Attach(uids, 600.0)) + encode(Detach(uids[: users // 2])))

    def close(self) -> None:
        self.sock.close()


def records(data_dir: Path, from_seq: int = 1) -> dict[int, bytes]:
    """seq -> the record's bytes, as the segments of ``data_dir`` hold them."""
    reader = RawReader(str(data_dir), from_seq)
    out: dict[int, bytes] = {}
    while batch := reader.take(2**62, 10_000, 1 << 30):
        for seq, raw in batch:
            assert seq not in out, f"seq {seq} twice"
            out[seq] = raw
    return out


def observe(port: int, from_seq: int, count: int, timeout: float = 10.0) -> list[tuple[int, str, Any]]:
    """(seq, kind, uid) of ``count`` events from ``from_seq`` on, read by an observer on ``port``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(encode(Login("observer", "watcher")) + encode(Subscribe(from_seq)))
    decoder = FrameDecoder(1 << 20, parse=parse_server_message)
    out: list[tuple[int, str, Any]] = []
    try:
        while len(out) < count:
            data = sock.recv(65536)
            assert data, "observer connection closed"
            decoder.receive_data(data)
            while (message := decoder.next_event()).__class__.__name__ != "NeedData":
                if message.__class__.__name__ == "Event":
                    out.append((message.seq, message.kind, message.uid))
    finally:
        sock.close()
    return out


def login_error(port: int, login: Login) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(encode(login))
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data
    finally:
        sock.close()
