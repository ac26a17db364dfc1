"""Dispatch: one request (method, target, headers, body) in, one JSON document and status out.

Theory of operation
-------------------
``Router.answer`` is what the HTTP loop (``idled.server.api.http``) calls once a whole request has arrived
(its head and body within their limits). In order: the route (unknown path: ``not_found``; known path, other
method: ``method_not_allowed`` with ``Allow``), the rate limit (``ratelimit.RateLimiter``, per client address:
``rate_limited`` with ``Retry-After``), the bearer token (with a secret: ``Authorization: Bearer <api token>``,
checked in constant time by ``idled.protocol.tokens.verify_bearer``: ``unauthorized`` with
``WWW-Authenticate: Bearer``), then the handler. A handler signals a client error with ``ApiError``; any other
exception is a bug: logged with its traceback and answered ``500 internal``, never raised into the server.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
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

__all__ = ["OTHER_ROUTE", "ROUTES", "Answer", "Router"]

log = logging.getLogger("idled.server.api")

ROUTES: Final = {"/v1/presence": ("GET", "POST"), "/v1/stats": ("GET",), "/v1/kick": ("POST",),
                 "/v1/openapi.json": ("GET",)}
OTHER_ROUTE: Final = "other"  # the route label of every path not served (a bounded metric label)

# (route label, status, JSON document, extra headers)
Answer = tuple[str, int, Any, tuple[tuple[str, str], ...]]
Handler = Callable[[str, str, bytes], Awaitable[Any]]


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

    async def answer(self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes,
                     client: str) -> Answer:
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
            self._authorize(headers)
            return route, 200, await self.handlers[method, path](query, method, body), ()
        except ApiError as exc:
            return route, exc.status, exc.document(), exc.headers
        except Exception:
            log.exception("HTTP API: %s %r failed", method, target[:200])
            return route, 500, ApiError("internal", "internal error (logged)").document(), ()

    def _admit(self, client: str) -> None:
        wait = self.limiter.take(client, self.clock())
        if wait:
            raise ApiError("rate_limited", f"more than {self.config.api_rate:g} requests/s",
                           (("Retry-After", str(max(1, math.ceil(wait)))),))

    def _authorize(self, headers: Sequence[tuple[bytes, bytes]]) -> None:
        if self.secret is None:
            return  # auth off: the API listens on a loopback address only (or --insecure)
        value = next((v for name, v in headers if name == b"authorization"), None)
        challenge = (("WWW-Authenticate", 'Bearer realm="idled"'),)
        if value is None:
            raise ApiError("unauthorized", "Authorization: Bearer <api token> is required", challenge)
        scheme, _, token = value.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            raise ApiError("unauthorized", "the Authorization scheme must be Bearer", challenge)
        try:
            verify_bearer(self.secret, token.strip(), API_ROLE, self.backend.sessions.clock.wall())
        except AuthError as exc:
            raise ApiError("unauthorized", exc.reason, challenge) from None

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
