"""Dispatch, in two steps: a request admitted at its head, then run with its body, one JSON document out.

Theory of operation
-------------------
``Router.admit`` is what the HTTP loop (``idled.server.api.http``) calls as soon as a request head is in,
before a byte of its body is read. In order: the route (unknown path: ``not_found``; known path, other
method: ``method_not_allowed`` with ``Allow``; HEAD is served wherever GET is, by GET's handler), the rate
limit (``ratelimit.RateLimiter``, per client address: ``rate_limited`` with ``Retry-After``), the bearer token
(with a secret: ``Authorization: Bearer <api token>``, checked in constant time by
``idled.protocol.tokens.verify_bearer``: ``unauthorized`` with ``WWW-Authenticate: Bearer``). It answers a
refusal, or hands back a ``Ticket``: the loop reads the body (only now: a client without a token never gets
its body read, nor held) and calls ``Router.run``, which runs the handler. A handler signals a client error
with ``ApiError``; any other exception is a bug: logged with its traceback and answered ``500 internal``,
never raised into the server.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import trio

from idled.ops.config import Config
from idled.protocol.tokens import API_ROLE, AuthError, verify_bearer
from idled.server.api.backend import Backend
from idled.server.api.errors import ApiError
from idled.server.api.kick import kick
from idled.server.api.openapi import OPENAPI
from idled.server.api.presence import presence
from idled.server.api.ratelimit import RateLimiter
from idled.server.api.request import body_uids, kick_request, query_uids, split_target
from idled.server.api.stats import stats

__all__ = ["OTHER_ROUTE", "ROUTES", "Answer", "Router", "Ticket"]

log = logging.getLogger("idled.server.api")

ROUTES: Final = {"/v1/presence": ("GET", "HEAD", "POST"), "/v1/stats": ("GET", "HEAD"), "/v1/kick": ("POST",),
                 "/v1/openapi.json": ("GET", "HEAD")}  # HEAD: GET's answer without its body
OTHER_ROUTE: Final = "other"  # the route label of every path not served (a bounded metric label)

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

    def admit(self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], client: str) -> Ticket | Answer:
        """The request's head judged (see the module docstring): a ticket to run it, or the answer refusing it."""
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
            self._admit(client)
            token = self._authorize(headers)
            runs = "GET" if method == "HEAD" else method
            return Ticket(route, self.handlers[runs, path], query, runs, token)
        except ApiError as exc:
            return route, exc.status, exc.document(), exc.headers

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

    def _authorize(self, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        """True: a good api token; False: auth is off. Else ``unauthorized``."""
        if self.secret is None:
            return False  # auth off: the API listens on a loopback address only (or --insecure)
        value = next((v for name, v in headers if name == b"authorization"), None)
        challenge = (("WWW-Authenticate", 'Bearer realm="idled"'),)
        if value is None:
            raise ApiError("unauthorized", "Authorization: Bearer <api token> is required", challenge)
        scheme, _, token = value.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            raise ApiError("unauthorized", "the Authorization scheme must be Bearer", challenge)
        try:
            verify_bearer(self.secret, token.strip(), API_ROLE, self.backend.sessions.clock.tokens())
        except AuthError as exc:
            raise ApiError("unauthorized", exc.reason, challenge) from None
        return True

    # -- handlers -------------------------------------------------------------------------------------------

    async def _get_presence(self, query: str, method: str, body: bytes) -> Any:
        return await presence(self.backend, query_uids(query, self.config.api_max_batch))

    async def _post_presence(self, query: str, method: str, body: bytes) -> Any:
        return await presence(self.backend, body_uids(body, self.config.api_max_batch))

    async def _stats(self, query: str, method: str, body: bytes) -> Any:
        return stats(self.backend, self.api_connections())

    async def _kick(self, query: str, method: str, body: bytes) -> Any:
        return await kick(self.backend, kick_request(body))

    async def _openapi(self, query: str, method: str, body: bytes) -> Any:
        return OPENAPI
