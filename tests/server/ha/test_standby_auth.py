"""Who may replicate, on an in-process core (auth on): the ``standby`` role's auth matrix, its one request, its
certificate identity under mTLS, and an observer's ``replicate`` refused. Subprocess scenarios (a paused sync
standby beside an impostor, a standby core, ``--workers``, an older active): tests/server/ha/test_standby_role.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
import trio.testing

from idled.protocol import BYE, PING, ErrorCode, FrameDecoder, Login, Query, Subscribe, Welcome, encode, tokens
from idled.protocol.replication import Records, encode_replicate, parse_replication_message
from idled.server.ha.feed import FIRST_REQUEST_TIMEOUT
from idled.server.roles.observers import REPLICATE_REFUSED
from tests.peers import MAX_FRAME, Client, Harness, running
from tests.tlscerts import Certs

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER_SECRET = b"another secret of 32 bytes......"
NAME = "standby-b"


def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    return str(path)


def standby_token(name: str = NAME, *, secret: bytes = SECRET, ttl: float = 3600.0) -> str:
    return tokens.mint(secret, "standby", name, time.time() + ttl)


def refused_logins(secret: bytes = SECRET) -> dict[str, Login]:
    """Every way a ``standby`` login can be refused by its token (``auth_failed``)."""
    later = time.time() + 3600
    return {
        "no token": Login("standby", NAME),
        "garbage": Login("standby", NAME, "v1.bogus"),
        "an observer token": Login("standby", NAME, tokens.mint(secret, "observer", NAME, later)),
        "a uid token": Login("standby", NAME, tokens.mint(secret, "uid", NAME, later)),
        "a gateway token": Login("standby", NAME, tokens.mint(secret, "gateway", NAME, later)),
        "an api token": Login("standby", NAME, tokens.mint(secret, "api", NAME, later)),
        "expired": Login("standby", NAME, standby_token(secret=secret, ttl=-1)),
        "another secret": Login("standby", NAME, standby_token(secret=OTHER_SECRET)),
        "another standby's": Login("standby", NAME, standby_token("standby-c", secret=secret)),
        # ...and the reverse: a standby token is no observer's
        "an observer with a standby token": Login("observer", NAME, standby_token(secret=secret)),
    }


def replicating(client: Client) -> Client:
    """From now on the client reads the replication link's frames (records, resync) besides server messages."""
    client.decoder = FrameDecoder(MAX_FRAME, parse=parse_replication_message)
    return client


async def refused(h: Harness, login: Login) -> str:
    peer = await h.connect()
    await peer.send_raw(encode(login) + encode_replicate(1, None))
    return (await peer.expect_error(ErrorCode.AUTH_FAILED)).reason


async def test_only_a_standby_token_for_its_name_logs_in_as_a_standby(tmp_path: Path) -> None:
    async with running(tmp_path, secret_file=secret_file(tmp_path)) as h:
        for what, login in refused_logins().items():
            reason = await refused(h, login)
            assert reason, what
        assert h.metric("idled_logins_total", role="standby", result="auth_failed") == len(refused_logins()) - 1
        replicas = h.server.running.replicas
        assert replicas is not None and replicas.attached == 0

        standby = replicating(await h.connect())
        await standby.send_raw(encode(Login("standby", NAME, standby_token())) + encode_replicate(1, None))
        welcome = await standby.expect(Welcome)
        assert (welcome.role, welcome.name) == ("standby", NAME)
        for uid in ("alice", "bob"):  # four events: an online and an offline each
            user = await h.user(uid, token=tokens.mint(SECRET, "uid", uid, time.time() + 60))
            await user.send(BYE)
            assert await user.recv() is None
        got = 0
        while got < 4:  # the four events of two users, as records
            got += len((await standby.expect(Records)).records)
        assert h.metric("idled_connections", role="standby") == 1
        assert h.metric("idled_logins_total", role="standby", result="ok") == 1
        assert h.metric("idled_standbys_attached") == 1
        assert [link["name"] for link in replicas.status()["standbys"]] == [NAME]
        h.server.stop()
        await standby.expect_error(ErrorCode.SERVER_SHUTDOWN)  # told why, like every peer


async def test_a_standby_login_asks_replicate_and_nothing_else(tmp_path: Path) -> None:
    async with running(tmp_path, secret_file=secret_file(tmp_path)) as h:
        for request in (Subscribe(None), Query(("a",)), PING, Login("standby", NAME, standby_token())):
            peer = await h.connect()
            await peer.send_raw(encode(Login("standby", NAME, standby_token())) + encode(request))
            await peer.expect(Welcome)
            error = await peer.expect_error(ErrorCode.NOT_ALLOWED)
            assert "a standby login's one request is replicate" in error.reason
        replicas = h.server.running.replicas
        assert replicas is not None and replicas.attached == 0


async def test_a_silent_standby_login_is_closed(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path, secret_file=secret_file(tmp_path)) as h:
        peer = await h.connect()
        await peer.send(Login("standby", NAME, standby_token()))
        await peer.expect(Welcome)
        start = trio.current_time()
        error = await peer.expect_error(ErrorCode.IDLE_TIMEOUT)
        assert "no replicate" in error.reason
        assert trio.current_time() - start == pytest.approx(FIRST_REQUEST_TIMEOUT, abs=0.1)
        assert h.server.connections["standby"] == 0


async def test_an_observer_that_sends_replicate_is_told_to_upgrade(tmp_path: Path) -> None:
    """What an older standby (observer login + replicate) meets on this core; and any observer token."""
    async with running(tmp_path, secret_file=secret_file(tmp_path)) as h:
        for before in (b"", encode(Subscribe(None))):
            peer = await h.connect()
            token = tokens.mint(SECRET, "observer", "dashboard", time.time() + 60)
            await peer.send_raw(encode(Login("observer", "dashboard", token)) + before + encode_replicate(1, None))
            await peer.expect(Welcome)
            error = await peer.expect_error(ErrorCode.NOT_ALLOWED)
            assert error.reason == REPLICATE_REFUSED and "upgrade" in error.reason
        replicas = h.server.running.replicas
        assert replicas is not None and replicas.attached == 0 and replicas.status()["standbys"] == []


async def tls_standby(port: int, certs: Certs, identity: str, login: Login) -> Client:
    tcp = await trio.open_tcp_stream("127.0.0.1", port)
    stream = trio.SSLStream(tcp, certs.client_context(certs.client(identity)), server_hostname="127.0.0.1")
    await stream.do_handshake()
    client = replicating(Client(stream))
    await client.send_raw(encode(login) + encode_replicate(1, None))
    return client


async def test_a_client_certificate_names_a_standby(tmp_path: Path) -> None:
    certs = Certs(tmp_path / "certs")
    cert, key = certs.server()
    settings = dict(tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(certs.ca),
                    secret_file=secret_file(tmp_path))
    async with running(tmp_path, listen=True, **settings) as h:
        # The certificate's identity, and nothing else: another name, another role, another role's certificate.
        for identity, login in (("standby:sb1", Login("standby", "sb2")), ("standby:sb1", Login("observer", "sb1")),
                                ("observer:sb1", Login("standby", "sb1")), ("gateway:sb1", Login("standby", "sb1"))):
            client = await tls_standby(h.port, certs, identity, login)
            await client.expect_error(ErrorCode.AUTH_FAILED)
        client = await tls_standby(h.port, certs, "standby:sb1", Login("standby", "sb1"))
        welcome = await client.expect(Welcome)
        assert (welcome.role, welcome.name) == ("standby", "sb1")
        await client.expect(Records)  # replicating (a heartbeat, on an empty log)
        replicas = h.server.running.replicas
        assert replicas is not None and [link["name"] for link in replicas.status()["standbys"]] == ["sb1"]
        await client.stream.aclose()
