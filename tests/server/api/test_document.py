"""The API says what it does as its document does, on a real loopback socket: the requests Schemathesis found
refused although the document allows them, errors in the client's terms (never h11's or the protocol's
internal names), reason phrases on status lines, one rule for unknown query parameters on every route, and a
served document whose ``security`` is what this daemon requires."""

from __future__ import annotations

import time
from pathlib import Path

import h11
import jsonschema
import pytest
import trio

from idled.protocol.tokens import mint
from idled.server.api.http import protocol_error
from idled.server.api.openapi import OPENAPI
from tests.server.api.conftest import api_server
from tests.server.api.httpclient import HttpClient, raw_exchange

SECRET = b"d" * 32
LEAKS = ("bytearray", "bad_message", "Receive buffer", "float", "h11", "ProtocolError")


def _param_schema() -> dict[str, object]:
    parameter = OPENAPI["paths"]["/v1/presence"]["get"]["parameters"][0]
    return {**parameter["schema"], "components": OPENAPI["components"]}


async def test_empty_query_uids_are_refused_by_the_server_and_the_document(tmp_path: Path) -> None:
    # a uid is 1..256 UTF-8 bytes (the protocol's rule): the document says so too (minLength), so the two agree
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(["", ""], _param_schema(), cls=jsonschema.Draft202012Validator)
    jsonschema.validate(["a", "42"], _param_schema(), cls=jsonschema.Draft202012Validator)
    async with api_server(tmp_path) as h:
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as c:
            answer = await c.get("/v1/presence?uid=&uid=")
            assert answer.status == 400
            assert answer.json()["error"]["message"] == "uid parameter 1 must be 1 to 256 UTF-8 bytes long, got 0"


async def test_an_integral_number_is_that_integer_uid(tmp_path: Path) -> None:
    # JSON Schema counts 8605.0 as an integer; so does the API: the same uid as 8605
    async with api_server(tmp_path) as h:
        await h.user(8605)
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as c:
            answer = await c.post("/v1/presence", b'{"uids": [8605.0, 8.605e3, 8605, "8605"]}')
            assert answer.status == 200, answer
            assert [(u["uid"], u["online"]) for u in answer.json()["users"]] == [
                (8605, True), (8605, True), (8605, True), ("8605", False)]
            answer = await c.post("/v1/kick", b'{"uid": 8605.0}')
            assert (answer.status, answer.json()) == (200, {"ended": 1})
            answer = await c.post("/v1/presence", b'{"uids": [8605.5]}')
            assert answer.status == 400
            assert answer.json()["error"]["message"] == ("uids[0] must be a string or an integer 0 to "
                                                         "9223372036854775807 (2**63-1), got the number 8605.5")


async def test_a_reason_with_control_characters_is_refused_for_that(tmp_path: Path) -> None:
    async with api_server(tmp_path) as h:
        await h.user("alice")
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as c:
            answer = await c.post("/v1/kick", {"uid": "alice", "reason": "spam\x1b[2J"})
            assert answer.status == 400
            message = answer.json()["error"]["message"]
            assert "control characters" in message and "U+001B" in message and "256" not in message, message
            answer = await c.post("/v1/kick", {"uid": "alice", "reason": "é" * 129})  # 258 bytes
            assert answer.json()["error"]["message"] == "reason must be 0 to 256 UTF-8 bytes long, got 258"
            answer = await c.post("/v1/kick", {"uid": "alice", "reason": "spam 🚫 ok"})
            assert (answer.status, answer.json()) == (200, {"ended": 1})


async def test_errors_are_in_the_clients_terms(tmp_path: Path) -> None:
    async with api_server(tmp_path) as h:
        assert h.server.api is not None
        port = h.server.api.port
        async with await HttpClient.connect(port) as c:
            answer = await c.post("/v1/presence", {"uids": ["a", ""]})
            assert answer.json()["error"]["message"] == "uids[1] must be 1 to 256 UTF-8 bytes long, got 0"
            answer = await c.post("/v1/presence", {"uids": ["a", 1.5, True]})
            assert "uids[1]" in answer.json()["error"]["message"]
            answer = await c.post("/v1/kick", {"uid": None})
            assert answer.json()["error"]["message"] == "uid must be a string or an integer, got null"
        wire = {
            b"GET /x HTTP/1.1 extra\r\nHost: 127.0.0.1\r\n\r\n": "malformed request line",
            b"GET /v1/st\xc3\xa4ts HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n": "malformed request line",
            b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header: x\r\n\r\n": "malformed header line",
            b"POST /v1/kick HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n": "Content-Length must be",
            b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n\r\n": "more than one Host header",
            b"GET /v1/stats HTTP/1.1\r\n\r\n": "needs a Host header",
        }
        for data, expected in wire.items():
            raw = await raw_exchange(port, data)
            assert raw.startswith(b"HTTP/1.1 400 Bad Request\r\n"), raw
            body = raw.partition(b"\r\n\r\n")[2].decode()
            assert expected in body and not any(leak in body for leak in LEAKS), (data, body)


async def test_status_lines_carry_reason_phrases(tmp_path: Path) -> None:
    async with api_server(tmp_path) as h:
        assert h.server.api is not None
        port = h.server.api.port
        for target, line in {b"GET /v1/stats": b"200 OK", b"GET /nowhere": b"404 Not Found",
                             b"DELETE /v1/stats": b"405 Method Not Allowed"}.items():
            raw = await raw_exchange(port, target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert raw.startswith(b"HTTP/1.1 " + line + b"\r\n"), raw
        raw = await raw_exchange(port, b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 17000 + b"\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), raw
        body = b'{"uids": ["a"]}'
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"POST /v1/presence HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                  b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
            assert (await stream.receive_some(100)).startswith(b"HTTP/1.1 100 Continue\r\n")


@pytest.mark.parametrize("method, target", [
    ("GET", "/v1/stats?x=1"), ("HEAD", "/v1/stats?x=1"), ("GET", "/v1/openapi.json?x=1"),
    ("GET", "/v1/presence?uid=a&x=1"), ("POST", "/v1/presence?x=1"), ("POST", "/v1/kick?x=1")])
async def test_an_unknown_query_parameter_is_400_naming_it_on_every_route(tmp_path: Path, method: str,
                                                                           target: str) -> None:
    async with api_server(tmp_path) as h:
        await h.user("a")
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as c:
            body = {"uids": ["a"]} if target.startswith("/v1/presence") else {"uid": "a"}
            answer = await c.call(method, target, body if method == "POST" else None)
            assert answer.status == 400, answer
            if method != "HEAD":
                assert answer.json()["error"]["message"].startswith("unknown query parameter 'x': "), answer
            assert (await c.get("/v1/presence?uid=a")).json()["users"][0]["online"]  # nothing was kicked


async def test_the_served_document_says_what_this_daemon_requires(tmp_path: Path) -> None:
    async with api_server(tmp_path / "off") as h:
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as c:
            assert (await c.get("/v1/openapi.json")).json()["security"] == []
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    auth = (("Authorization", "Bearer " + mint(SECRET, "api", "ops", time.time() + 60)),)
    async with api_server(tmp_path / "on", secret_file=str(secret_file)) as h:
        assert h.server.api is not None
        async with await HttpClient.connect(h.server.api.port) as c:
            assert (await c.get("/v1/openapi.json", headers=auth)).json()["security"] == [{"bearer": []}]


@pytest.mark.parametrize("said, status, expected", [
    ("Receive buffer too long", 431, "the request head is larger than 16384 bytes"),
    ("peer unexpectedly closed connection", 400, "the connection closed in the middle of a request"),
    ("illegal request line: bytearray(b'GET / HTTP/1.1 x')", 400, "malformed request line: expected METHOD TARGET "
     "HTTP/1.1, the target in ASCII"),
    ("something h11 says one day: bytearray(b'x')", 400, "malformed HTTP/1.1 request"),
])
def test_h11s_refusals_in_the_clients_terms(said: str, status: int, expected: str) -> None:
    error = protocol_error(h11.RemoteProtocolError(said, error_status_hint=status))
    assert (error.status, error.message) == (status, expected)
