"""The etcd gateway client's error paths, on httpx's mock transport (no etcd): every failure is typed, a
dead endpoint moves the next call to the next one, and answers are read against a limit."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from idled.server.election import EtcdError, EtcdUnavailable
from idled.server.election.etcdclient import EtcdClient, b64


def gateway(handler: object, *, urls: tuple[str, ...] = ("http://e1:2379",), limit: int = 1 << 20) -> EtcdClient:
    return EtcdClient(urls, timeout=0.5, max_response_bytes=limit,
                       transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


async def test_answers_are_decoded() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/v3/lease/grant":
            assert body == {"TTL": "5"}
            return httpx.Response(200, json={"header": {"revision": "3"}, "ID": "77", "TTL": "5"})
        if request.url.path == "/v3/lease/keepalive":
            result = {"ID": body["ID"], "TTL": "5"} if body["ID"] == "77" else {"ID": body["ID"]}
            return httpx.Response(200, json={"result": result})
        assert request.url.path == "/v3/kv/range"
        kv = {"key": b64("/p/seq"), "value": b64("12"), "create_revision": "4", "mod_revision": "9"}
        return httpx.Response(200, json={"header": {"revision": "9"}, "kvs": [kv], "count": "1"})

    async with gateway(handler) as etcd:
        assert await etcd.grant(5) == (77, 5)
        assert await etcd.keepalive(77) == 5
        assert await etcd.keepalive(78) == 0  # etcd no longer has it
        kv, revision = await etcd.range("/p/seq")
        assert kv is not None and (kv.value, kv.create_revision, kv.lease, revision) == (b"12", 4, 0, 9)


async def test_an_error_answer_is_an_etcd_error() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        message = "etcdserver: requested lease not found"
        return httpx.Response(404, json={"error": message, "code": 5, "message": message})

    async with gateway(handler) as etcd:
        with pytest.raises(EtcdError) as caught:
            await etcd.txn([], [], [])
        assert caught.value.code == "etcd_error" and "lease not found" in caught.value.reason
        await etcd.revoke(5)  # a lease already gone is what a revoke wanted


async def test_garbage_and_oversized_answers_are_etcd_errors() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v3/kv/range":
            return httpx.Response(200, content=b"<html>a proxy</html>")
        return httpx.Response(200, content=b"{" + b" " * 5000 + b"}")

    async with gateway(handler, limit=4096) as etcd:
        with pytest.raises(EtcdError, match="not JSON"):
            await etcd.range("/k")
        with pytest.raises(EtcdError, match="over 4096 bytes"):
            await etcd.grant(5)


async def test_a_dead_endpoint_is_unavailable_and_the_next_call_goes_to_the_next() -> None:
    hosts: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        if request.url.host == "e1":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.host == "e2":
            await trio.sleep(10)  # answers nothing: the call's own deadline ends it
        return httpx.Response(200, json={"ID": "1", "TTL": "5"})

    async with gateway(handler, urls=("http://e1:1", "http://e2:1", "http://e3:1")) as etcd:
        with pytest.raises(EtcdUnavailable) as caught:
            await etcd.grant(5)
        assert caught.value.code == "unavailable" and "ConnectError" in caught.value.reason
        with trio.fail_after(2), pytest.raises(EtcdUnavailable, match="within 0.5 s"):
            await etcd.grant(5)
        assert await etcd.grant(5) == (1, 5)
    assert hosts == ["e1", "e2", "e3"]
