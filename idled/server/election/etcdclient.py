"""A small client for etcd's v3 JSON gateway (``POST /v3/...``), on trio through ``httpx.AsyncClient``.

Theory of operation
-------------------
etcd serves its gRPC API as JSON over HTTP/1.1 on the client port (since 3.4 under ``/v3/``; 3.3 used
``/v3beta/``): a request is one JSON object, keys and values are base64, 64-bit integers are strings.
The election needs six calls: lease grant, keepalive and revoke, a transaction, a range read, and a watch.
A keepalive or a watch is a gRPC stream; over the gateway, a one-object request body gives one keepalive
answer (then the stream ends), and a watch keeps answering, one JSON object per line, until we close it.

``call`` sends one request to the current endpoint and bounds the whole exchange (connect, send, the answer
up to ``max_response_bytes``) with a trio cancel scope, on top of httpx's per-operation timeouts: no
request outlives ``timeout``. It raises `EtcdUnavailable` when nothing usable came back in time -- and the
next call goes to the next endpoint of the list (a cluster's members all serve the same API) -- and
`EtcdError` when etcd answered with an error. A watch's lines are read against the same byte limit.

Why not a library: ``etcd3gw`` (PyPI, OpenStack) speaks this same gateway, but through ``requests``,
blocking, with threads (``futurist``) for watches: on trio every call would be a worker thread that a cancel
scope cannot stop. ``etcd3`` (python-etcd3) speaks gRPC (``grpcio``), likewise blocking, and has had no
release since 0.12.0 in March 2020. httpx is already a dependency (``idled hook``) and runs on trio.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import trio

from idled import __version__
from idled.server.election.errors import EtcdError, EtcdUnavailable

__all__ = [
    "EtcdClient", "KeyValue", "WatchEvent", "compare_create", "compare_lease", "put", "get", "b64", "unb64",
]

USER_AGENT: Final = f"idled-election/{__version__}"
MAX_RESPONSE_BYTES: Final = 1 << 20  # one key's range or one watch batch: our values are a few bytes


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int  # 0: none

    @classmethod
    def parse(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(unb64(kv["key"]).decode("utf-8", "replace"), unb64(kv.get("value", "")),
                   int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)), int(kv.get("lease", 0)))


@dataclass(frozen=True, slots=True)
class WatchEvent:
    deleted: bool  # False: a put
    kv: KeyValue


# Transaction building blocks (etcd's Compare and RequestOp, as JSON).
def compare_create(key: str, revision: int) -> dict[str, Any]:
    """True when ``key``'s create revision is ``revision`` (0: the key does not exist)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}


def compare_lease(key: str, lease: int) -> dict[str, Any]:
    """True when ``key`` is attached to lease ``lease``."""
    return {"key": b64(key), "target": "LEASE", "result": "EQUAL", "lease": str(lease)}


def put(key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = str(lease)
    return {"request_put": request}


def get(key: str) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


class EtcdClient:
    """One etcd cluster's JSON gateway (use ``async with``). ``base_urls``: ``http://host:port`` each."""

    def __init__(self, base_urls: Sequence[str], *, timeout: float,
                 max_response_bytes: int = MAX_RESPONSE_BYTES,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not base_urls:
            raise ValueError("no etcd endpoint")
        self.base_urls = tuple(base_urls)
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self._current = 0
        # A keepalive, a txn and a watch may be in flight together; the environment's proxies decide nothing.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False,
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"}, transport=transport,
        )

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            await self._client.aclose()

    @property
    def endpoint(self) -> str:
        return self.base_urls[self._current]

    def _rotate(self, endpoint: str) -> None:
        if self.endpoint == endpoint:  # not if a concurrent failure rotated already
            self._current = (self._current + 1) % len(self.base_urls)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` and return etcd's answer (see the module docstring)."""
        endpoint = self.endpoint
        answer: dict[str, Any] | None = None
        with trio.move_on_after(self.timeout):
            answer = await self._attempt(endpoint, path, body)
        if answer is None:
            self._rotate(endpoint)
            raise EtcdUnavailable(f"{endpoint}: no answer to /v3/{path} within {self.timeout:g} s")
        return answer

    async def _attempt(self, endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            async with self._client.stream("POST", f"{endpoint}/v3/{path}", content=json.dumps(body)) as response:
                data = await self._read(response.aiter_bytes(), endpoint, path)
                status = response.status_code
        except httpx.HTTPError as exc:
            self._rotate(endpoint)
            raise EtcdUnavailable(f"{endpoint}: /v3/{path}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        answer = _json_object(data, endpoint, path)
        if status != 200 or "error" in answer:
            error = answer.get("error")
            message = answer.get("message") or (error.get("message") if isinstance(error, dict) else error)
            raise EtcdError(f"{endpoint}: /v3/{path}: HTTP {status}: {message or 'no message'}")
        return answer

    async def _read(self, chunks: Any, endpoint: str, path: str) -> bytes:
        data = b""
        async for chunk in chunks:
            data += chunk
            if len(data) > self.max_response_bytes:
                raise EtcdError(f"{endpoint}: /v3/{path}: answer over {self.max_response_bytes} bytes")
        return data

    # -- the calls the election makes ---------------------------------------------------------------------

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (its id, its granted ttl)."""
        answer = await self.call("lease/grant", {"TTL": str(ttl)})
        if "ID" not in answer:
            raise EtcdError(f"{self.endpoint}: /v3/lease/grant: no lease ID in {answer!r:.200}")
        return int(answer["ID"]), int(answer.get("TTL", 0))

    async def keepalive(self, lease: int) -> int:
        """Renew ``lease``; its ttl from now, or 0 when etcd no longer has it."""
        answer = await self.call("lease/keepalive", {"ID": str(lease)})
        result = answer.get("result")
        if not isinstance(result, dict):
            raise EtcdError(f"{self.endpoint}: /v3/lease/keepalive: no result in {answer!r:.200}")
        return int(result.get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """Revoke ``lease`` (its keys go with it); a lease etcd no longer has is not an error."""
        try:
            await self.call("lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if "lease not found" not in exc.reason:
                raise

    async def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
                  failure: list[dict[str, Any]]) -> tuple[bool, list[dict[str, Any]], int]:
        """(succeeded, the responses of the branch taken, the store's revision after it)."""
        answer = await self.call("kv/txn", {"compare": compare, "success": success, "failure": failure})
        return bool(answer.get("succeeded", False)), list(answer.get("responses", [])), _revision(answer)

    async def range(self, key: str) -> tuple[KeyValue | None, int]:
        """``key``'s value (None: absent) and the store's revision."""
        answer = await self.call("kv/range", {"key": b64(key)})
        kvs = answer.get("kvs") or []
        return (KeyValue.parse(kvs[0]) if kvs else None), _revision(answer)

    async def watch(self, key: str, start_revision: int) -> list[WatchEvent]:
        """The first batch of changes to ``key`` at or after ``start_revision``; blocks until one comes (bound it
        with a cancel scope). [] when etcd cancels the watch (e.g. that revision was compacted: read again)."""
        endpoint = self.endpoint
        body = {"create_request": {"key": b64(key), "start_revision": str(start_revision)}}
        try:
            async with self._client.stream("POST", f"{endpoint}/v3/watch", content=json.dumps(body),
                                           timeout=httpx.Timeout(self.timeout, read=None)) as response:
                if response.status_code != 200:
                    data = await self._read(response.aiter_bytes(), endpoint, "watch")
                    raise EtcdError(f"{endpoint}: /v3/watch: HTTP {response.status_code}: {data[:200]!r}")
                buffer = b""
                async for chunk in response.aiter_bytes():
                    buffer += chunk
                    if len(buffer) > self.max_response_bytes:
                        raise EtcdError(f"{endpoint}: /v3/watch: a line over {self.max_response_bytes} bytes")
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        events = _watch_line(line, endpoint)
                        if events is not None:
                            return events
        except httpx.HTTPError as exc:
            self._rotate(endpoint)
            raise EtcdUnavailable(f"{endpoint}: /v3/watch: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        self._rotate(endpoint)
        raise EtcdUnavailable(f"{endpoint}: /v3/watch: the stream ended")


def _watch_line(line: bytes, endpoint: str) -> list[WatchEvent] | None:
    """The events of one line of a watch stream; None: nothing yet (the ``created`` answer, a progress note)."""
    if not line.strip():
        return None
    answer = _json_object(line, endpoint, "watch")
    if "error" in answer:
        raise EtcdError(f"{endpoint}: /v3/watch: {answer['error']!r:.200}")
    result = answer.get("result", {})
    if result.get("canceled") or result.get("compact_revision"):
        return []
    events = [WatchEvent(event.get("type") == "DELETE", KeyValue.parse(event["kv"]))
              for event in result.get("events", [])]
    return events or None


def _json_object(data: bytes, endpoint: str, path: str) -> dict[str, Any]:
    try:
        answer = json.loads(data)
    except ValueError:
        raise EtcdError(f"{endpoint}: /v3/{path}: not JSON: {data[:200]!r}") from None
    if not isinstance(answer, dict):
        raise EtcdError(f"{endpoint}: /v3/{path}: not a JSON object: {data[:200]!r}")
    return answer


def _revision(answer: dict[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))
