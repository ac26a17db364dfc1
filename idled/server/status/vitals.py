"""What the daemon shows beyond the scrape-time gauges: the last minutes, the rates, the offline-lateness
histogram with its percentiles, and the last events -- for the status page (``/`` on the metrics port) and
``GET /v1/stats`` (the HTTP API).

Theory of operation
-------------------
The event path pays one deque append per event (``on_event``, called by the bus with each published event):
the last ``RECENT`` events are kept as the bus's own event objects and turned into records only when someone
reads them. Everything else is read off state that exists anyway:

* ``sample(mono, wall)`` -- called by the monitor's periodic hook, at most four times a tick -- keeps one sample
  per ``every`` seconds of the monotonic clock ``mono`` (sessions, users, connections by role, events published
  so far: the seq counter) in a ring of ``history`` samples: 600 small tuples for ten minutes at 1 s. Rates
  are differences along that ring. A sample is stamped with ``wall()``, the server's wall clock, which never
  goes backwards (``idled.server.runtime.clock.WallClock``); being due on the monotonic clock, sampling goes on at
  the same pace whatever the system's wall clock does (a step back of it once stopped the sampling until
  the wall clock had caught up again).
* Lateness is read at request time from the Prometheus histogram the tick task fills anyway
  (``Metrics.offline_lateness``). A percentile is given as the upper bound of the bucket that holds it: an
  "at most" figure (Prometheus' ``histogram_quantile`` would interpolate inside the bucket instead, which
  can report less than a real value). Without metrics (``NullMetrics``, tests) there is no lateness.

``live(after, since)`` is what the status page polls each second (``GET /status/live``): only the events above
seq ``after`` and the samples newer than ``since`` (a sample's ``t`` as sent, rounded to the millisecond: the
page sends back the last one it got), found by walking the two deques from their new end, so a poll that finds
nothing new costs a few comparisons however much is kept. Samples are ``every`` seconds apart on the monotonic
clock, so their wall times are too, give or take the slew after a step (at most 1/12): strictly increasing.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import takewhile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from idled.core.events import PresenceEvent

__all__ = ["HISTORY", "RECENT", "Sample", "Vitals", "histogram_source", "lateness_summary", "page_record"]

HISTORY: Final = 600  # samples kept: ten minutes at one a second
RECENT: Final = 100  # last events kept for the status page
QUANTILES: Final = (0.5, 0.9, 0.99, 0.999)
EXACT_IN_JS: Final = 2**53  # a JSON number beyond this is rounded by a browser: such int uids go as strings


@dataclass(frozen=True, slots=True)
class Sample:
    """The daemon at one moment (``wall``: unix seconds); ``events`` counts every event published so far."""

    wall: float
    sessions: int
    users: int
    connections: Mapping[str, int]
    events: int

    def document(self) -> dict[str, Any]:
        return {"t": round(self.wall, 3), "sessions": self.sessions, "users": self.users,
                "connections": dict(self.connections), "events": self.events}


class Vitals:
    """See the module docstring. ``read(wall)`` takes a sample of the server (read on the event loop);
    ``lateness`` returns the lateness histogram's ``(upper bounds, cumulative counts, sum)`` or None."""

    def __init__(self, read: Callable[[float], Sample], *, every: float = 1.0, history: int = HISTORY,
                 recent: int = RECENT,
                 lateness: Callable[[], tuple[list[float], list[float], float] | None] = lambda: None) -> None:
        self.read = read
        self.every = every
        self.samples: deque[Sample] = deque(maxlen=history)
        self._sampled_at = -math.inf  # the monotonic time of the last sample
        self.events: deque[PresenceEvent] = deque(maxlen=recent)
        self.lateness_source = lateness
        self.on_event = self.events.append  # the bus's per-event call: one append, nothing more

    def sample(self, mono: float, wall: Callable[[], float]) -> None:
        """Keep a sample, stamped ``wall()``, if the last one is ``every`` seconds old on the monotonic clock
        ``mono`` (the monitor calls this often)."""
        if mono - self._sampled_at >= self.every:
            self._sampled_at = mono
            self.samples.append(self.read(wall()))

    def recent(self, after: int = 0) -> list[dict[str, Any]]:
        """The last events with a seq above ``after``, oldest first, as records."""
        return [event.record() for event in self.events if event.seq > after]

    def rate(self, seconds: float = 60.0) -> float | None:
        """Events per second over the last ``seconds`` (or over what is kept; None before two samples)."""
        samples = self.samples
        if len(samples) < 2:
            return None
        newest = samples[-1]
        oldest = next((s for s in samples if newest.wall - s.wall <= seconds), samples[0])
        if oldest is newest:
            oldest = samples[-2]
        return (newest.events - oldest.events) / max(newest.wall - oldest.wall, 1e-9)

    def lateness(self) -> dict[str, Any] | None:
        """The offline-lateness histogram and its percentiles (see the module docstring), or None."""
        source = self.lateness_source()
        return None if source is None else lateness_summary(*source)

    def live(self, after: int = 0, since: float | None = None) -> dict[str, Any]:
        """What the status page polls: events above seq ``after``, samples newer than ``since``, the rates and
        the lateness histogram (see the module docstring)."""
        events = list(takewhile(lambda e: e.seq > after, reversed(self.events)))[::-1]
        newer = self.samples if since is None else takewhile(lambda s: round(s.wall, 3) > since, reversed(self.samples))
        samples = list(newer) if since is None else list(newer)[::-1]
        return {
            "history": [sample.document() for sample in samples],
            "rates": {"events_per_second_1m": self.rate(60.0), "events_per_second_10s": self.rate(10.0)},
            "lateness": self.lateness(),
            "recent_events": [page_record(event) for event in events],
            "recent_limit": self.events.maxlen,
        }

    def document(self) -> dict[str, Any]:
        """Everything, as JSON-ready data: history, rates, lateness, the last events."""
        return {
            "history": [sample.document() for sample in self.samples],
            "rates": {"events_per_second_1m": self.rate(60.0), "events_per_second_10s": self.rate(10.0)},
            "lateness": self.lateness(),
            "recent_events": self.recent(),
        }


def page_record(event: PresenceEvent) -> dict[str, Any]:
    """An event's record for a browser: an int uid JavaScript would round is sent as a string."""
    record = event.record()
    uid = record["uid"]
    if isinstance(uid, int) and abs(uid) > EXACT_IN_JS:
        record["uid"] = str(uid)
    return record


def lateness_summary(bounds: list[float], cumulative: list[float], total: float) -> dict[str, Any]:
    """``bounds``: the buckets' upper bounds, ``+Inf`` last; ``cumulative``: the count at or below each;
    ``total``: the sum of all observations. Percentiles as bucket upper bounds (None: no observation)."""
    count = cumulative[-1] if cumulative else 0.0
    per_bucket = [int(c - (cumulative[i - 1] if i else 0.0)) for i, c in enumerate(cumulative)]
    percentiles: dict[str, float | None] = {}
    for q in QUANTILES:
        name = f"p{q * 100:g}".replace(".", "_")
        if not count:
            percentiles[name] = None
            continue
        rank = q * count
        bound = next(b for b, c in zip(bounds, cumulative) if c >= rank)
        percentiles[name] = None if math.isinf(bound) else bound
    return {
        "buckets": [{"le": None if math.isinf(b) else b, "count": n} for b, n in zip(bounds, per_bucket)],
        "count": int(count),
        "mean": total / count if count else None,
        **percentiles,
    }


def histogram_source(histogram: Any) -> Callable[[], tuple[list[float], list[float], float] | None]:
    """A ``lateness`` source reading a prometheus_client ``Histogram`` (unlabelled) at call time."""

    def read() -> tuple[list[float], list[float], float] | None:
        bounds: list[float] = []
        cumulative: list[float] = []
        total = 0.0
        for metric in histogram.collect():
            for s in metric.samples:
                if s.name.endswith("_bucket"):
                    bounds.append(float(s.labels["le"]))
                    cumulative.append(s.value)
                elif s.name.endswith("_sum"):
                    total = s.value
        return (bounds, cumulative, total) if bounds else None

    return read
