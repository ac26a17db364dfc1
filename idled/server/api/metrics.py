"""The API's metrics, on the daemon's registry (none: unregistered, as ``NullMetrics`` has none).

``idled_api_requests_total{route,status}``, ``idled_api_request_duration_seconds{route}`` (a histogram: from
the request's last byte to its response's last), ``idled_api_connections`` (open now). The API's connections
are not in ``idled_connections{role}``: those counts add up to the client connection limit
(``max_connections``), which HTTP clients have their own limit beside (``api_max_clients``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ApiMetrics", "DURATION_BUCKETS"]

DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.requests = Counter("idled_api_requests_total", "HTTP API requests answered, by route and status",
                                ["route", "status"], registry=registry)
        self.duration = Histogram("idled_api_request_duration_seconds",
                                  "seconds from an HTTP API request's last byte to its response's last",
                                  ["route"], buckets=DURATION_BUCKETS, registry=registry)
        self.connections = Gauge("idled_api_connections", "open HTTP API connections", registry=registry)
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        children = self._children.get((route, status))
        if children is None:  # labels() costs ~2 us: looked up once per (route, status)
            children = self._children[route, status] = (
                self.requests.labels(route=route, status=str(status)), self.duration.labels(route=route))
        children[0].inc()
        children[1].observe(seconds)
