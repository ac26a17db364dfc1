"""The status page on the metrics port: ``/`` and its two files, and the JSON it polls (``/status/live``).

Theory of operation
-------------------
The page is three small files (and an icon) shipped as package data (``idled/ops/static/``: HTML, JS, CSS; no build step,
no CDN), read once when the endpoint starts and served from memory. The browser draws everything (inline SVG)
from one JSON document it polls about once a second, ``GET /status/live?after=SEQ&since=T``: the ``/status``
document plus a ``vitals`` part holding only what changed since the previous poll -- the events with a seq
above ``after`` and the one-second samples newer than ``since`` (unix seconds) -- and the small parts that are
cheap to send whole (rates, the lateness histogram). A first poll (no ``after``/``since``) gets the last 100
events and the last ten minutes. The document is built on the event loop from in-memory state; nothing is
written, nothing is changed: the page is read-only, and the endpoint has no method but GET and HEAD.

With auth on, ``/status/live`` answers 401 without the HTTP API's bearer token (`idled.ops.health`): the page
then draws what the redacted ``/status`` holds (counts, readiness, configuration) and shows a small form for
an API token. The token is kept in the tab's ``sessionStorage`` only (gone when the tab closes; never in the
URL, a cookie or ``localStorage``), sent as ``Authorization: Bearer`` on each poll, and forgotten -- with the
daemon's reason shown -- as soon as the daemon refuses it. The form is handled by the script and never
submitted (the CSP's ``form-action 'none'`` would refuse it anyway).

Every file of the page is sent with ``Content-Security-Policy: default-src 'self'`` (no inline script or
style, nothing from elsewhere, no framing), ``X-Content-Type-Options: nosniff`` and ``Cache-Control:
no-cache`` (revalidated on each load, so an upgraded daemon never runs yesterday's script); the JSON with
``Cache-Control: no-store``. A process without the daemon's health (an ``idled edge`` with a metrics port)
serves a short note at ``/`` instead: its figures are the core's, on the core's page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from typing import Final
from urllib.parse import parse_qs

__all__ = ["ASSETS", "CSP", "LIVE_PATH", "PAGE_HEADERS", "Asset", "live_query", "load_assets"]

LIVE_PATH: Final = "/status/live"
CSP: Final = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
PAGE_HEADERS: Final = (
    ("Content-Security-Policy", CSP),
    ("Cache-Control", "no-cache"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
)
JSON_HEADERS: Final = (("Cache-Control", "no-store"),)

# path -> (file in idled/ops/static, content type); "/" is status.html, or edge.html without the daemon's health
ASSETS: Final = {
    "/": ("status.html", "text/html; charset=utf-8"),
    "/static/status.js": ("status.js", "text/javascript; charset=utf-8"),
    "/static/status.css": ("status.css", "text/css; charset=utf-8"),
    "/static/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
EDGE_PAGE: Final = "edge.html"


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str


def load_assets(*, full: bool = True) -> dict[str, Asset]:
    """The page's files, read from the package (``full``: the daemon's page; else the edge's note at ``/``)."""
    static = resources.files("idled.ops").joinpath("static")
    assets = {path: Asset(static.joinpath(name).read_bytes(), kind) for path, (name, kind) in ASSETS.items()}
    if not full:
        assets["/"] = Asset(static.joinpath(EDGE_PAGE).read_bytes(), ASSETS["/"][1])
    return assets


def live_query(query: str) -> tuple[int, float | None]:
    """``(after, since)`` from ``after=SEQ&since=T`` (either may be missing: 0 and None); ValueError if bad."""
    fields = parse_qs(query, max_num_fields=4)
    after = fields.get("after", ["0"])[-1]
    since = fields.get("since", [""])[-1]
    seq = int(after) if after else 0
    wall = float(since) if since else None
    if seq < 0 or (wall is not None and not math.isfinite(wall)):
        raise ValueError("after must be a seq >= 0 and since a time")
    return seq, wall
