"""The API's listener with the door's gate in front: one address's unauthenticated connections take only its
share; authenticated ones do not count against it; at api_max_clients a newcomer takes the slot of the oldest
connection that never authenticated, and only when every one has is it answered 503."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from idled.protocol.tokens import mint
from tests.server.api.conftest import api_server
from tests.server.api.httpclient import HttpClient, statuses, talk

SECRET = b"s" * 32


async def test_slow_connections_from_one_address_leave_the_others_served(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    auth = (("Authorization", "Bearer " + mint(SECRET, "api", "ops", time.time() + 60)),)
    async with api_server(tmp_path, secret_file=str(secret_file), max_pending_per_address=100,
                          api_max_clients=256, api_request_timeout=4.0) as h:
        api = h.server.api
        assert api is not None
        port = api.port
        started = trio.current_time()
        slow = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(300)]  # silent, or a slow head
        for stream in slow[::2]:
            await stream.send_all(b"GET /v1/sta")
        with trio.fail_after(5):
            while api.gate.refused["per_address"] < 200:  # the first 100 are held, the rest refused unread
                await trio.sleep(0.01)
        assert api.gate.waiting == 100

        async def one(results: list[int]) -> None:
            async with await HttpClient.connect(port, source="127.0.0.2") as c:
                results.append((await c.get("/v1/stats", headers=auth)).status)

        results: list[int] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(15):
                    nursery.start_soon(one, results)
        assert results == [200] * 15
        # a client's own authenticated keep-alive connections do not use up its share: 120 held from one address
        held = []
        try:
            for _ in range(120):
                c = await HttpClient.connect(port, source="127.0.0.3")
                held.append(c)
                assert (await c.get("/v1/stats", headers=auth)).status == 200
            assert api.open == 100 + 120 and api.gate.waiting == 100
            # At api_max_clients (256) a newcomer takes the slot of the oldest connection that never showed a
            # token (idled.door.gate: three addresses within their shares cannot fill every slot)...
            more = [await HttpClient.connect(port, source="127.0.0.4") for _ in range(36)]
            for c in more:
                assert (await c.get("/v1/stats", headers=auth)).status == 200
            # (once they have waited half the request deadline: a request within it is never cut short)
            await trio.sleep(max(0.0, started + 2.1 - trio.current_time()))
            evicting = [await HttpClient.connect(port, source="127.0.0.5") for _ in range(10)]
            for c in evicting:
                assert (await c.get("/v1/stats", headers=auth)).status == 200
            assert api.gate.refused["evicted"] == 10 and api.gate.waiting == 90
            # ... and only once every connection has shown a token is it answered 503, before any body
            for stream in slow:
                await stream.aclose()
            with trio.fail_after(5):
                while api.gate.waiting:
                    await trio.sleep(0.01)
            more += [await HttpClient.connect(port, source="127.0.0.6") for _ in range(90)]
            for c in more[36:]:
                assert (await c.get("/v1/stats", headers=auth)).status == 200
            raw, closed = await talk(port, b"POST /v1/kick HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
                                     source="127.0.0.4")
            assert statuses(raw) == [503] and closed
            for c in more + evicting:
                await c.aclose()
        finally:
            for c in held:
                await c.aclose()
            for stream in slow:
                await stream.aclose()
