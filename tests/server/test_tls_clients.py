"""The client library and the operator commands over TLS, against a TLS listener."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from idled.client import TLSRequired
from idled.client.asyncio import open_session as asyncio_session
from idled.client.trio import open_observer, open_session
from idled.protocol import Login, Welcome
from tests.door.test_tls import tls_client
from tests.peers import running
from tests.tlscerts import Certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def settings(certs: Certs) -> dict[str, object]:
    cert, key = certs.server()
    return dict(tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(certs.ca))


async def test_trio_client_reconnects_with_a_resumed_session(tmp_path: Path, certs: Certs) -> None:
    async with running(tmp_path, listen=True, **settings(certs)) as h:
        async with open_session("127.0.0.1", h.port, "alice", keepalive=30, ssl_context=certs.client_context(),
                                backoff=None) as session:
            first = session._conn
            assert isinstance(first.stream, trio.SSLStream) and not first.stream.session_reused
            await session.send({"hello": 1})
            first.stream.transport_stream.socket.shutdown(socket.SHUT_RDWR)  # the network drops it
            with trio.fail_after(15):
                while session._conn is first or session._conn is None:
                    await trio.sleep(0.01)
            assert session.connections == 2
            assert session._conn.stream.session_reused  # the reconnect was a resumed handshake


async def test_trio_gateway_by_client_certificate(tmp_path: Path, certs: Certs) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"k" * 32)
    async with running(tmp_path, listen=True, secret_file=str(secret), **settings(certs)) as h:
        ctx = certs.client_context(certs.client("observer:watcher"))
        async with open_observer("127.0.0.1", h.port, "watcher", ssl_context=ctx, subscribe=False) as observer:
            assert observer.welcome is not None and observer.welcome.name == "watcher"


async def test_asyncio_client_over_tls(tmp_path: Path, certs: Certs) -> None:
    async with running(tmp_path, listen=True, **settings(certs)) as h:
        port, ctx = h.port, certs.client_context()

        async def main() -> str:
            async with asyncio_session("127.0.0.1", port, "bob", keepalive=30, ssl_context=ctx) as session:
                return session.welcome.name

        assert await trio.to_thread.run_sync(asyncio.run, main()) == "bob"


async def test_operator_commands_over_tls(tmp_path: Path, certs: Certs) -> None:
    async with running(tmp_path, listen=True, **settings(certs)) as h:
        alice = await tls_client(h.port, certs.client_context())
        await alice.send(Login("uid", "alice"))
        assert isinstance(await alice.recv(), Welcome)
        base = [sys.executable, "-m", "idled.cli.main", "query", "--port", str(h.port), "--json", "alice", "bob"]

        def run(*flags: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*base, *flags], capture_output=True, text=True, timeout=60)

        verified = await trio.to_thread.run_sync(run, "--tls", "--ca-file", str(certs.ca))
        assert verified.returncode == 0, verified.stderr
        assert json.loads(verified.stdout)["alice"] is True
        untrusted = await trio.to_thread.run_sync(run, "--tls")  # the system store does not know the test CA
        assert untrusted.returncode == 1 and "certificate verify failed" in untrusted.stderr
        skipped = await trio.to_thread.run_sync(run, "--insecure-skip-verify")
        assert skipped.returncode == 0, skipped.stderr
        plaintext = await trio.to_thread.run_sync(run)
        assert plaintext.returncode == 1
        bad = await trio.to_thread.run_sync(run, "--tls", "--ca-file", str(tmp_path / "missing.pem"))
        assert bad.returncode == 2 and "TLS:" in bad.stderr


async def test_a_plaintext_client_on_a_tls_port_learns_why_at_once(tmp_path: Path, certs: Certs) -> None:
    """`tls_required` is a configuration error: the library raises `TLSRequired` at the first attempt (not
    retried, though reconnecting is on), and `idled user` prints what to give."""
    async with running(tmp_path, listen=True, login_timeout=30.0, **settings(certs)) as h:
        started = trio.current_time()
        with pytest.raises(TLSRequired) as info:
            async with open_session("127.0.0.1", h.port, "alice", keepalive=30):
                pass
        assert trio.current_time() - started < 5 and not info.value.retryable
        assert "connected without it" in str(info.value)
        done = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "idled.cli.main", "user", "alice", "--port", str(h.port)],
            capture_output=True, text=True, timeout=60))
        assert done.returncode == 1
        assert done.stderr.strip() == ("idled user: tls_required: the daemon speaks TLS on this port: give --tls "
                                       "(and --ca-file FILE if its certificate is from a private CA)")
