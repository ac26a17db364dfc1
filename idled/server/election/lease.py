"""Fencing by lease: the arithmetic, pure (times in, times out; no clock read here).

Theory of operation
-------------------
etcd expires a lease ``ttl`` seconds after it *processed* the last grant or keepalive, on its own clock. We
cannot know when that was, but we know it was after we *sent* the request. So a holder that started the
request at ``sent`` (its monotonic clock) knows the lease lives at least until ``sent + ttl`` -- if its
clock runs no faster than etcd's. It claims leadership only until

    deadline = sent + ttl - margin

and the margin covers (a) the clock-rate difference between this machine and etcd's leader over one ttl
(NTP keeps it under 500 ppm: 2.5 ms over 5 s), and (b) the time between a caller's ``is_leader(now)`` and
the effect it then has (a write landing): a caller must finish what it decided within the margin.

By hand, ttl 5 s, margin 1 s, renew every 5/3 s: a keepalive sent at t=10.0 and answered at 10.3 gives a
deadline of 14.0. The next keepalive starts at 11.67; if it is answered, the deadline moves to 15.67. If
etcd is unreachable, renewals are retried until 14.0, and at 14.0 the holder says "not leader" whether or
not any answer came. etcd frees the key no earlier than 15.0 (10.0 + ttl, processed after it was sent), so
the next leader cannot start before 15.0: a full margin after this one stopped. A process frozen (SIGSTOP,
VM pause) from 10.5 to 20.0 wakes with ``now`` = 20.0 > 14.0: its first ``is_leader`` is already false,
before it can act on a stale belief.

Timings must leave a healthy leader room to renew: the renew interval plus one request timeout must end
before the deadline of the renewal before, ``renew + timeout < ttl - margin``; else leadership would
lapse between two renewals on every slow answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from idled.server.election.errors import ElectionConfigError

__all__ = ["Timings", "MIN_TTL"]

# etcd refuses to expire a lease sooner than 1.5 election timeouts (1.5 s on its defaults) and silently
# grants more; below 2 s the margin and a request timeout leave no room anyway.
MIN_TTL: Final = 2


@dataclass(frozen=True, slots=True)
class Timings:
    """The lease's timings, in seconds. Defaults: ttl 5, margin ttl/5, renew every ttl/3, requests time
    out after ttl/5 (see `Timings.of`)."""

    ttl: int
    margin: float
    renew_interval: float
    request_timeout: float
    retry_interval: float  # between two attempts after a failed request

    @classmethod
    def of(cls, ttl: int = 5, *, margin: float | None = None, renew_interval: float | None = None,
           request_timeout: float | None = None, retry_interval: float | None = None) -> Timings:
        """Timings for ``ttl`` (whole seconds: etcd's unit), the others derived unless given; checked."""
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < MIN_TTL:
            raise ElectionConfigError("lease ttl", f"{ttl!r}: a whole number of seconds, at least {MIN_TTL}")
        margin = ttl / 5 if margin is None else margin
        renew = ttl / 3 if renew_interval is None else renew_interval
        timeout = ttl / 5 if request_timeout is None else request_timeout
        retry = min(0.25, timeout) if retry_interval is None else retry_interval
        timings = cls(ttl, margin, renew, timeout, retry)
        timings.check()
        return timings

    def check(self) -> None:
        if not 0 < self.margin < self.ttl / 2:
            raise ElectionConfigError("lease margin", f"{self.margin:g} s: more than 0, less than half the ttl")
        if not 0 < self.request_timeout < self.ttl / 2:
            raise ElectionConfigError("request timeout",
                                      f"{self.request_timeout:g} s: more than 0, less than half the ttl")
        if not 0 < self.retry_interval <= self.renew_interval:
            raise ElectionConfigError("retry interval",
                                      f"{self.retry_interval:g} s: more than 0, at most the renew interval")
        if not 0 < self.renew_interval or self.renew_interval + self.request_timeout >= self.ttl - self.margin:
            raise ElectionConfigError(
                "renew interval", f"{self.renew_interval:g} s + request timeout {self.request_timeout:g} s must end "
                f"before ttl - margin = {self.ttl - self.margin:g} s")

    def deadline(self, sent: float, granted_ttl: int) -> float:
        """Until when a lease granted or renewed by a request started at ``sent`` may be claimed. etcd may
        grant more than asked (its minimum), never less; the lesser of the two is counted."""
        return sent + min(self.ttl, granted_ttl) - self.margin
