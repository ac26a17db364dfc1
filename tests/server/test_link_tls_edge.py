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
from tests.peers import Client, Daemon, free_port, serve_command
from tests.tlscerts import Certs

pytestmark = pytest.mark.slow

SECRET = b"e" * 32


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def token(role: str, name: str) -> str:
    return tokens.mint(SECRET, role, name, time.time() + 600)


def tls_core(tmp_path: Path, certs: Certs, *options: str, cert: tuple[Path, Path] | None = None,
             name: str = "core") -> Daemon:
    """A core serving TLS with ``cert`` (default: a good one from ``certs``), its files under ``tmp_path``
    (``name`` tells two cores apart), the shared secret in ``tmp_path / "secret"``."""
    cert_file, key = certs.server() if cert is None else cert
    return plain_core(tmp_path, "--tls-cert", str(cert_file), "--tls-key", str(key), *options, name=name)


def plain_core(tmp_path: Path, *options: str, name: str = "core") -> Daemon:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    command = serve_command(tmp_path / f"{name}-data", "--metrics-port", "0", "--secret-file", str(secret), *options)
    return Daemon(command, tmp_path / f"{name}.err")


def edge_command(core_port: int | str, *options: str) -> list[str]:
    """``core_port``: the port of one core on 127.0.0.1, or a ``--core`` list as it is."""
    cores = f"127.0.0.1:{core_port}" if isinstance(core_port, int) else core_port
    return [sys.executable, "-m", "idled.cli.main", "edge", "--core", cores, "--port", "0", *options]


async def run_to_exit(command: list[str]) -> subprocess.CompletedProcess[str]:
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60))


def one_fatal_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``idled: fatal:`` line of a process that exited 2 with no traceback."""
    fatal = [line for line in done.stderr.splitlines() if line.startswith("idled: fatal:")]
    assert done.returncode == 2 and len(fatal) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return fatal[0]


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



# -- several cores (--core A,B): a mismatch with one is not the end while another may agree ---------------------


async def test_an_edge_whose_first_core_speaks_plain_text_comes_up_over_tls_through_the_second(
        tmp_path: Path, certs: Certs) -> None:
    """Fails before the fix: the edge exited 2 on the first core's mismatch ("edge link (to the core at A): it
    does not speak TLS on that port"), never trying B, which serves TLS."""
    async with plain_core(tmp_path, name="plain") as plain, tls_core(tmp_path, certs, name="tls") as tls:
        cores = f"127.0.0.1:{plain.port},127.0.0.1:{tls.port}"
        edge = Daemon(edge_command(cores, "--secret-file", str(tmp_path / "secret"), "--link-tls",
                                   "--link-ca", str(certs.ca), "--name", "edge-1"), tmp_path / "edge.err")
        async with edge:
            obs = await watch(edge.port, token=token("observer", "obs"))  # relayed to the core that answered
            user = await Client.login(edge.port, "uid", "alice", keepalive=30, token=token("uid", "alice"))
            await user.send(PING)
            assert await user.recv() is PONG
            event = await next_event(obs)
            assert (event.kind, event.uid) == ("online", "alice")
            log = edge.stderr()
            assert f"core link to 127.0.0.1:{tls.port} up (connection 1, TLS)" in log
            # The first core's mismatch is said once, naming that core, and the next one was tried.
            said = [line for line in log.splitlines() if f"core link to 127.0.0.1:{plain.port}: it does not speak TLS"
                    in line]
            assert len(said) == 1 and f"trying 127.0.0.1:{tls.port}" in said[0], log
        assert "online" not in plain.stderr() and "alice" not in plain.stderr()


async def test_an_edge_whose_every_core_mismatches_is_one_fatal_line_naming_them_all(
        tmp_path: Path, certs: Certs) -> None:
    """Plain text at A, an expired certificate at B: nothing can cure it by waiting, so the edge ends in one
    line (exit 2) naming both cores and what to change at each."""
    async with plain_core(tmp_path, name="plain") as plain, \
            tls_core(tmp_path, certs, cert=certs.expired(), name="expired") as expired:
        a, b = f"127.0.0.1:{plain.port}", f"127.0.0.1:{expired.port}"
        done = await run_to_exit(edge_command(f"{a},{b}", "--secret-file", str(tmp_path / "secret"), "--link-tls",
                                              "--link-ca", str(certs.ca)))
    fatal = one_fatal_line(done)
    assert fatal == (f"idled: fatal: edge link (to the cores at {a}, {b}): "
                     f"{a}: it does not speak TLS on that port (it answered the TLS hello in plain text: too_large): "
                     "remove link_tls, or give that core tls_cert and tls_key; "
                     f"{b}: its certificate does not verify (certificate has expired): renew that core's certificate "
                     "(tls_cert)"), fatal


async def test_several_cores_with_the_same_mismatch_are_named_once_with_it(tmp_path: Path, certs: Certs) -> None:
    """Two TLS cores, an edge without link_tls: one reason, both cores."""
    async with tls_core(tmp_path, certs, name="a") as core_a, tls_core(tmp_path, certs, name="b") as core_b:
        a, b = f"127.0.0.1:{core_a.port}", f"127.0.0.1:{core_b.port}"
        done = await run_to_exit(edge_command(f"{a},{b}", "--secret-file", str(tmp_path / "secret")))
    assert one_fatal_line(done) == (
        f"idled: fatal: edge link (to the cores at {a}, {b}): it serves TLS on that port (it answered tls_required): "
        "give link_tls (--link-tls), and link_ca the CA of its certificate unless the system trusts it")


async def test_a_core_that_cannot_be_reached_is_not_a_mismatch(tmp_path: Path, certs: Certs) -> None:
    """A mismatching core and one that is not up yet: the edge waits (nothing says the second will not agree),
    and comes up through it once it listens."""
    later = free_port()
    async with plain_core(tmp_path, name="plain") as plain:
        a, b = f"127.0.0.1:{plain.port}", f"127.0.0.1:{later}"
        edge = Daemon(edge_command(f"{a},{b}", "--secret-file", str(tmp_path / "secret"), "--link-tls",
                                   "--link-ca", str(certs.ca)), tmp_path / "edge.err")
        try:
            with trio.fail_after(20):
                while f"core link to {a}: it does not speak TLS" not in edge.stderr():
                    assert edge.proc.poll() is None, edge.stderr()
                    await trio.sleep(0.05)
            await trio.sleep(1.0)  # a few rounds of A refused, B unreachable (the backoff starts at 0.1 s)
            assert edge.proc.poll() is None, edge.stderr()
            async with tls_core(tmp_path, certs, "--port", str(later), name="later"):
                async with edge:
                    user = await Client.login(edge.port, "uid", "bob", keepalive=30, token=token("uid", "bob"))
                    await user.send(PING)
                    assert await user.recv() is PONG
                    log = edge.stderr()
                    assert f"core link to {b} up (connection 1, TLS)" in log
                    assert log.count(f"core link to {a}: it does not speak TLS") == 1, log  # once, not per round
        finally:
            edge.kill()
