"""One webhook request: POST a signed body, classify the answer. Built on httpx's AsyncClient, which runs on
trio (through anyio and httpcore's trio backend).

Theory of operation
-------------------
`Poster.post` sends one attempt and returns an `Outcome`, never raising for what the network or the receiver
did: a 2xx is success; any other status, a connection error (refused, reset, TLS) or the per-request
deadline is a failure with a one-line ``error`` for the log and the dead-letter file. The deadline covers the
whole exchange (connect, send, the response head and up to ``max_response_bytes`` of its body, read only to
quote it in the error), enforced by a trio cancel scope on top of httpx's per-operation timeouts, so a
receiver that drips one byte a second cannot hold a request forever. ``Retry-After`` is read from 429 and 503
answers only. Redirects are not followed (a webhook URL that moved is a configuration error to see, not to
follow), proxies from the environment are not used (``trust_env=False``: the unit's environment decides
nothing silently), and one keep-alive connection is reused across requests: one batch is in flight at a time.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from typing import Final

import httpx
import trio

from idled import __version__
from idled.hook.retry import parse_retry_after

__all__ = ["Outcome", "Poster", "USER_AGENT"]

USER_AGENT: Final = f"idled-hook/{__version__}"
_RETRY_AFTER_STATUSES: Final = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int | None  # None: no HTTP answer (connection error or timeout)
    error: str = ""  # empty on success
    retry_after: float | None = None
    result: str = "ok"  # metrics label: ok, http_4xx, http_5xx, http_other, timeout, connect_error

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class Poster:
    """An HTTP client for one URL (use ``async with``)."""

    def __init__(self, url: str, *, timeout: float, ca_file: str | None = None,
                 max_response_bytes: int = 4096) -> None:
        self.url = url
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        verify: ssl.SSLContext | bool = True
        if ca_file is not None:
            verify = ssl.create_default_context(cafile=ca_file)  # OSError/SSLError: the caller's usage error
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), verify=verify, follow_redirects=False, trust_env=False,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"},
        )

    async def __aenter__(self) -> Poster:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            await self._client.aclose()

    async def post(self, body: bytes, headers: dict[str, str]) -> Outcome:
        outcome: Outcome | None = None
        with trio.move_on_after(self.timeout):
            outcome = await self._attempt(body, headers)
        if outcome is None:
            return Outcome(None, f"no answer within {self.timeout:g} s", result="timeout")
        return outcome

    async def _attempt(self, body: bytes, headers: dict[str, str]) -> Outcome:
        try:
            async with self._client.stream("POST", self.url, content=body, headers=headers) as response:
                status = response.status_code
                if 200 <= status < 300:
                    return Outcome(status)
                text = await self._excerpt(response)
                retry_after = None
                if status in _RETRY_AFTER_STATUSES:
                    retry_after = parse_retry_after(response.headers.get("Retry-After"), time.time())
        except httpx.TimeoutException:
            return Outcome(None, f"no answer within {self.timeout:g} s", result="timeout")
        except (httpx.HTTPError, OSError, ssl.SSLError) as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                           result="connect_error")
        label = "http_4xx" if 400 <= status < 500 else "http_5xx" if 500 <= status < 600 else "http_other"
        error = f"HTTP {status} {response.reason_phrase}" + (f": {text}" if text else "")
        return Outcome(status, error, retry_after, label)

    async def _excerpt(self, response: httpx.Response) -> str:
        data = b""
        async for chunk in response.aiter_raw():
            data += chunk
            if len(data) >= self.max_response_bytes:
                break
        text = data[:200].decode("utf-8", "replace").strip()
        return " ".join(text.split())
