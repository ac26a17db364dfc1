"""Browsers refused by the HTTP API: cross-site requests (CSRF), DNS rebinding, and a form's or a text body.

Against a real `Server` (tests.peers.running) on a real loopback socket, requests sent raw, as a web page
makes a browser send them. The attacker's request (the review's): with auth off, a page on any site may POST
``text/plain`` to ``http://127.0.0.1:PORT/v1/kick`` with no CORS preflight; through DNS rebinding its own
name (``evil.example``) resolves to 127.0.0.1 and the request carries ``Host: evil.example:PORT``. Each
defence is checked alone (the others satisfied): the media type (415), the ``Origin`` and ``Sec-Fetch-Site``
headers (403), the ``Host`` with auth off (421); and what must still pass does (a backend's request, with or
without a same-origin ``Origin``; ``localhost`` and IP literals; any ``Host`` with auth on).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema

from idled.protocol.tokens import mint
from idled.server.api.openapi import schema_of
from tests.peers import Harness
from tests.server.api.conftest import api_server
from tests.server.api.httpclient import talk

SECRET = b"s" * 32
KICK = b'{"uid":"alice"}'
JSON = "application/json"


def post(path: str, body: bytes, *headers: str) -> bytes:
    """A raw POST with ``headers`` (``Name: value`` each); no Content-Type unless one is among them."""
    head = "".join(f"{header}\r\n" for header in headers)
    return f"POST {path} HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def status_of(raw: bytes) -> int:
    assert raw.startswith(b"HTTP/1.1 "), raw
    return int(raw[9:12])


def error_code(raw: bytes, route: str = "/v1/kick", method: str = "POST") -> str:
    """The error's code, its document checked against the OpenAPI document's schema for the route and status."""
    document = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    jsonschema.validate(document, schema_of(route, method, status_of(raw)), cls=jsonschema.Draft202012Validator)
    return str(document["error"]["code"])


async def alice_online(h: Harness, port: int) -> bool:
    raw, _ = await talk(port, b"GET /v1/presence?uid=alice HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert status_of(raw) == 200, raw
    return bool(json.loads(raw.split(b"\r\n\r\n", 1)[1])["users"][0]["online"])


def port_of(h: Harness) -> int:
    assert h.server.api is not None
    return h.server.api.port


async def test_a_web_page_cannot_kick_with_a_simple_request(tmp_path: Path) -> None:
    """The review's request, byte for byte as Chromium sends a ``fetch(..., {mode: "no-cors"})`` from a
    rebound name: refused, and alice stays online (before: ``200 {"ended":1}``)."""
    async with api_server(tmp_path) as h:
        port = port_of(h)
        alice = await h.user("alice", keepalive=30)
        attack = post("/v1/kick", KICK, f"Host: evil.example:{port}", "Origin: https://evil.example",
                      "Content-Type: text/plain;charset=UTF-8", "Sec-Fetch-Site: cross-site", "Sec-Fetch-Mode: no-cors")
        raw, _ = await talk(port, attack)
        assert status_of(raw) == 421, raw  # (the Host, checked first; each defence alone: below)
        assert await alice_online(h, port)
        await alice.stream.aclose()


async def test_a_post_needs_a_json_media_type(tmp_path: Path) -> None:
    """What a form or a ``fetch`` without a preflight can send (text/plain, a form, multipart, or nothing) is
    ``415 unsupported_media_type``; ``application/json`` with parameters or in capitals is fine."""
    async with api_server(tmp_path) as h:
        port = port_of(h)
        alice = await h.user("alice", keepalive=30)
        for content_type in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", "application/jsonp", "application/json-seq",
                             "text/json", ""):
            headers = ("Host: 127.0.0.1",) + ((f"Content-Type: {content_type}",) if content_type else ())
            raw, closed = await talk(port, post("/v1/kick", KICK, *headers))
            assert status_of(raw) == 415 and error_code(raw) == "unsupported_media_type", (content_type, raw)
            assert closed and b"connection: close" in raw.lower()  # a refused body is not read: the connection ends
        two = post("/v1/presence", b'{"uids":["a"]}', "Host: 127.0.0.1", f"Content-Type: {JSON}",
                   "Content-Type: text/plain")
        assert status_of((await talk(port, two))[0]) == 415
        assert await alice_online(h, port)
        for content_type in (JSON, "application/json; charset=utf-8", "Application/JSON ;charset=UTF-8"):
            raw, _ = await talk(port, post("/v1/presence", b'{"uids":["a"]}', "Host: 127.0.0.1",
                                           f"Content-Type: {content_type}", "Connection: close"))
            assert status_of(raw) == 200, (content_type, raw)
        raw, _ = await talk(port, post("/v1/kick", KICK, "Host: 127.0.0.1", f"Content-Type: {JSON}"))
        assert status_of(raw) == 200 and b'{"ended":1}' in raw, raw  # the backend's kick still works
        assert not await alice_online(h, port)
        await alice.stream.aclose()


async def test_a_cross_site_origin_or_fetch_metadata_is_refused(tmp_path: Path) -> None:
    """The API is for backends: a request a browser marks as coming from another site is ``403 forbidden``,
    whatever its method -- a GET's answer is not readable cross-origin anyway, but nothing here is for a
    page. A same-origin ``Origin`` and ``Sec-Fetch-Site: same-origin`` or ``none`` pass."""
    async with api_server(tmp_path) as h:
        port = port_of(h)
        alice = await h.user("alice", keepalive=30)
        host = f"Host: 127.0.0.1:{port}"
        refused = ("Origin: https://evil.example", "Origin: null", f"Origin: http://127.0.0.1:{port + 1}",
                   f"Origin: http://localhost:{port}", f"Origin: http://127.0.0.1:{port}/path",
                   "Sec-Fetch-Site: cross-site", "Sec-Fetch-Site: same-site")
        for header in refused:
            raw, _ = await talk(port, post("/v1/kick", KICK, host, f"Content-Type: {JSON}", header))
            assert status_of(raw) == 403 and error_code(raw) == "forbidden", (header, raw)
            get = f"GET /v1/stats HTTP/1.1\r\n{host}\r\n{header}\r\nConnection: close\r\n\r\n".encode()
            raw, _ = await talk(port, get)
            assert status_of(raw) == 403 and error_code(raw, "/v1/stats", "GET") == "forbidden", header
        assert await alice_online(h, port)
        for header in (f"Origin: http://127.0.0.1:{port}", f"Origin: HTTP://127.0.0.1:{port}",
                       "Sec-Fetch-Site: same-origin", "Sec-Fetch-Site: none"):
            get = f"GET /v1/stats HTTP/1.1\r\n{host}\r\n{header}\r\nConnection: close\r\n\r\n".encode()
            assert status_of((await talk(port, get))[0]) == 200, header
        await alice.stream.aclose()


async def test_with_auth_off_the_host_must_name_this_machine(tmp_path: Path) -> None:
    """DNS rebinding: a page's own name resolved to 127.0.0.1 reaches the API with that name in ``Host``.
    With auth off the Host must be an IP literal or ``localhost`` (any port): else ``421 misdirected_request``."""
    async with api_server(tmp_path) as h:
        port = port_of(h)
        alice = await h.user("alice", keepalive=30)
        for host in (f"evil.example:{port}", "evil.example", "127.0.0.1.nip.io", "localhost.evil.example",
                     f"[::1].evil.example:{port}", "127.0.0.1:80:80", "[::1", "", "xn--localhost"):
            get = f"GET /v1/stats HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            raw, _ = await talk(port, get)
            assert status_of(raw) == 421 and error_code(raw, "/v1/stats", "GET") == "misdirected_request", (host, raw)
            raw, _ = await talk(port, post("/v1/kick", KICK, f"Host: {host}", f"Content-Type: {JSON}"))
            assert status_of(raw) == 421, (host, raw)
        two = b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        assert status_of((await talk(port, two))[0]) == 400  # RFC 9112 3.2: more than one Host
        assert await alice_online(h, port)
        for host in (f"127.0.0.1:{port}", "127.0.0.1", "localhost", f"LocalHost:{port}", f"[::1]:{port}", "[::1]",
                     "10.1.2.3:8080", "[2001:db8::1]"):
            get = f"GET /v1/stats HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            assert status_of((await talk(port, get))[0]) == 200, host
        http10 = b"GET /v1/stats HTTP/1.0\r\n\r\n"  # no Host at all (HTTP/1.0): names nothing, so no rebinding
        assert status_of((await talk(port, http10))[0]) == 200
        await alice.stream.aclose()


async def test_with_auth_on_tokens_guard_and_any_host_passes(tmp_path: Path) -> None:
    """With a secret the operators reach the API by DNS name: the Host is not checked (a page cannot show a
    token: a browser sends none on its own). The Origin and the media type still are."""
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    async with api_server(tmp_path, secret_file=str(secret_file)) as h:
        port = port_of(h)
        auth = "Authorization: Bearer " + mint(SECRET, "api", "ops", time.time() + 60)
        get = f"GET /v1/stats HTTP/1.1\r\nHost: idled.example.com:{port}\r\n{auth}\r\nConnection: close\r\n\r\n"
        assert status_of((await talk(port, get.encode()))[0]) == 200
        raw, _ = await talk(port, post("/v1/presence", b'{"uids":["a"]}', "Host: idled.example.com", auth,
                                       f"Content-Type: {JSON}", "Origin: https://evil.example"))
        assert status_of(raw) == 403, raw
        raw, _ = await talk(port, post("/v1/presence", b'{"uids":["a"]}', "Host: idled.example.com", auth,
                                       "Content-Type: text/plain"))
        assert status_of(raw) == 415, raw
        raw, _ = await talk(port, post("/v1/kick", KICK, "Host: idled.example.com", "Content-Type: text/plain"))
        assert status_of(raw) == 401, raw  # without a token: the token's refusal first
