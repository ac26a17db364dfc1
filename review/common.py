"""Shared bits of the review's attack scripts: start a real `idled serve` on 127.0.0.1 (auth on unless told),
mint tokens, speak raw WebSocket frames, read RSS. Run scripts from the worktree root with
PYTHONPATH=$PWD /work/main/.venv/bin/python review/<script>.py"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from idled.protocol import tokens
from idled.protocol.codec import encode
from idled.protocol.messages import Login

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, *options: str, auth: bool = True) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="review-"))
        self.port, self.api, self.metrics = free_port(), free_port(), free_port()
        self.secret_file = self.dir / "secret"
        self.secret_file.write_text("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA==\n")
        cmd = [PY, "-m", "idled.cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--data-dir", str(self.dir / "data"), "--api-port", str(self.api), "--api-host", "127.0.0.1",
               "--metrics-port", str(self.metrics), "--metrics-host", "127.0.0.1", *options]
        if auth:
            cmd += ["--secret-file", str(self.secret_file)]
        self.stderr = open(self.dir / "stderr", "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr)
        deadline = time.monotonic() + 20
        while b"IDLED_LISTENING" not in (self.dir / "stderr").read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("daemon did not start:\n" + (self.dir / "stderr").read_text())
            time.sleep(0.05)
        time.sleep(0.3)
        self.ps = psutil.Process(self.proc.pid)
        self.secret = tokens.load_secret(self.secret_file) if auth else None

    def rss(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def alive(self) -> bool:
        return self.proc.poll() is None

    def token(self, role: str, name: str | int) -> str:
        assert self.secret is not None
        return tokens.mint(self.secret, role, name, time.time() + 600)

    def login(self, role: str, name: str | int, **kw: object) -> bytes:
        tok = self.token(role, name) if self.secret is not None else None
        return encode(Login(role, name, tok, **kw))  # type: ignore[arg-type]

    def log(self) -> str:
        return (self.dir / "stderr").read_text(errors="replace")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def ws_head(port: int, host: str | None = None, origin: str | None = None, extra: str = "") -> bytes:
    lines = ["GET / HTTP/1.1", f"Host: {host if host is not None else f'127.0.0.1:{port}'}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def frame(payload: bytes, opcode: int = 2, fin: bool = True, masked: bool = True, mask: bytes = b"\x01\x02\x03\x04") -> bytes:
    b0 = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        head = bytes((b0, (0x80 if masked else 0) | n))
    elif n < 65536:
        head = bytes((b0, (0x80 if masked else 0) | 126)) + struct.pack(">H", n)
    else:
        head = bytes((b0, (0x80 if masked else 0) | 127)) + struct.pack(">Q", n)
    if not masked:
        return head + payload
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


def connect(port: int, src: str = "127.0.0.1", timeout: float = 5.0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_all(s: socket.socket, wait: float = 2.0) -> bytes:
    s.settimeout(wait)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def handshake(port: int, src: str = "127.0.0.1", **kw: str) -> socket.socket:
    s = connect(port, src)
    s.sendall(ws_head(port, **kw))
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(4096)
        if not d:
            raise RuntimeError(f"closed during handshake: {head!r}")
        head += d
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(head.decode(errors="replace"))
    return s


os.environ.setdefault("PYTHONPATH", os.getcwd())
