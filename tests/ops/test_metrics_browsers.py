"""The metrics port against a browser and a lax proxy: DNS rebinding (the Host rule with auth off), and a head
its tiny parser must not read two ways (bare LF, obs-fold, two Hosts).

Against a real `Server` (tests.peers.running) with its metrics port on loopback. DNS rebinding: a page on
``evil.example`` whose name then resolves to 127.0.0.1 reads what the port answers to ``Host: evil.example``
-- with auth off, the live status (user ids, events) and the data directory. With auth off the Host must be
an IP literal or ``localhost`` (any port) on every path but ``/healthz`` and ``/metrics`` (which answer anyone
with auth on too); with auth on the token guards the data and any Host passes.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import trio

from idled.protocol.tokens import API_ROLE, mint
from tests import peers
from tests.peers import running

SECRET = b"metrics-port-secret-0123456789"
ALICE = "alice-7f3c"


def exchange(port: int, request: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """(the whole answer to ``request`` sent as it is, seconds until the server closed)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
    return answer, time.monotonic() - started


async def answer(port: int, request: bytes) -> bytes:
    return (await trio.to_thread.run_sync(exchange, port, request))[0]


def get(path: str, host: str, *extra: str) -> bytes:
    head = "".join(f"{line}\r\n" for line in (f"Host: {host}", *extra))
    return f"GET {path} HTTP/1.1\r\n{head}\r\n".encode()


def status_of(raw: bytes) -> int:
    assert raw.startswith(b"HTTP/1.1 "), raw
    return int(raw[9:12])


async def test_with_auth_off_a_rebound_name_reads_nothing(tmp_path: Path) -> None:
    """Before: ``/status/live`` answered ``Host: evil.example`` with alice and her events. Now 421 on every
    path that says who is online or where the data is (and the page, so it does not load only to fail),
    while probes and scrapes answer whatever Host they name (a Prometheus target by DNS name under
    --insecure)."""
    port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=port, settle=False) as h:
        alice = await h.user(ALICE, keepalive=10)
        for path in ("/status/live", "/status", "/readyz", "/", "/static/status.js"):
            for host in (f"evil.example:{port}", "evil.example", "127.0.0.1.nip.io", f"localhost.evil.example:{port}"):
                raw = await answer(port, get(path, host))
                assert status_of(raw) == 421, (path, host, raw)
                assert ALICE.encode() not in raw and str(tmp_path).encode() not in raw
                assert b"IP address or localhost" in raw
        for path in ("/healthz", "/metrics"):
            assert status_of(await answer(port, get(path, f"evil.example:{port}"))) == 200, path
        # the status page and its data by IP, by localhost (an SSH tunnel), any port; HTTP/1.0 without a Host
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "[::1]",
                     "192.0.2.7:9878"):
            raw = await answer(port, get("/status/live", host))
            assert status_of(raw) == 200 and ALICE.encode() in raw, (host, raw)
            assert status_of(await answer(port, get("/", host))) == 200, host
        assert status_of(await answer(port, b"GET /status HTTP/1.0\r\n\r\n")) == 200
        # RFC 9112 3.2: two Hosts are a 400 (which one would a proxy have routed by?)
        raw = await answer(port, get("/status/live", "127.0.0.1", "Host: evil.example"))
        assert status_of(raw) == 400 and ALICE.encode() not in raw, raw
        await alice.stream.aclose()


def secret(tmp_path: Path) -> str:
    """A secret file for the daemon (auth on)."""
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    os.chmod(path, 0o600)
    return str(path)


async def test_with_auth_on_any_host_passes_and_the_token_guards(tmp_path: Path) -> None:
    port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=port, secret_file=secret(tmp_path), settle=False) as h:
        alice = await h.user(ALICE, keepalive=10, token=mint(SECRET, "uid", ALICE, time.time() + 60))
        token = "Authorization: Bearer " + mint(SECRET, API_ROLE, "ops", time.time() + 60)
        raw = await answer(port, get("/status/live", f"idled.example.com:{port}", token))
        assert status_of(raw) == 200 and ALICE.encode() in raw, raw
        raw = await answer(port, get("/status/live", f"idled.example.com:{port}"))
        assert status_of(raw) == 401 and ALICE.encode() not in raw, raw
        document = json.loads((await answer(port, get("/status", "idled.example.com")))[1:].split(b"\r\n\r\n", 1)[1])
        assert document["redacted"] is True
        await alice.stream.aclose()


async def test_the_head_is_read_one_way_only(tmp_path: Path) -> None:
    """The endpoint reads the request line, the Host and the Authorization headers of a head it finds by its
    CR LF CR LF. A bare LF (a line end to some proxies, not to it) and obs-fold (a line that continues the one
    before it, to others) are 400 at once. Before: a bare LF ending the request line was served (200), a head
    of bare LFs alone waited out the head deadline unanswered, and a folded ``Authorization`` line was read as
    a header of its own, so the token counted where a proxy saw none."""
    port = peers.free_port()
    async with running(tmp_path, listen=True, metrics_port=port, secret_file=secret(tmp_path), settle=False) as h:
        alice = await h.user(ALICE, keepalive=10, token=mint(SECRET, "uid", ALICE, time.time() + 60))
        token = "Bearer " + mint(SECRET, API_ROLE, "ops", time.time() + 60)
        bad = (
            b"GET /status/live HTTP/1.1\n\r\n\r\n",  # the request line ends with a bare LF
            b"GET /healthz HTTP/1.1\nHost: x\n\n",  # bare LFs only: no CR LF CR LF ever comes
            b"GET /healthz HTTP/1.1\r\nHost: x\nX: y\r\n\r\n",  # one header line
            b"GET /healthz HTTP/1.1\r\nHost: x\rX: y\r\n\r\n",  # a bare CR
            b"GET /status/live HTTP/1.1\r\nHost: x\r\nX-Pad: y\r\n Authorization: " + token.encode() + b"\r\n\r\n",
            b"GET /status/live HTTP/1.1\r\nHost: x\r\nAuthorization:\r\n\t" + token.encode() + b"\r\n\r\n",
        )
        for request in bad:
            raw, seconds = await trio.to_thread.run_sync(exchange, port, request)
            assert status_of(raw) == 400 and ALICE.encode() not in raw, (request, raw)
            assert seconds < 1.5, (request, seconds)  # at once, not at the 2 s head deadline
        good = b"GET /status/live HTTP/1.1\r\nHost: x\r\nAuthorization: " + token.encode() + b"\r\n\r\n"
        assert ALICE.encode() in await answer(port, good)
        await alice.stream.aclose()
