"""TLS connections leave nothing for the cyclic collector: what a TLS connection held is freed when it ends.

Why it matters: the GC policy (``idled.ops.gcpolicy``) freezes what survives a full collection, so garbage in
a cycle waits for the next thaw (an hour to a day). trio's ``SSLStream`` is born in a cycle (its run-once
handshake guard holds a bound method of the stream); the front (``idled.door.tls.untie``) breaks it, or
every cancelled handshake would leave ~23 objects (socket included) and every closed session ~46.

Real sockets against an in-process server. The collector is off while connections come and go, so that
nothing is collected before the count; ``gc.DEBUG_SAVEALL`` keeps what the count found, for the message.
"""

from __future__ import annotations

import gc
import socket
import ssl
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from idled.door.tls import untie
from idled.protocol import BYE, ErrorCode, Login, Welcome
from tests.peers import Client, Harness, running
from tests.tlscerts import Certs

HANDSHAKES = 1000
NOISE = 50  # objects the count may find that are not ours (the harness's, trio's): far below one per connection


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def client_hello() -> bytes:
    """A TLS ClientHello as a real client sends it first (made with the stdlib over memory BIOs)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    out = ssl.MemoryBIO()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


@contextmanager
def counting_garbage() -> Iterator[list[object]]:
    """Collector off inside; at the end the list holds what one full collection found unreachable."""
    found: list[object] = []
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def assert_no_tls_garbage(found: list[object], connections: int) -> None:
    kinds = Counter(type(o).__qualname__ for o in found)
    tls = {k: kinds[k] for k in ("SSLStream", "SSLObject", "MemoryBIO", "SocketStream", "socket") if kinds[k]}
    assert not tls and len(found) < NOISE, (
        f"{len(found)} objects in cycles after {connections} TLS connections: {kinds.most_common(12)}")


async def drained(h: Harness) -> None:
    """Wait until the server has finished with every connection (its handlers' finally blocks included)."""
    with trio.fail_after(30):
        while any(h.server.connections.values()):
            await trio.sleep(0.01)
    await trio.sleep(0.05)


@pytest.mark.slow
async def test_cancelled_handshakes_leave_no_cycles(tmp_path: Path, certs: Certs) -> None:
    cert, key = certs.server()
    hello = client_hello()
    async with running(tmp_path, listen=True, login_timeout=0.5, tls_cert=str(cert), tls_key=str(key),
                       max_pending_per_address=HANDSHAKES) as h:  # (all from one address: idled.door.gate)

        async def stall(i: int) -> None:
            # Half send a whole ClientHello (the server answers and waits for the client's Finished), half
            # send part of one (the server waits for the rest); then nothing until the login deadline.
            stream = await trio.open_tcp_stream("127.0.0.1", h.port)
            await stream.send_all(hello if i % 2 else hello[: len(hello) // 2])
            with trio.fail_after(10):
                try:
                    while await stream.receive_some(65536):
                        pass
                except trio.BrokenResourceError:
                    pass  # closed with our unread bytes: a reset
            await stream.aclose()

        with counting_garbage() as found:
            async with trio.open_nursery() as nursery:
                for i in range(HANDSHAKES):
                    nursery.start_soon(stall, i)
            await drained(h)
            assert h.metric("idled_frames_rejected_total", reason=ErrorCode.LOGIN_TIMEOUT) == HANDSHAKES
        assert_no_tls_garbage(found, HANDSHAKES)


async def test_failed_handshakes_leave_no_cycles(tmp_path: Path, certs: Certs) -> None:
    """A client certificate the server's CA did not sign fails the handshake (the client reads the server's
    ``unknown ca`` alert: idled.door.tls sends it); a plaintext client is refused ``tls_required`` before any
    handshake. Neither leaves a cycle (the gate keeps its refusal without the traceback that held the entry)."""
    cert, key = certs.server()
    stranger = Certs(tmp_path / "stranger")
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    ctx.load_cert_chain(*map(str, stranger.client("gateway:x")))
    async with running(tmp_path, listen=True, tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(certs.ca)) as h:

        def untrusted() -> str | None:
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", h.port)), server_hostname="127.0.0.1") as sock:
                try:
                    sock.recv(100)  # TLS 1.3: the server judges our certificate after our handshake ended
                except ssl.SSLError as exc:
                    return exc.reason
            return None

        with counting_garbage() as found:
            for _ in range(50):
                assert await trio.to_thread.run_sync(untrusted) == "TLSV1_ALERT_UNKNOWN_CA"
            for _ in range(50):
                client = await Client.connect(h.port, reset_is_eof=True)
                await client.send(Login("uid", "alice"))
                await client.expect_error(ErrorCode.TLS_REQUIRED)
                await client.stream.aclose()
            await drained(h)
            assert h.metric("idled_frames_rejected_total", reason="tls_handshake") == 50
            assert h.metric("idled_frames_rejected_total", reason="tls_required") == 50
        assert_no_tls_garbage(found, 100)


async def tls_user(port: int, ctx: ssl.SSLContext, uid: str, keepalive: float) -> Client:
    tcp = await trio.open_tcp_stream("127.0.0.1", port)
    stream = trio.SSLStream(tcp, ctx, server_hostname="127.0.0.1")
    await stream.do_handshake()
    untie(stream)  # the client's own stream (this process) would count as garbage too
    client = Client(stream, reset_is_eof=True)
    await client.send(Login("uid", uid, None, keepalive))
    assert isinstance(await client.recv(), Welcome)
    return client


@pytest.mark.slow
async def test_closed_sessions_leave_no_cycles(tmp_path: Path, certs: Certs) -> None:
    cert, key = certs.server()
    ctx = certs.client_context()
    per_way = 25
    async with running(tmp_path, listen=True, tls_cert=str(cert), tls_key=str(key)) as h:
        with counting_garbage() as found:

            async def session(way: str, i: int) -> None:
                client = await tls_user(h.port, ctx, f"{way}{i}", keepalive=1.0)
                if way == "bye":
                    await client.send(BYE)
                    assert await client.recv() is None
                elif way == "idle":  # the server ends it: idle timeout (1.5 x keepalive)
                    await client.expect_error(ErrorCode.IDLE_TIMEOUT)
                elif way == "kicked":  # a newer login of the same uid
                    newer = await tls_user(h.port, ctx, f"{way}{i}", keepalive=30.0)
                    await client.expect_error(ErrorCode.KICKED)
                    await newer.send(BYE)
                    assert await newer.recv() is None
                    await newer.stream.aclose()
                await client.stream.aclose()  # "gone": the peer just closes

            async with trio.open_nursery() as nursery:
                for way in ("bye", "idle", "kicked", "gone"):
                    for i in range(per_way):
                        nursery.start_soon(session, way, i)
            await drained(h)
            assert h.metric("idled_logins_total", role="user", result="ok") == 5 * per_way
        assert_no_tls_garbage(found, 5 * per_way)
