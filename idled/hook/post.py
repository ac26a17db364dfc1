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
answers only.

Redirects are followed deliberately, not by httpx (which would turn a POST into a GET on a 301, 302 or 303
and drop the body): `redirect_target` follows a **307 or 308 to the same origin** (scheme, host and port of
``--url``), keeping the method, the body and the headers -- the signature covers the webhook-id, the
timestamp and the body, not the URL, so it stays valid -- up to `MAX_REDIRECTS` hops within the one
request's deadline. Anything else is a failed attempt whose error says why (retried, then dead-lettered
like a 500): a 301/302/303 (the POST would become a GET), another origin (the signed events would go to a
host the operator never named: a receiver's open redirect must not forward them), a missing Location, too
many hops. A 308 is logged once per target (update ``--url``). Proxies from the environment are not used (``trust_env=False``: the unit's environment decides
nothing silently), and one keep-alive connection is reused across requests: one batch is in flight at a time.
"""

from __future__ import annotations

import logging
import ssl
import time
from dataclasses import dataclass
from typing import Final

import httpx
import trio

from idled import __version__
from idled.hook.retry import parse_retry_after

__all__ = ["Outcome", "Poster", "USER_AGENT", "MAX_REDIRECTS", "redirect_target"]

log = logging.getLogger("idled.hook")

USER_AGENT: Final = f"idled-hook/{__version__}"
MAX_REDIRECTS: Final = 5
_RETRY_AFTER_STATUSES: Final = frozenset({429, 503})
_KEEPS_METHOD: Final = frozenset({307, 308})


def redirect_target(origin: httpx.URL, current: httpx.URL, status: int,
                    location: str | None) -> tuple[httpx.URL | None, str]:
    """Where a 3xx answer to a POST to ``current`` sends the next hop -- (the URL, "") -- or (None, why it is
    not followed). ``origin``: the configured URL, whose scheme, host and port every hop must keep. Pure."""
    if not location:
        return None, "a redirect without a Location"
    try:
        target = current.join(location)
    except httpx.InvalidURL:
        return None, f"a redirect to an unreadable Location {location[:200]!r}"
    if status not in _KEEPS_METHOD:
        return None, f"redirect to {target} not followed: only 307 and 308 keep the POST and its body (fix --url)"
    # raw_host, not host: host decodes punycode, and a receiver's Location whose host is not valid IDNA
    # (``xn--hooks-example.com``) would raise idna's ValueError there and end the hook. raw_host is the ASCII
    # (IDNA-encoded, lower-case) form both URLs were parsed to: equal exactly when they name one host.
    if (target.scheme, target.raw_host, target.port) != (origin.scheme, origin.raw_host, origin.port):
        return None, f"redirect to {target} not followed: another origin than --url's (fix --url)"
    return target, ""


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
        self._url = httpx.URL(url)
        self._told: set[str] = set()  # 308 targets already logged
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
        url = self._url
        for _ in range(MAX_REDIRECTS + 1):
            refusal, retry_after = "", None
            try:
                async with self._client.stream("POST", url, content=body, headers=headers) as response:
                    status = response.status_code
                    if 200 <= status < 300:
                        return Outcome(status)
                    text = await self._excerpt(response)
                    if 300 <= status < 400:
                        target, refusal = redirect_target(self._url, url, status, response.headers.get("Location"))
                        if target is not None:
                            self._moved(status, url, target)
                            url = target
                            continue
                    if status in _RETRY_AFTER_STATUSES:
                        retry_after = parse_retry_after(response.headers.get("Retry-After"), time.time())
            except httpx.TimeoutException:
                return Outcome(None, f"no answer within {self.timeout:g} s", result="timeout")
            except (httpx.HTTPError, OSError, ssl.SSLError) as exc:
                return Outcome(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                               result="connect_error")
            except ValueError as exc:
                # httpx reads a 3xx's Location even with follow_redirects off (response.next_request): a host that
                # is punycode but not valid IDNA raises idna's error (a ValueError) there. The receiver's doing:
                # a failed attempt like any other answer we cannot use, never an exception that ends the hook.
                return Outcome(None, f"an answer that could not be read ({type(exc).__name__}: {str(exc)[:200]})",
                               result="http_other")
            label = "http_4xx" if 400 <= status < 500 else "http_5xx" if 500 <= status < 600 else "http_other"
            error = f"HTTP {status} {response.reason_phrase}" + (f": {refusal or text}" if refusal or text else "")
            return Outcome(status, error, retry_after, label)
        return Outcome(status, f"HTTP {status}: more than {MAX_REDIRECTS} redirects (the last to {url})",
                       result="http_other")

    def _moved(self, status: int, current: httpx.URL, target: httpx.URL) -> None:
        if status == 308 and str(target) not in self._told:  # permanent: the operator should know, once
            self._told.add(str(target))
            log.warning("the receiver says %s moved permanently to %s (308, followed): update --url", current, target)
        else:
            log.debug("following a %d from %s to %s", status, current, target)

    async def _excerpt(self, response: httpx.Response) -> str:
        data = b""
        async for chunk in response.aiter_raw():
            data += chunk
            if len(data) >= self.max_response_bytes:
                break
        text = data[:200].decode("utf-8", "replace").strip()
        return " ".join(text.split())
