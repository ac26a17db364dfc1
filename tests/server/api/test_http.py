"""HTTP framing by the RFC, on a real socket: Content-Length with Transfer-Encoding, bare LF, HEAD, and the
stated limits to the byte (idled.server.api.http)."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.server.api.conftest import api_server
from tests.server.api.httpclient import HttpClient, statuses, talk

HEAD_LIMIT = 16 * 1024  # bytes of request line + headers + the empty line, as docs/api.md states it
STATS = b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
POST = b"POST /v1/presence HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def port_of(h: object) -> int:
    api = h.server.api  # type: ignore[attr-defined]
    assert api is not None
    return int(api.port)


async def test_content_length_with_transfer_encoding_is_a_400_that_closes(tmp_path: Path) -> None:
    # RFC 9112 6.1: answer and close -- a proxy in front that framed it by the other header would otherwise let
    # the bytes after it through as a request of their own (here: the GET).
    async with api_server(tmp_path) as h:
        port = port_of(h)
        for first, second in ((b"Content-Length: 4", b"Transfer-Encoding: chunked"),
                              (b"Transfer-Encoding: chunked", b"Content-Length: 4")):
            smuggle = (POST + first + b"\r\n" + second + b"\r\n\r\n"
                       b"0\r\n\r\n" + STATS)
            raw, closed = await talk(port, smuggle)
            assert statuses(raw) == [400] and closed, raw
            assert b"connection: close" in raw.lower()


async def test_bare_lf_is_a_400_that_closes(tmp_path: Path) -> None:
    async with api_server(tmp_path) as h:
        port = port_of(h)
        for head in (b"GET /v1/stats HTTP/1.1\nHost: x\n\n",  # every line
                     b"GET /v1/stats HTTP/1.1\r\nHost: x\nX-Y: z\r\n\r\n",  # one header line
                     b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\n",  # the empty line
                     b"GET /v1/stats HTTP/1.1\r\nHost: x\n\r\n",
                     b"\nGET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"):
            raw, closed = await talk(port, head + STATS)
            assert statuses(raw) == [400] and closed, (head, raw)
        # a pipelined head after a body is held to it too; a raw LF inside a JSON body is the body's business
        body = b'{\n  "uids": ["a"]\n}\n'
        post = POST + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        raw, closed = await talk(port, post + b"GET /v1/stats HTTP/1.1\nHost: x\n\n" + STATS)
        assert statuses(raw) == [200, 400] and closed, raw
        # a CRLF split across two reads is a CRLF; an LF that starts a read is checked against the byte before it
        for parts, status in (((b"GET /v1/stats HTTP/1.1\r", b"\nHost: 127.0.0.1\r\nConnection: close\r\n\r", b"\n"), 200),
                              ((b"GET /v1/stats HTTP/1.1\r\nHost: x", b"\n\r\n"), 400)):
            assert statuses(await sent_in_parts(port, parts)) == [status], parts


async def test_obs_fold_is_a_400_that_closes(tmp_path: Path) -> None:
    """The review's request: a header line beginning with SP or HTAB continues the one before in h11, so
    ``X-Pad: y`` hid ``Transfer-Encoding: chunked`` and the pipelined GET ran (200, 200). A proxy in front that
    reads the folded line as a header of its own frames the request by chunks: two parsers, two requests.
    RFC 9112 5.2 lets a server refuse it with 400; the connection closes, nothing after it runs."""
    async with api_server(tmp_path) as h:
        port = port_of(h)
        body = b'{"uids":["a"]}'
        for fold in (b"X-Pad: y\r\n Transfer-Encoding: chunked\r\n", b"X-Pad: y\r\n\tTransfer-Encoding: chunked\r\n",
                     b"Transfer-Encoding:\r\n chunked\r\n", b"X-Pad: y\r\n Content-Length: 14\r\n"):
            request = (POST + fold
                       + b"Content-Length: %d\r\n\r\n%s" % (len(body), body) + STATS)
            raw, closed = await talk(port, request)
            assert statuses(raw) == [400] and closed, (fold, raw)
            assert b"obs-fold" in raw and b"connection: close" in raw.lower(), raw


async def sent_in_parts(port: int, parts: tuple[bytes, ...]) -> bytes:
    """Send ``parts`` a moment apart (each its own read on the server), then read until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    out = b""
    async with stream:
        for part in parts:
            await stream.send_all(part)
            await trio.sleep(0.05)
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                out += chunk
    return out


async def test_head_is_get_without_the_body_on_every_route(tmp_path: Path) -> None:
    async with api_server(tmp_path) as h:
        async with await HttpClient.connect(port_of(h)) as c:
            for target in ("/v1/presence?uid=a&uid=b", "/v1/openapi.json", "/v1/presence"):  # the last: a 400
                get, head = await c.get(target), await c.head(target)
                assert head.status == get.status and head.body == b"", (target, head)
                assert head.headers["content-length"] == get.headers["content-length"] == str(len(get.body))
                assert head.headers["content-type"] == get.headers["content-type"] == "application/json"
            get, head = await c.get("/v1/stats"), await c.head("/v1/stats")
            assert get.status == head.status == 200 and head.body == b""
            assert abs(int(head.headers["content-length"]) - len(get.body)) <= 8  # its uptime's digits may differ
            head = await c.head("/v1/kick")  # a POST-only route
            assert head.status == 405 and head.headers["allow"] == "POST" and head.body == b""
            assert int(head.headers["content-length"]) > 0
            head = await c.head("/nowhere")
            assert head.status == 404 and head.body == b""
            assert (await c.get("/v1/stats")).status == 200  # the same connection, still alive
            answers = await c.pipeline([("HEAD", "/v1/stats", None), ("GET", "/v1/stats", None),
                                        ("HEAD", "/v1/presence?uid=a", None), ("POST", "/v1/presence", {"uids": ["a"]})])
            assert [a.status for a in answers] == [200] * 4 and answers[0].body == answers[2].body == b""
            assert answers[3].json()["users"][0]["uid"] == "a"
            r = await c.call("DELETE", "/v1/stats")
            assert r.status == 405 and r.headers["allow"] == "GET, HEAD"
        assert h.metric("idled_api_requests_total", route="/v1/stats", status="200") == 5  # HEADs count as asked


def padded(target: bytes, size: int) -> bytes:
    """A GET of ``target`` whose head (request line to the empty line) is ``size`` bytes, then closed."""
    head = b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: "
    return head + b"a" * (size - len(head) - 4) + b"\r\n\r\n"


async def test_the_head_limit_to_the_byte(tmp_path: Path) -> None:
    async with api_server(tmp_path) as h:
        port = port_of(h)
        for size, status in ((HEAD_LIMIT, 200), (HEAD_LIMIT + 1, 431), (HEAD_LIMIT + 60_000, 431)):
            request = padded(b"/v1/stats", size)
            assert len(request) == size
            raw, closed = await talk(port, request)
            assert statuses(raw) == [status] and closed, (size, raw[:200])
        request = padded(b"/v1/stats", HEAD_LIMIT + 1)  # the same, however it arrives
        out = await sent_in_parts(port, (request[:1000], request[1000:HEAD_LIMIT], request[HEAD_LIMIT:]))
        assert statuses(out) == [431] and b'"headers_too_large"' in out
        # a GET's uids ride in its head: bounded by it (large batches go by POST)
        query = b"/v1/presence?" + b"&".join(b"uid=u%d" % i for i in range(2000))
        head = b"GET " + query + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        assert len(head) > HEAD_LIMIT
        raw, _ = await talk(port, head)
        assert statuses(raw) == [431]
        fits = query[:query.rindex(b"&", 0, HEAD_LIMIT - 200)]
        raw, _ = await talk(port, b"GET " + fits + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert statuses(raw) == [200]
        async with await HttpClient.connect(port) as c:
            r = await c.post("/v1/presence", {"uids": [f"u{i}" for i in range(10_000)]})
            assert r.status == 200 and len(r.json()["users"]) == 10_000


async def test_the_body_limit_to_the_byte(tmp_path: Path) -> None:
    async with api_server(tmp_path, api_max_body=4096) as h:
        port = port_of(h)
        document = b'{"uids": ["a"]}'
        for size, status in ((4096, 200), (4097, 413)):
            body = document + b" " * (size - len(document))  # JSON allows the trailing blanks
            raw, closed = await talk(port, POST + b"Connection: close\r\n"
                                           b"Content-Length: %d\r\n\r\n%s" % (size, body))
            assert statuses(raw) == [status] and closed, (size, raw)
        # too large is known from the head: refused before the body, even one waiting for 100-continue
        raw, closed = await talk(port, POST + b"Expect: 100-continue\r\n"
                                       b"Content-Length: 4097\r\n\r\n")
        assert statuses(raw) == [413] and closed
        # a body without a Content-Length (chunked) is 411: the limit is then known before it is read
        raw, closed = await talk(port, POST + b"Transfer-Encoding: chunked\r\n\r\n"
                                       b"f\r\n" + document + b"\r\n0\r\n\r\n" + STATS)
        assert statuses(raw) == [411] and closed and b'"length_required"' in raw
