"""A real HAProxy in front of idled: HAProxy terminates TLS and speaks PROXY v2 to idled (deploy/haproxy/).

The recipe itself is what runs: `deploy/haproxy/haproxy.cfg` with its public address, certificate path and
idled address rewritten to loopback ones. Skipped, with the reason, where `haproxy` is not installed
(`.ci/system-deps` installs it).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from idled.protocol import PING, ErrorCode, Login, Pong, Welcome
from idled.protocol.proxy import encode_v2
from tests.peers import Client, free_port, running
from tests.tlscerts import Certs

pytestmark = pytest.mark.slow

HAPROXY = shutil.which("haproxy") or (shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin"))
RECIPE = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"


def need_haproxy() -> str:
    if HAPROXY is None:
        pytest.skip("haproxy is not installed (Debian: apt-get install haproxy; see .ci/system-deps)")
    return HAPROXY


def loopback_config(directory: Path, certs: Certs, public: int, idled: int, *, terminate: bool = True) -> Path:
    """The recipe on loopback: HAProxy on 127.0.0.1:public, idled on 127.0.0.1:idled."""
    cert, key = certs.server("haproxy")
    combined = directory / "haproxy.pem"
    combined.write_text(cert.read_text() + key.read_text())
    text = RECIPE.read_text()
    for old, new in [("/etc/haproxy/certs/idled.pem", str(combined)), ("bind :443", f"bind 127.0.0.1:{public}"),
                     ("10.0.0.5:7878", f"127.0.0.1:{idled}"), ("maxconn 250000", "maxconn 1000")]:
        assert old in text, old
        text = text.replace(old, new)
    if not terminate:  # the other recipe: TLS passes through to idled, after the PROXY header
        text = text.replace(f" ssl crt {combined} alpn idled/1", "")
    path = directory / "haproxy.cfg"
    path.write_text(text)
    return path


@contextmanager
def haproxy(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        check = subprocess.run([need_haproxy(), "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        proc = subprocess.Popen([need_haproxy(), "-db", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def wait_listening(port: int) -> None:
    with trio.fail_after(20):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.05)
                continue
            await stream.aclose()
            return


def prepare(tmp_path: Path, caplog: pytest.LogCaptureFixture, *, terminate: bool) -> tuple[Certs, int, int, Path]:
    """(certificates, HAProxy's port, idled's port, HAProxy's configuration), idled's peer log captured."""
    need_haproxy()
    caplog.set_level(logging.DEBUG, logger="idled.server.peers")
    certs = Certs(tmp_path / "certs")
    public, idled_port = free_port(), free_port()
    return certs, public, idled_port, loopback_config(tmp_path, certs, public, idled_port, terminate=terminate)


async def test_haproxy_terminates_tls_and_idled_sees_the_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    certs, public, idled_port, config = prepare(tmp_path, caplog, terminate=True)
    async with running(tmp_path, listen=True, port=idled_port, proxy_protocol=True, proxy_allow="127.0.0.1/32") as h:
        with haproxy(config, tmp_path / "haproxy.log"):
            await wait_listening(public)
            tcp = await trio.open_tcp_stream("127.0.0.1", public, local_address="127.0.0.2")
            local_port = tcp.socket.getsockname()[1]
            stream = trio.SSLStream(tcp, certs.client_context(), server_hostname="127.0.0.1")
            await stream.do_handshake()
            assert stream.selected_alpn_protocol() == "idled/1"
            client = Client(stream)
            await client.send(Login("uid", "alice", None, 30))
            assert isinstance(await client.recv(), Welcome)
            await client.send(PING)
            assert isinstance(await client.recv(), Pong)
            assert h.metric("idled_logins_total", role="user", result="ok") == 1
            assert h.server.connections["user"] == 1
            # The health checks (LOCAL headers) are not refused.
            assert h.metric("idled_frames_rejected_total", reason="bad_frame") == 0

            # Straight to idled from an address not in --proxy-allow: refused, whatever header it sends.
            direct = Client(await trio.open_tcp_stream("127.0.0.1", idled_port, local_address="127.0.0.2"))
            await direct.send_raw(encode_v2(("203.0.113.1", 1)))
            error = await direct.expect_error(ErrorCode.BAD_FRAME)
            assert "not an allowed balancer" in error.reason
    # idled logged the client's own address (127.0.0.2 and its port), not HAProxy's 127.0.0.1.
    assert f"login user 'alice' from 127.0.0.2:{local_port}" in caplog.text


async def test_haproxy_passes_tls_through_after_the_proxy_header(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    certs, public, idled_port, config = prepare(tmp_path, caplog, terminate=False)
    cert, key = certs.server("idled")
    async with running(tmp_path, listen=True, port=idled_port, proxy_protocol=True, proxy_allow="127.0.0.1/32",
                       tls_cert=str(cert), tls_key=str(key)):
        with haproxy(config, tmp_path / "haproxy.log"):
            await wait_listening(public)
            tcp = await trio.open_tcp_stream("127.0.0.1", public, local_address="127.0.0.2")
            local_port = tcp.socket.getsockname()[1]
            stream = trio.SSLStream(tcp, certs.client_context(), server_hostname="127.0.0.1")
            client = Client(stream)
            await client.send(Login("uid", "bob"))
            assert isinstance(await client.recv(), Welcome)
            assert stream.getpeercert(binary_form=True) is not None  # idled's own certificate, end to end
    assert f"login user 'bob' from 127.0.0.2:{local_port}" in caplog.text
