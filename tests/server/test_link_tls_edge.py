"""`idled edge` in front of a TLS core (issue 33, item 6): the edge's link and the connections it relays over
TLS; an edge that cannot speak to its core refused at start in one line; a relayed login never borrows the
edge's client certificate. Real `idled serve` / `idled edge` subprocesses, real certificates, loopback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from idled.protocol import PING, PONG, Attach, ErrorCode, Event, Login, Subscribe, tokens
from tests.peers import Client, Daemon, serve_command
from tests.tlscerts import Certs

pytestmark = pytest.mark.slow

SECRET = b"e" * 32


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def token(role: str, name: str) -> str:
    return tokens.mint(SECRET, role, name, time.time() + 600)


def tls_core(tmp_path: Path, certs: Certs, *options: str) -> Daemon:
    cert, key = certs.server()
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    command = serve_command(tmp_path / "data", "--metrics-port", "0", "--secret-file", str(secret),
                            "--tls-cert", str(cert), "--tls-key", str(key), *options)
    return Daemon(command, tmp_path / "core.err")


def edge_command(core_port: int, *options: str) -> list[str]:
    return [sys.executable, "-m", "idled.cli.main", "edge", "--core", f"127.0.0.1:{core_port}", "--port", "0",
            *options]


async def watch(port: int, **login: object) -> Client:
    """A live observer through the edge's relay, its subscription in place (a ping after it answered)."""
    peer = await Client.login(port, "observer", "obs", **login)  # type: ignore[arg-type]
    await peer.send(Subscribe(None))
    await peer.send(PING)
    assert await peer.recv() is PONG
    return peer


async def next_event(peer: Client) -> Event:
    message = await peer.recv(10.0)
    assert isinstance(message, Event), message
    return message


async def test_users_gateways_and_observers_through_an_edge_whose_core_speaks_tls(tmp_path: Path, certs: Certs) -> None:
    """Fails on main: `idled edge` had no link TLS (its link to a TLS core was refused tls_required, for ever)."""
    async with tls_core(tmp_path, certs) as core:
        edge = Daemon(edge_command(core.port, "--secret-file", str(tmp_path / "secret"), "--link-tls",
                                   "--link-ca", str(certs.ca), "--name", "edge-1"), tmp_path / "edge.err")
        async with edge:
            obs = await watch(edge.port, token=token("observer", "obs"))  # relayed, over TLS
            user = await Client.login(edge.port, "uid", "alice", keepalive=30, token=token("uid", "alice"))
            await user.send(PING)
            assert await user.recv() is PONG
            event = await next_event(obs)
            assert (event.kind, event.uid) == ("online", "alice")
            gateway = await Client.login(edge.port, "gateway", "gw", token=token("gateway", "gw"))  # relayed
            await gateway.send(Attach(("bob",), 600.0))
            event = await next_event(obs)
            assert (event.kind, event.uid) == ("online", "bob")
            assert f"core link to 127.0.0.1:{core.port} up (connection 1, TLS)" in edge.stderr()
        # Nothing reached the core in plain text: every connection of the edge's was TLS.
        assert "tls_required" not in core.stderr()


async def test_an_edge_without_link_tls_in_front_of_a_tls_core_is_one_fatal_line(tmp_path: Path, certs: Certs) -> None:
    """Fails on main: the edge waited for its core for ever ("waiting for the core"), its link refused
    tls_required at every attempt."""
    async with tls_core(tmp_path, certs) as core:
        command = edge_command(core.port, "--secret-file", str(tmp_path / "secret"))
        done = await trio.to_thread.run_sync(lambda: subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60))
    fatal = [line for line in done.stderr.splitlines() if line.startswith("idled: fatal:")]
    assert done.returncode == 2 and len(fatal) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert fatal[0] == (f"idled: fatal: edge link (to the core at 127.0.0.1:{core.port}): it serves TLS on that port "
                        "(it answered tls_required): give link_tls (--link-tls), and link_ca the CA of its "
                        "certificate unless the system trusts it")


async def test_a_relayed_login_does_not_borrow_the_edges_client_certificate(tmp_path: Path, certs: Certs) -> None:
    """An edge with no secret (auth off, on loopback) logs in to its core by client certificate
    (``idled:gateway:edge-cert``). A peer that connects to that edge as the gateway ``edge-cert`` with no
    token is relayed on a connection of its own, which presents no certificate: the core refuses it."""
    async with tls_core(tmp_path, certs, "--tls-client-ca", str(certs.ca)) as core:
        cert, key = certs.client("gateway:edge-cert")
        edge = Daemon(edge_command(core.port, "--name", "edge-cert", "--link-tls", "--link-ca", str(certs.ca),
                                   "--link-cert", str(cert), "--link-key", str(key)), tmp_path / "edge.err")
        async with edge:
            user = await Client.login(edge.port, "uid", "carol", keepalive=30)  # attached by the certified link
            await user.send(PING)
            assert await user.recv() is PONG
            impostor = await Client.connect(edge.port)
            await impostor.send(Login("gateway", "edge-cert"))
            await impostor.expect_error(ErrorCode.AUTH_FAILED)
            honest = await Client.login(edge.port, "gateway", "gw", token=token("gateway", "gw"))
            assert honest is not None
        assert "auth_failed" not in edge.stderr()  # the link itself was never refused


async def test_a_client_certificate_the_core_does_not_trust_is_one_fatal_line(tmp_path: Path, certs: Certs) -> None:
    """The core's refusal of our certificate arrives after the client's TLS 1.3 handshake, at the first read:
    still recognised, still one line at start."""
    async with tls_core(tmp_path, certs, "--tls-client-ca", str(certs.ca)) as core:
        stranger = Certs(tmp_path / "stranger")  # another CA: the core does not trust its certificates
        cert, key = stranger.client("gateway:edge-x")
        command = edge_command(core.port, "--name", "edge-x", "--link-tls", "--link-ca", str(certs.ca),
                               "--link-cert", str(cert), "--link-key", str(key))
        done = await trio.to_thread.run_sync(lambda: subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60))
    fatal = [line for line in done.stderr.splitlines() if line.startswith("idled: fatal:")]
    assert done.returncode == 2 and len(fatal) == 1, done.stderr[-2000:]
    assert "it refused our certificate" in fatal[0] and "give link_cert a certificate its tls_client_ca trusts" in fatal[0]

