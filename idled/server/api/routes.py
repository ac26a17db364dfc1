"""Dispatch, in two steps: a request admitted at its head, then run with its body, one JSON document out.

Theory of operation
-------------------
``Router.admit`` is what the HTTP loop (``idled.server.api.http``) calls as soon as a request head is in,
before a byte of its body is read. In order: the route (unknown path: ``not_found``; known path, other
method: ``method_not_allowed`` with ``Allow``; HEAD is served wherever GET is, by GET's handler), whether a
browser sent it (below: ``misdirected_request``, ``forbidden``), the rate limit (``ratelimit.RateLimiter``,
per client address: ``rate_limited`` with ``Retry-After``), the bearer token (with a secret: exactly one
``Authorization: Bearer <api token>``, checked in constant time by ``idled.protocol.tokens.bearer_refusal``:
``unauthorized`` with ``WWW-Authenticate: Bearer``), and a POST's media type (``application/json``, with any
parameters: else ``unsupported_media_type``). It answers a refusal, or hands back a ``Ticket``: the loop reads
the body (only now: a client without a token never gets its body read, nor held) and calls ``Router.run``,
which runs the handler. A handler signals a client error with ``ApiError``; any other exception is a bug:
logged with its traceback and answered ``500 internal``, never raised into the server. Every handler judges
its query string by one rule (``request.query_parameters``): a parameter the route does not take is
``bad_request`` naming it.

**Browsers** (``idled.ops.origin``). The API is for backends: there is no CORS, and a request a browser marks
as another site's -- an ``Origin`` that is not the request's own, ``Sec-Fetch-Site: cross-site`` or
``same-site`` -- is ``403 forbidden``. The media type forces what is left, a page's POST, into a CORS
preflight, which is never answered: a page can send a form or ``text/plain`` without one. With auth off (the
API on loopback), the ``Host`` must be an IP literal or ``localhost``, else ``421 misdirected_request``: a
page whose name was rebound to 127.0.0.1 is same-origin to its browser and sends no ``Origin`` on a GET.
421 rather than 403: the request is not forbidden to its sender but addressed by a name this server does
not answer to -- the same request by IP is served (RFC 9110 15.5.20). With auth on, operators reach the API
by DNS names and the token guards it (a page cannot make its browser send one): the Host is not checked.

**Unauthenticated connections.** With auth on, every refusal of a request that did not show a good token
says ``Connection: close`` (the loop closes after it), whatever its status: an unauthenticated client gets
one answer per connection, so it cannot hold a connection by sending cheap requests (a ``404``, a ``429``).
The token is therefore judged for every request, before the refusals that come ahead of it in the order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import trio

from idled.ops.config import Config
from idled.ops.origin import misdirected, misdirected_text, same_origin
from idled.protocol.tokens import BEARER_CHALLENGE, bearer_refusal
from idled.server.api.backend import Backend
from idled.server.api.errors import ApiError
from idled.server.api.events import EVENTS_PATH, Events
from idled.server.api.kick import kick
from idled.server.api.openapi import served_document
from idled.server.api.presence import presence
from idled.server.api.ratelimit import RateLimiter
from idled.server.api.request import body_uids, kick_request, no_query, query_uids, split_target
from idled.server.api.stats import stats

__all__ = ["OTHER_ROUTE", "ROUTES", "Answer", "Router", "Ticket"]

log = logging.getLogger("idled.server.api")

ROUTES: Final = {"/v1/presence": ("GET", "HEAD", "POST"), "/v1/stats": ("GET", "HEAD"), "/v1/kick": ("POST",),
                 "/v1/openapi.json": ("GET", "HEAD"),
                 EVENTS_PATH: ("GET", "HEAD")}  # HEAD: GET's answer without its body
OTHER_ROUTE: Final = "other"  # the route label of every path not served (a bounded metric label)

CLOSE: Final = ("Connection", "close")  # in a refusal's headers: the connection ends after it (idled.server.api.http)
JSON_TYPE: Final = b"application/json"
REFUSED_SITES: Final = (b"cross-site", b"same-site")  # Sec-Fetch-Site values of another site's page

# (route label, status, JSON document, extra headers)
Answer = tuple[str, int, Any, tuple[tuple[str, str], ...]]
Handler = Callable[[str, str, bytes], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Ticket:
    """A request admitted at its head: its route label, handler and query string, the method its handler
    runs (HEAD runs GET's); ``token``: it carried a good bearer token (False: auth is off)."""

    route: str
    handler: Handler
    query: str
    method: str
    token: bool


class Router:
    """See the module docstring. ``clock``: the monotonic clock of the rate limiter (trio's by default);
    ``api_connections``: the API's open connections (for ``/v1/stats``)."""

    def __init__(self, backend: Backend, config: Config, secret: bytes | None, *,
                 api_connections: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.backend = backend
        self.config = config
        self.secret = secret
        self.limiter = RateLimiter(config.api_rate, config.api_burst)
        self.clock = clock
        self.api_connections = api_connections
        self.handlers: dict[tuple[str, str], Handler] = {
            ("GET", "/v1/presence"): self._get_presence,
            ("POST", "/v1/presence"): self._post_presence,
            ("GET", "/v1/stats"): self._stats,
            ("POST", "/v1/kick"): self._kick,
            ("GET", "/v1/openapi.json"): self._openapi,
        }
        # GET /v1/events (idled.server.api.events): its handler answers an EventStream the HTTP loop streams.
        self.events = None if backend.observers is None else Events(
            backend.observers, heartbeat=config.api_heartbeat, max_watch=config.max_watch)
        self.handlers["GET", EVENTS_PATH] = self._events

    def admit(self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], client: str) -> Ticket | Answer:
        """The request's head judged (see the module docstring): a ticket to run it, or the answer refusing it."""
        refusal = self._token_refusal(headers)  # None: a good token, or auth off
        route = OTHER_ROUTE
        try:
            path, query = split_target(target)
            methods = ROUTES.get(path)
            if methods is None:
                raise ApiError("not_found", f"no such route: {path[:100]}")
            route = path
            if method not in methods:
                raise ApiError("method_not_allowed", f"{path} allows {', '.join(methods)}",
                               (("Allow", ", ".join(methods)),))
            self._browser(headers)
            self._admit(client)
            if refusal is not None:
                raise ApiError("unauthorized", refusal, BEARER_CHALLENGE)
            if method == "POST":
                _json_media_type(headers)
            runs = "GET" if method == "HEAD" else method
            return Ticket(route, self.handlers[runs, path], query, runs, self.secret is not None)
        except ApiError as exc:
            close = (CLOSE,) if self.secret is not None and refusal is not None else ()
            return route, exc.status, exc.document(), exc.headers + close

    async def run(self, ticket: Ticket, body: bytes) -> Answer:
        """Run an admitted request's handler on its body."""
        try:
            return ticket.route, 200, await ticket.handler(ticket.query, ticket.method, body), ()
        except ApiError as exc:
            return ticket.route, exc.status, exc.document(), exc.headers
        except Exception:
            log.exception("HTTP API: %s %s?%s failed", ticket.method, ticket.route, ticket.query[:200])
            return ticket.route, 500, ApiError("internal", "internal error (logged)").document(), ()

    def _admit(self, client: str) -> None:
        wait = self.limiter.take(client, self.clock())
        if wait:
            raise ApiError("rate_limited", f"more than {self.config.api_rate:g} requests/s",
                           (("Retry-After", str(max(1, math.ceil(wait)))),))

    def _token_refusal(self, headers: Sequence[tuple[bytes, bytes]]) -> str | None:
        """None: one good api token, or auth is off; else why the request's token is refused."""
        if self.secret is None:
            return None  # auth off: the API listens on a loopback address only (or --insecure)
        values = [value.decode("latin-1") for name, value in headers if name == b"authorization"]
        return bearer_refusal(self.secret, values, self.backend.sessions.clock.tokens())

    def _browser(self, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """Refuse what a browser sends for another site, and (auth off) a Host this machine is not (see the module
        docstring)."""
        hosts = [value for name, value in headers if name == b"host"]
        host = hosts[0].decode("latin-1") if hosts else None  # (h11 refused two; HTTP/1.0 may send none)
        if self.secret is None and misdirected(host):
            raise ApiError("misdirected_request", misdirected_text("the API"))
        for name, value in headers:
            if name == b"origin" and (host is None or not same_origin(value.decode("latin-1"), host)):
                raise ApiError("forbidden", "a request from another origin: the API is for backends, not browsers "
                               "(no CORS)")
            if name == b"sec-fetch-site" and value.strip().lower() in REFUSED_SITES:
                raise ApiError("forbidden", "a browser's request for another site: the API is for backends, not "
                               "browsers (no CORS)")

    # -- handlers -------------------------------------------------------------------------------------------

    async def _get_presence(self, query: str, method: str, body: bytes) -> Any:
        return await presence(self.backend, query_uids(query, self.config.api_max_batch))

    async def _post_presence(self, query: str, method: str, body: bytes) -> Any:
        no_query(query, "POST /v1/presence")  # (the uids are in the body)
        return await presence(self.backend, body_uids(body, self.config.api_max_batch))

    async def _stats(self, query: str, method: str, body: bytes) -> Any:
        no_query(query, "/v1/stats")
        return stats(self.backend, self.api_connections())

    async def _kick(self, query: str, method: str, body: bytes) -> Any:
        no_query(query, "POST /v1/kick")
        return await kick(self.backend, kick_request(body))

    async def _openapi(self, query: str, method: str, body: bytes) -> Any:
        no_query(query, "/v1/openapi.json")
        return served_document(self.secret is not None)

    async def _events(self, query: str, method: str, body: bytes) -> Any:
        if self.events is None:
            raise ApiError("not_found", f"no event stream here: {EVENTS_PATH}")
        return self.events.stream(query)


def _json_media_type(headers: Sequence[tuple[bytes, bytes]]) -> None:
    """A POST's body must say it is JSON: ``Content-Type: application/json``, parameters allowed (a page cannot
    send that without a CORS preflight, which is never answered); ``unsupported_media_type`` otherwise."""
    types = [value for name, value in headers if name == b"content-type"]
    if len(types) != 1 or types[0].partition(b";")[0].strip().lower() != JSON_TYPE:
        raise ApiError("unsupported_media_type", "a request body must be sent as Content-Type: application/json")
