"""The hook's Prometheus metrics, built against an injected registry (no module-level state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["HookMetrics", "RESULTS"]

RESULTS = ("ok", "http_4xx", "http_5xx", "http_other", "timeout", "connect_error")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class HookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.delivered = Counter("idled_hook_events_delivered_total",
                                 "Events the receiver acknowledged with a 2xx (re-deliveries after a restart count again)",
                                 registry=registry)
        self.filtered = Counter("idled_hook_events_filtered_total",
                                "Events consumed but not posted (--filter)", registry=registry)
        self.requests = Counter("idled_hook_requests_total", "Webhook requests by result", ["result"],
                                registry=registry)
        for result in RESULTS:
            self.requests.labels(result)
        self.dead_letter = Counter("idled_hook_dead_letter_events_total",
                                   "Events written to the dead-letter file (after --retry-for of failures)",
                                   registry=registry)
        self.checkpoint = Gauge("idled_hook_checkpoint_seq", "Seq of the committed checkpoint", registry=registry)
        self.latency = Histogram("idled_hook_delivery_latency_seconds",
                                 "Event ts (the daemon's wall clock) to the receiver's 2xx, per event",
                                 buckets=_LATENCY_BUCKETS, registry=registry)
        self.retry_backlog = Gauge("idled_hook_retry_backlog_events",
                                   "Events in a batch that failed at least once and is not yet delivered or dead-lettered",
                                   registry=registry)
        self.queued = Gauge("idled_hook_queued_events", "Events received from the daemon and not yet in a batch",
                            registry=registry)
