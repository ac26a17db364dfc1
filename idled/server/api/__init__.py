"""The HTTP presence API: a server role beside users, gateways and observers, on its own listener.

Theory of operation
-------------------
``idled serve --api-port N`` (0: off) serves JSON over HTTP/1.1 from the process that holds the presence
table (the core; with ``--workers`` too). The pieces, one job each:

* ``server.Api``: the listener, each connection through the door's gate (counted against its address until
  it shows a token), admission (``api_max_clients``), graceful close on shutdown;
* ``http.HttpConnection``: one connection, with h11 (sans-IO: parsing and framing are h11's, the loop
  decides what h11 is handed and enforces the framing rules and the head, body and time limits),
  keep-alive, pipelining, HEAD; ``inbox``: the bytes not yet handed to h11, and where the next request head
  ends in them (CR LF only, the head limit to the byte; pure);
* ``routes.Router``: dispatch in two steps -- admitted from the head (route, the rate limit (``ratelimit``,
  pure), the bearer token) before any of the body is read, then run with the body --, JSON errors
  (``errors.ApiError``), and the one place a handler's bug becomes a logged 500;
* ``request``: parsing and validating what a request asks (pure);
* the routes: ``presence`` (``Queries``, and ``since`` from the log's open sessions), ``kick``
  (``PresenceTable.logout`` per session key, owners told ``kicked``), ``stats`` (``Vitals``), ``openapi``;
* ``events``: ``GET /v1/events``, the event stream as Server-Sent Events -- an observer over HTTP, on the
  observer role's cursor and watchlists, its followers that keep up written by one fan-out task;
* ``backend.Backend``: what the server hands the API (it never sees the ``Server``); ``metrics``.

Nothing below ``idled.server.api`` imports it; ``idled.server.app`` starts it.
"""

from idled.server.api.backend import Backend
from idled.server.api.metrics import ApiMetrics
from idled.server.api.server import Api

__all__ = ["Api", "ApiMetrics", "Backend"]
