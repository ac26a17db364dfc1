"""Limits (413, 429, 431, 408, max clients), a handler's bug, and auth."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from idled.protocol import Error, Login, Welcome
from idled.protocol.tokens import mint
from idled.server.api import routes
from tests.server.api.conftest import api_server
from tests.server.api.httpclient import HttpClient, raw_exchange, statuses, talk

SECRET = b"s" * 32


async def test_body_too_large_and_head_too_large(tmp_path: Path) -> None:
    async with api_server(tmp_path, api_max_body=4096) as h:
        assert h.server.api is not None
        port = h.server.api.port
        async with await HttpClient.connect(port) as c:
            r = await c.post("/v1/presence", {"uids": ["x" * 200] * 40})
            assert r.status == 413 and r.json()["error"]["code"] == "too_large" and r.headers["connection"] == "close"
        chunked = b"POST /v1/presence HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1000\r\n" + b"x" * 4096 + b"\r\n" + b"1000\r\n" + b"x" * 4096 + b"\r\n0\r\n\r\n"
        assert (await raw_exchange(port, chunked)).startswith(b"HTTP/1.1 411")  # a length first: then 413 unread
        huge = b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
        assert (await raw_exchange(port, huge)).startswith(b"HTTP/1.1 431")
        assert (await raw_exchange(port, b"NOT HTTP AT ALL\r\n\r\n")).startswith(b"HTTP/1.1 400")
        async with await HttpClient.connect(port) as c:  # nothing above affected anyone else
            assert (await c.get("/v1/stats")).status == 200


async def test_rate_limit(tmp_path: Path) -> None:
    async with api_server(tmp_path, api_rate=1.0, api_burst=3) as h:
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as c:
            statuses = [(await c.get("/v1/stats")).status for _ in range(4)]
            assert statuses == [200, 200, 200, 429]
            r = await c.get("/v1/stats")
            assert r.status == 429 and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "rate_limited"


async def test_slowloris_gets_408_and_an_idle_connection_is_closed(tmp_path: Path) -> None:
    async with api_server(tmp_path, api_request_timeout=0.3) as h:
        assert h.server.api is not None
        port = h.server.api.port
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        started = time.monotonic()
        out = b""
        async with stream:
            for byte in b"GET /v1/stats HTTP/1.1\r\n":  # one byte every 50 ms: never done in time
                try:
                    await stream.send_all(bytes([byte]))
                except trio.BrokenResourceError:
                    break
                await trio.sleep(0.05)
            with trio.move_on_after(2):
                while chunk := await stream.receive_some(65536):
                    out += chunk
        assert out.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 2
        assert await raw_exchange(port, b"", read_timeout=2) == b""  # silent: closed quietly after the timeout


async def test_clients_beyond_the_limit_get_503(tmp_path: Path) -> None:
    async with api_server(tmp_path, api_max_clients=2) as h:
        assert h.server.api is not None
        port = h.server.api.port
        first, second = await HttpClient.connect(port), await HttpClient.connect(port)
        assert (await first.get("/v1/stats")).status == 200 and (await second.get("/v1/stats")).status == 200
        async with await HttpClient.connect(port) as third:
            r = await third.get("/v1/stats")
            assert r.status == 503 and r.json()["error"]["code"] == "unavailable"
        await first.aclose()
        await trio.sleep(0.1)
        async with await HttpClient.connect(port) as fourth:
            assert (await fourth.get("/v1/stats")).status == 200
        await second.aclose()


async def test_a_handler_bug_is_a_500_and_the_daemon_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> object:
        raise RuntimeError("bug")

    monkeypatch.setattr(routes, "stats", broken)
    async with api_server(tmp_path) as h:
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as c:
            r = await c.get("/v1/stats")
            assert r.status == 500 and r.json()["error"]["code"] == "internal"
            assert (await c.get("/v1/presence?uid=a")).status == 200


async def test_bearer_tokens(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    async with api_server(tmp_path, secret_file=str(secret_file)) as h:
        assert h.server.api is not None
        good = mint(SECRET, "api", "ops", time.time() + 60)
        cases = {
            None: 401,
            "Basic abc": 401,
            "Bearer " + good: 200,
            "bearer " + good: 200,
            "Bearer " + good[:-2] + ("AA" if not good.endswith("AA") else "BB"): 401,  # forged
            "Bearer " + mint(b"t" * 32, "api", "ops", time.time() + 60): 401,  # another secret
            "Bearer " + mint(SECRET, "api", "ops", time.time() - 1): 401,  # expired
            "Bearer " + mint(SECRET, "uid", "alice", time.time() + 60): 401,  # a login token
            "Bearer " + mint(SECRET, "observer", "obs", time.time() + 60): 401,
        }
        for header, status in cases.items():
            async with await HttpClient.connect(h.server.api.port) as c:  # a 401 closes its connection
                r = await c.get("/v1/stats", headers=() if header is None else (("Authorization", header),))
                assert r.status == status, (header, r)
                if status == 401:
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    assert r.json()["error"]["code"] == "unauthorized" and r.headers["connection"] == "close"
        # ... and an api token never logs in over the binary protocol
        peer = await h.connect()
        await peer.send(Login("uid", "ops", good))
        assert (await peer.expect(Error)).code == "auth_failed"
        peer = await h.connect()
        await peer.send(Login("observer", "ops", good))
        assert (await peer.expect(Error)).code == "auth_failed"
        peer = await h.connect()
        await peer.send(Login("uid", "alice", mint(SECRET, "uid", "alice", time.time() + 60)))
        await peer.expect(Welcome)


async def test_no_secret_refuses_a_public_address(tmp_path: Path) -> None:
    from idled.ops.fatal import Fatal
    from tests.peers import free_port, running

    with pytest.raises(BaseException) as info:  # noqa: B017  (the Fatal arrives inside an ExceptionGroup)
        async with running(tmp_path, api_host="0.0.0.0", api_port=free_port()):
            pass
    assert info.group_contains(Fatal) if isinstance(info.value, BaseExceptionGroup) else isinstance(info.value, Fatal)


async def test_no_token_is_a_401_before_a_byte_of_the_body(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    async with api_server(tmp_path, secret_file=str(secret_file)) as h:
        assert h.server.api is not None
        port = h.server.api.port
        for headers in (b"", b"Authorization: Bearer forged\r\n", b"Expect: 100-continue\r\n"):
            # a body as large as allowed (1 MiB), announced and then not sent: the answer must not wait for it
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            out = b""
            async with stream:
                await stream.send_all(b"POST /v1/presence HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1048576\r\n"
                                      + headers + b"\r\n" + b"x" * 1000)
                with trio.fail_after(3):  # the request timeout (10 s) is far
                    try:
                        while chunk := await stream.receive_some(65536):
                            out += chunk
                    except trio.BrokenResourceError:
                        pass
            assert out.startswith(b"HTTP/1.1 401 "), (headers, out)  # not "100 Continue" first, either
            assert b"connection: close" in out.lower() and b'"unauthorized"' in out
        good = mint(SECRET, "api", "ops", time.time() + 60)
        async with await HttpClient.connect(port) as c:  # with a good token the body is read and answered
            r = await c.post("/v1/presence", {"uids": ["a"] * 1000}, headers=(("Authorization", "Bearer " + good),))
            assert r.status == 200 and len(r.json()["users"]) == 1000


async def test_a_good_token_gives_its_source_share_back(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    auth = (("Authorization", "Bearer " + mint(SECRET, "api", "ops", time.time() + 60)),)
    for settings in ({"secret_file": str(secret_file)}, {}):  # auth on; auth off (loopback): after one request
        async with api_server(tmp_path, **settings) as h:
            api = h.server.api
            assert api is not None
            async with await HttpClient.connect(api.port) as c:
                with trio.fail_after(5):
                    while api.gate.waiting != 1:  # accepted, through the gate, not authenticated yet
                        await trio.sleep(0.01)
                assert (await c.get("/v1/stats", headers=auth)).status == 200
                assert api.gate.waiting == 0 and api.gate.pending == {}
                if settings:
                    async with await HttpClient.connect(api.port) as other:
                        assert (await other.get("/v1/stats")).status == 401
                        with trio.fail_after(3):
                            assert await other.stream.receive_some(100) == b""  # a 401 ends the connection
                assert (await c.get("/v1/stats")).status == (401 if settings else 200)


async def test_two_authorization_headers_are_refused_whichever_comes_first(tmp_path: Path) -> None:
    """Before: the first was used (a good one first: 200), while the metrics port refused both. A proxy in front
    may add its own or keep the last: which one counts must not be a guess."""
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    async with api_server(tmp_path, secret_file=str(secret_file)) as h:
        assert h.server.api is not None
        good = "Authorization: Bearer " + mint(SECRET, "api", "ops", time.time() + 60)
        for first, second in ((good, "Authorization: Bearer nope"), ("Authorization: Bearer nope", good), (good, good)):
            head = f"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n{first}\r\n{second}\r\n\r\n".encode()
            raw, closed = await talk(h.server.api.port, head)
            assert raw.startswith(b"HTTP/1.1 401 ") and closed, (first, second, raw)
            assert b"more than one Authorization header" in raw and b"www-authenticate: bearer" in raw.lower()
        raw, _ = await talk(h.server.api.port, f"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n{good}\r\n"
                                               "Connection: close\r\n\r\n".encode())
        assert raw.startswith(b"HTTP/1.1 200 "), raw


async def test_with_auth_on_a_request_without_a_good_token_ends_its_connection(tmp_path: Path) -> None:
    """Before: only a 401 closed; a 404, 405 or 429 kept an unauthenticated connection alive for as long as it
    sent cheap requests (holding a slot of api_max_clients and its address's share). Now any answer to a
    request that showed no good token closes; a token holder keeps its keep-alive through the same answers."""
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    async with api_server(tmp_path, secret_file=str(secret_file), api_rate=1.0, api_burst=2) as h:
        api = h.server.api
        assert api is not None
        good = "Authorization: Bearer " + mint(SECRET, "api", "ops", time.time() + 60)
        cheap = ("GET /nope", "DELETE /v1/stats", "POST /v1/stats")
        for request in cheap:
            for token in ("", "Authorization: Bearer forged\r\n"):
                head = f"{request} HTTP/1.1\r\nHost: 127.0.0.1\r\n{token}\r\n".encode()
                raw, closed = await talk(api.port, head + head, source="127.0.0.2")
                assert statuses(raw) in ([404], [405]) and closed, (request, token, raw)
                assert b"connection: close" in raw.lower()
        with trio.fail_after(5):
            while api.gate.waiting:  # the connections above are gone from the gate
                await trio.sleep(0.01)
        async with await HttpClient.connect(api.port, source="127.0.0.3") as c:  # with the token: kept alive
            auth = (("Authorization", good[len("Authorization: "):]),)
            assert [(await c.get(target, headers=auth)).status for target in ("/nope", "/v1/stats")] == [404, 200]
            assert (await c.call("DELETE", "/v1/stats", headers=auth)).status == 405
            assert (await c.get("/v1/stats", headers=auth)).status == 200
            r = await c.get("/v1/stats", headers=auth)
            assert r.status == 429 and "connection" not in r.headers  # the bucket (2) is empty: still kept
            assert (await c.get("/v1/stats", headers=auth)).status == 429
        # rate limited without a token: closes too
        raw, closed = await talk(api.port, b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 2, source="127.0.0.3")
        assert statuses(raw) == [429] and closed, raw
