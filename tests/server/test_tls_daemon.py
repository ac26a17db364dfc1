"""TLS with real `idled serve` processes: SIGHUP certificate rotation, `openssl s_client` interop, --workers."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
from pathlib import Path

import pytest
import trio

import time

from idled.protocol import BYE, PING, Error, ErrorCode, Login, Pong, Subscribe, encode, tokens
from tests.door.test_tls import tls_client, tls_login
from tests.peers import Client, Daemon, serve_command
from tests.tlscerts import Certs, need_openssl

pytestmark = pytest.mark.slow


def der(client: Client) -> bytes:
    stream = client.stream
    assert isinstance(stream, trio.SSLStream)
    return stream.getpeercert(binary_form=True)


async def test_sighup_rotates_the_certificate_without_dropping_connections(tmp_path: Path) -> None:
    certs = Certs(tmp_path / "certs")
    old, new = certs.server("old"), certs.server("new")
    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(old[0], live_cert)
    shutil.copy(old[1], live_key)
    daemon = Daemon(serve_command(tmp_path / "data", "--tls-cert", str(live_cert), "--tls-key", str(live_key)),
                    tmp_path / "serve.err")
    try:
        port = await daemon.started()
        ctx = certs.client_context()
        before = await tls_login(port, ctx, "uid", "alice", keepalive=60)
        assert der(before) == ssl.PEM_cert_to_DER_cert(old[0].read_text())
        shutil.copy(new[0], live_cert)
        shutil.copy(new[1], live_key)
        daemon.proc.send_signal(signal.SIGHUP)
        with trio.fail_after(10):
            while "TLS certificate reloaded" not in daemon.stderr():
                await trio.sleep(0.02)
        after = await tls_login(port, ctx, "uid", "bob", keepalive=60)
        assert der(after) == ssl.PEM_cert_to_DER_cert(new[0].read_text())
        await before.send(PING)  # the old connection is still up, on its old session
        assert isinstance(await before.recv(), Pong)
        # A broken file on the next SIGHUP keeps the current certificate, and says so.
        live_key.write_text("not a key\n")
        daemon.proc.send_signal(signal.SIGHUP)
        with trio.fail_after(10):
            while "TLS certificate not reloaded" not in daemon.stderr():
                await trio.sleep(0.02)
        again = await tls_login(port, ctx, "uid", "carol", keepalive=60)
        assert der(again) == der(after)
        assert await daemon.stop() == 0
    finally:
        daemon.kill()


async def test_a_certificate_that_does_not_load_is_one_fatal_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    daemon = Daemon(serve_command(tmp_path / "data", "--tls-cert", str(missing), "--tls-key", str(missing)),
                    tmp_path / "serve.err")
    try:
        assert await daemon.wait() == 2
        assert "idled: fatal: cannot start TLS" in daemon.stderr() and "Traceback" not in daemon.stderr()
    finally:
        daemon.kill()


def s_client(port: int, ca: Path, *options: str, stdin: bytes = b"") -> str:
    result = subprocess.run(
        [need_openssl(), "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", str(ca), "-alpn", "idled/1",
         "-servername", "localhost", *options],
        input=stdin, capture_output=True, timeout=30,
    )
    return result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")


async def test_openssl_s_client_interop(tmp_path: Path) -> None:
    need_openssl()
    certs = Certs(tmp_path / "certs")
    cert = certs.server()
    daemon = Daemon(serve_command(tmp_path / "data", "--tls-cert", str(cert[0]), "--tls-key", str(cert[1])),
                    tmp_path / "serve.err")
    try:
        port = await daemon.started()
        out = await trio.to_thread.run_sync(lambda: s_client(port, certs.ca, "-ign_eof",
                                                             stdin=encode(Login("uid", "alice")) + encode(BYE)))
        assert "ALPN protocol: idled/1" in out and "Verify return code: 0 (ok)" in out, out
        assert "TLSv1.3" in out
        assert "welcome" in out  # the welcome frame, printed raw
        old = await trio.to_thread.run_sync(lambda: s_client(port, certs.ca, "-tls1_1"))
        assert "ALPN protocol: idled/1" not in old and "Cipher is (NONE)" in old, old
        assert await daemon.stop() == 0
    finally:
        daemon.kill()


async def test_workers_terminate_tls_at_every_edge(tmp_path: Path) -> None:
    certs = Certs(tmp_path / "certs")
    cert = certs.server()
    secret = tmp_path / "secret"
    secret.write_bytes(b"w" * 32)
    daemon = Daemon(serve_command(tmp_path / "data", "--workers", "2", "--tls-cert", str(cert[0]),
                                  "--tls-key", str(cert[1]), "--tls-client-ca", str(certs.ca),
                                  "--secret-file", str(secret)), tmp_path / "serve.err", timeout=60)
    try:
        port = await daemon.started()
        ctx = certs.client_context()
        # An observer logged in by its client certificate at an edge, relayed to the core, which accepts it.
        observer = await tls_login(port, certs.client_context(certs.client("observer:audit")), "observer", "audit")
        await observer.send(Subscribe(None))
        key = tokens.load_secret(str(secret))
        clients = [await tls_login(port, ctx, "uid", f"u{i}", keepalive=60,
                                   token=tokens.mint(key, "uid", f"u{i}", time.time() + 60)) for i in range(8)]
        seen = {(await observer.recv()).uid for _ in clients}
        assert seen == {f"u{i}" for i in range(8)}
        for client in clients:
            await client.send(PING)
            assert isinstance(await client.recv(), Pong)
        plain = await Client.connect(port, recv_timeout=5, reset_is_eof=True)
        await plain.send(Login("uid", "plain"))
        refused = await plain.recv()  # told in plain text why (idled.door.gate), then closed
        assert isinstance(refused, Error) and refused.code == ErrorCode.TLS_REQUIRED
        assert await plain.recv() is None
        for client in clients:
            assert isinstance(client.stream, trio.SSLStream)
        assert await daemon.stop() == 0
    finally:
        daemon.kill()


async def test_plain_client_against_tls_helper_is_not_welcome(tmp_path: Path) -> None:
    """The helper's contract: a TLS client against a plaintext port fails the handshake, not later."""
    certs = Certs(tmp_path / "certs")
    daemon = Daemon(serve_command(tmp_path / "data"), tmp_path / "serve.err")
    try:
        port = await daemon.started()
        with pytest.raises(trio.BrokenResourceError):
            await tls_client(port, certs.client_context())
        await Client.login(port, "uid", "ok")  # (the port itself is fine)
        assert await daemon.stop() == 0
    finally:
        daemon.kill()
