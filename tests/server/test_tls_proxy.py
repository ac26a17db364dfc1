"""The PROXY protocol on the client port (real loopback sockets, an in-process server)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from idled.protocol import ErrorCode, Login, Welcome
from idled.protocol.proxy import encode_v1, encode_v2
from tests.peers import Client, running


async def connect(port: int, source: str = "127.0.0.1") -> Client:
    return Client(await trio.open_tcp_stream("127.0.0.1", port, local_address=source), recv_timeout=10.0)


async def test_v2_header_gives_the_client_address(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="idled.server.peers")
    async with running(tmp_path, listen=True, proxy_protocol=True, proxy_allow="127.0.0.1/32") as h:
        client = await connect(h.port)
        await client.send_raw(encode_v2(("203.0.113.9", 4444), ("192.0.2.1", 7878)))
        await client.send(Login("uid", "alice"))
        assert isinstance(await client.recv(), Welcome)
        # LOCAL (a balancer's health check): the socket's own address stays.
        check = await connect(h.port)
        await check.send_raw(encode_v2(None))
        await check.send(Login("uid", "bob"))
        assert isinstance(await check.recv(), Welcome)
    assert "login user 'alice' from 203.0.113.9:4444" in caplog.text
    assert "login user 'bob' from 127.0.0.1:" in caplog.text


async def test_v1_header_in_the_same_segment_as_the_login(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from idled.protocol import encode

    caplog.set_level(logging.DEBUG, logger="idled.server.peers")
    async with running(tmp_path, listen=True, proxy_protocol=True) as h:
        client = await connect(h.port)
        # One send: the header's read may take bytes of the login with it; they must reach the decoder.
        await client.send_raw(encode_v1(("2001:db8::5", 5555), ("::1", 7878)) + encode(Login("uid", "carol")))
        assert isinstance(await client.recv(), Welcome)
    assert "login user 'carol' from [2001:db8::5]:5555" in caplog.text


async def test_missing_header_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, proxy_protocol=True) as h:
        client = await connect(h.port)
        await client.send(Login("uid", "alice"))
        error = await client.expect_error(ErrorCode.BAD_FRAME)
        assert "PROXY protocol: expected a PROXY header" in error.reason
        assert h.metric("idled_frames_rejected_total", reason="bad_frame") == 1


async def test_header_from_an_address_not_allowed_is_refused(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, proxy_protocol=True, proxy_allow="127.0.0.1/32") as h:
        client = await connect(h.port, source="127.0.0.2")
        await client.send_raw(encode_v2(("203.0.113.9", 4444)))
        await client.send(Login("uid", "mallory"))
        error = await client.expect_error(ErrorCode.BAD_FRAME)
        assert "127.0.0.2" in error.reason and "not an allowed balancer" in error.reason


async def test_header_where_none_is_expected_is_a_bad_frame(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True) as h:
        client = await connect(h.port)
        await client.send_raw(encode_v1(("203.0.113.9", 4444), ("192.0.2.1", 7878)))
        await client.expect_error(ErrorCode.TOO_LARGE)  # "PROX" read as a length prefix: way over max_frame
        client = await connect(h.port)
        await client.send_raw(encode_v2(("203.0.113.9", 4444)))
        await client.expect_error(ErrorCode.TOO_LARGE)


async def test_slow_header_counts_against_the_login_timeout(tmp_path: Path) -> None:
    async with running(tmp_path, listen=True, proxy_protocol=True, login_timeout=0.3) as h:
        client = await connect(h.port)
        await client.send_raw(b"PROXY TCP4 ")
        await client.expect_error(ErrorCode.LOGIN_TIMEOUT)
