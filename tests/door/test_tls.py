"""TLS on the client port, with real sockets and Python `ssl` clients against an in-process server.

Certificates come from `tests/tlscerts.py` (the `openssl` binary; skipped with the reason where it is absent).
"""

from __future__ import annotations

import logging
import socket
import ssl
from pathlib import Path

import pytest
import trio

import time

from idled.door.tls import certificate_names
from idled.protocol import BYE, Error, ErrorCode, Login, PING, Pong, Subscribe, Welcome, tokens
from tests.peers import Client, running
from tests.tlscerts import Certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def server_cert(certs: Certs) -> tuple[Path, Path]:
    return certs.server()


def tls_settings(cert: tuple[Path, Path], **more: object) -> dict[str, object]:
    return dict(tls_cert=str(cert[0]), tls_key=str(cert[1]), **more)


async def tls_client(port: int, ctx: ssl.SSLContext, *, source: str | None = None,
                     session: ssl.SSLSession | None = None, recv_timeout: float = 10.0) -> Client:
    """A Client over TLS (handshake done), optionally resuming ``session``."""
    tcp = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    stream = trio.SSLStream(tcp, ctx, server_hostname="127.0.0.1")
    if session is not None:
        stream.session = session
    await stream.do_handshake()
    return Client(stream, recv_timeout)


async def tls_login(port: int, ctx: ssl.SSLContext, role: str, name: object, **login: object) -> Client:
    client = await tls_client(port, ctx)
    await client.send(Login(role, name, **login))  # type: ignore[arg-type]
    welcome = await client.recv()
    assert isinstance(welcome, Welcome), welcome
    return client


async def test_user_session_over_tls(tmp_path: Path, certs: Certs, server_cert: tuple[Path, Path]) -> None:
    async with running(tmp_path, listen=True, **tls_settings(server_cert)) as h:
        ctx = certs.client_context()
        obs = await tls_login(h.port, ctx, "observer", "obs")
        await obs.send(Subscribe(None))
        user = await tls_login(h.port, ctx, "uid", "alice", keepalive=1.0)
        assert isinstance(user.stream, trio.SSLStream)
        assert user.stream.selected_alpn_protocol() == "idled/1"
        assert user.stream.version() == "TLSv1.3"
        await user.send(PING)
        assert isinstance(await user.recv(), Pong)
        # Kicked by a newer login, over TLS both.
        newer = await tls_login(h.port, ctx, "uid", "alice", keepalive=1.0)
        await user.expect_error(ErrorCode.KICKED)
        await newer.send(BYE)
        assert (await obs.recv()).kind == "online"
        event = await obs.recv()
        assert (event.kind, event.reason) == ("offline", "logout")
        # Idle timeout (1.5 x keepalive), over TLS.
        idle = await tls_login(h.port, ctx, "uid", "bob", keepalive=1.0)
        await idle.expect_error(ErrorCode.IDLE_TIMEOUT)
        assert h.metric("idled_logins_total", role="user", result="ok") == 3


async def test_plaintext_client_is_told_to_use_tls_promptly(tmp_path: Path, server_cert: tuple[Path, Path]) -> None:
    """A client that begins in plain text on a TLS port gets one plain-text error frame saying so (its first
    byte is not a TLS handshake record: idled.door.gate) -- a standby or edge misconfigured without TLS learns
    why at once, instead of a handshake failing silently."""
    async with running(tmp_path, listen=True, login_timeout=30.0, **tls_settings(server_cert)) as h:
        client = await Client.connect(h.port, recv_timeout=5.0, reset_is_eof=True)
        started = trio.current_time()
        await client.send(Login("uid", "alice"))
        error = await client.recv()
        assert isinstance(error, Error) and error.code == ErrorCode.TLS_REQUIRED
        assert await client.recv() is None
        assert trio.current_time() - started < 1.0  # not at the login timeout (30 s)
        assert h.metric("idled_frames_rejected_total", reason="tls_required") == 1


async def test_handshake_counts_against_the_login_timeout(tmp_path: Path, server_cert: tuple[Path, Path]) -> None:
    async with running(tmp_path, listen=True, login_timeout=0.3, **tls_settings(server_cert)) as h:
        sock = socket.create_connection(("127.0.0.1", h.port))  # connects, never says hello
        started = trio.current_time()
        with trio.fail_after(5):
            while not await trio.to_thread.run_sync(sock.recv, 100) == b"":
                pass
        assert 0.25 < trio.current_time() - started < 3
        sock.close()
        assert h.metric("idled_frames_rejected_total", reason="login_timeout") == 1


@pytest.mark.parametrize("kind", ["self_signed", "expired"])
async def test_verifying_client_rejects_bad_certificates(tmp_path: Path, certs: Certs, kind: str) -> None:
    cert = getattr(certs, kind)()
    async with running(tmp_path, listen=True, **tls_settings(cert)) as h:
        with pytest.raises(trio.BrokenResourceError) as info:
            await tls_client(h.port, certs.client_context())
        assert isinstance(info.value.__cause__, ssl.SSLCertVerificationError)
        expected = "self-signed" if kind == "self_signed" else "expired"
        assert expected in str(info.value.__cause__)


async def test_tls12_is_served_with_forward_secrecy(
    tmp_path: Path, certs: Certs, server_cert: tuple[Path, Path]
) -> None:
    async with running(tmp_path, listen=True, **tls_settings(server_cert)) as h:
        ctx12 = certs.client_context()
        ctx12.maximum_version = ssl.TLSVersion.TLSv1_2  # 1.2 still served (with an ECDHE AEAD suite)
        client = await tls_client(h.port, ctx12)
        assert client.stream.version() == "TLSv1.2" and "ECDHE" in client.stream.cipher()[0]


async def test_session_resumption(tmp_path: Path, certs: Certs, server_cert: tuple[Path, Path]) -> None:
    async with running(tmp_path, listen=True, **tls_settings(server_cert)) as h:
        ctx = certs.client_context()
        first = await tls_login(h.port, ctx, "uid", "alice")  # reading the welcome also reads the ticket
        session = first.stream.session
        assert session is not None and session.has_ticket
        await first.send(BYE)
        second = await tls_client(h.port, ctx, session=session)
        assert second.stream.session_reused
        await second.send(Login("uid", "alice"))
        assert isinstance(await second.recv(), Welcome)


async def test_client_certificates_log_in_gateways_and_observers(
    tmp_path: Path, certs: Certs, server_cert: tuple[Path, Path]
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"s" * 32)
    settings = tls_settings(server_cert, tls_client_ca=str(certs.ca), secret_file=str(secret_file))
    gw1 = certs.client_context(certs.client("gateway:gw1"))
    obs_cn = certs.client_context(certs.client("observer:obs", cn=True))
    async with running(tmp_path, listen=True, **settings) as h:
        await tls_login(h.port, gw1, "gateway", "gw1")  # no token: the certificate names it
        await tls_login(h.port, obs_cn, "observer", "obs")  # CN "observer:obs", no URI names
        for ctx, role, name in [(gw1, "gateway", "gw2"), (gw1, "observer", "gw1"), (gw1, "uid", "gw1"),
                                (certs.client_context(), "gateway", "gw1")]:
            client = await tls_client(h.port, ctx)
            await client.send(Login(role, name))
            await client.expect_error(ErrorCode.AUTH_FAILED)
        # A login that carries a token is checked as a token, certificate or not.
        client = await tls_client(h.port, gw1)
        await client.send(Login("gateway", "gw1", token="v1.bogus"))
        await client.expect_error(ErrorCode.AUTH_FAILED)
        # A token still works over TLS, with or without a certificate.
        token = tokens.mint(tokens.load_secret(str(secret_file)), "uid", "carol", time.time() + 60)
        await tls_login(h.port, certs.client_context(), "uid", "carol", token=token)
        # A certificate from another CA fails the handshake.
        other = Certs(tmp_path / "other")
        with pytest.raises(trio.BrokenResourceError):
            client = await tls_client(h.port, certs.client_context(other.client("gateway:gw1")))
            await client.send(Login("gateway", "gw1"))
            await client.recv()


def test_certificate_names_rule() -> None:
    uri = {"subject": ((("commonName", "gateway:cn"),),),
           "subjectAltName": (("URI", "idled:gateway:gw1"), ("DNS", "gateway:dns"), ("URI", "https://x"))}
    assert certificate_names(uri) == {"gateway:gw1"}  # URIs present: the CN is not consulted
    assert certificate_names({"subject": ((("commonName", "observer:o"),),)}) == {"observer:o"}
    assert certificate_names({"subject": ((("commonName", "x"),),), "subjectAltName": (("DNS", "gateway:x"),)}) == {"x"}


async def test_proxy_v2_then_tls(tmp_path: Path, certs: Certs, server_cert: tuple[Path, Path],
                                 caplog: pytest.LogCaptureFixture) -> None:
    from idled.protocol.proxy import encode_v2

    caplog.set_level(logging.DEBUG, logger="idled.server.peers")
    async with running(tmp_path, listen=True, proxy_protocol=True, **tls_settings(server_cert)) as h:
        tcp = await trio.open_tcp_stream("127.0.0.1", h.port)
        await tcp.send_all(encode_v2(("198.51.100.7", 40001), ("127.0.0.1", h.port)))
        stream = trio.SSLStream(tcp, certs.client_context(), server_hostname="127.0.0.1")
        client = Client(stream)
        await client.send(Login("uid", "alice"))
        assert isinstance(await client.recv(), Welcome)
    assert "login user 'alice' from 198.51.100.7:40001" in caplog.text
