"""When to try a failed webhook request again, and when to give up on it. Pure: time and randomness are
arguments.

Theory of operation
-------------------
A batch is sent until a 2xx. It is dead-lettered only when its failures have lasted ``retry_for`` seconds
(24 h by default: the about-a-day of the Standard Webhooks recommendation) or, if set, after ``max_attempts``
failures (0, the default: no count limit); both 0 retries for ever. After failure number n (1-based) the
runner sleeps `RetryPolicy.delay`:

* the receiver's ``Retry-After`` when it sent one with a 429 or 503 (seconds or an HTTP date, see
  `parse_retry_after`), capped at ``retry_after_cap`` so a receiver cannot park the hook for a day;
* otherwise **full jitter**: uniform(0, min(cap, base * 2^(n-1))) -- AWS's "exponential backoff and jitter";
  with 0.5 s base and a 60 s cap, failures 1..8 wait on average 0.25, 0.5, 1, 2, 4, 8, 16, 30 s, then 30 s
  each. Full jitter keeps many hooks cut off by one receiver outage from coming back in lockstep.

Why a short cap and a long budget, not the Standard Webhooks schedule (5 s, 5 min, 30 min, 2 h, 5 h, 10 h,
10 h): there each message is retried on its own while the others flow; here a batch holds back every event
behind it (first deliveries stay in seq order), so the gap between two attempts is how long a receiver that
came back still waits for its events. With a 60 s cap it waits at most a minute (30 s on average), at the
cost of one request every ~30 s while it is down: ~120 in an hour's outage, ~2,900 in a day. An hour's
outage dead-letters nothing; `schedule` lists the attempts a policy makes (pure, for tests and the docs).
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

__all__ = ["RetryPolicy", "parse_retry_after", "DEFAULT_RETRY_FOR"]

DEFAULT_RETRY_FOR: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base: float = 0.5
    cap: float = 60.0
    max_attempts: int = 0  # 0: no count limit
    retry_after_cap: float = 60.0
    retry_for: float = DEFAULT_RETRY_FOR  # seconds of failures before a dead letter; 0: no time limit

    def __post_init__(self) -> None:
        if not (0 < self.base <= self.cap and math.isfinite(self.cap)):
            raise ValueError("backoff base must be positive and at most the cap")
        if self.max_attempts < 0:
            raise ValueError("max_attempts must be >= 0 (0: no limit)")
        if not 0 <= self.retry_after_cap < math.inf:
            raise ValueError("retry_after_cap must be >= 0")
        if not 0 <= self.retry_for < math.inf:
            raise ValueError("retry_for must be >= 0 seconds (0: no limit)")

    def exhausted(self, failures: int, elapsed: float = 0.0) -> bool:
        """Whether a batch that failed ``failures`` times, the first attempt ``elapsed`` seconds ago, is given up."""
        return ((self.max_attempts > 0 and failures >= self.max_attempts)
                or (self.retry_for > 0 and elapsed >= self.retry_for))

    def delay(self, failures: int, random: Callable[[], float], retry_after: float | None = None) -> float:
        """Seconds to wait after failure number ``failures`` (>= 1); ``random()`` returns [0, 1)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.retry_after_cap)
        ceiling = min(self.cap, self.base * 2.0 ** min(failures - 1, 62))
        return random() * ceiling

    def schedule(self, random: Callable[[], float], limit: int = 1_000_000) -> Iterator[float]:
        """When each attempt starts, in seconds after the first (0.0), against a receiver that always fails and
        answers at once; ends with the last attempt before the dead letter (or after ``limit`` attempts)."""
        at, failures = 0.0, 0
        while failures < limit:
            yield at
            failures += 1
            if self.exhausted(failures, at):
                return
            at += self.delay(failures, random)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header as seconds from ``now`` (wall unix seconds): delta-seconds or an HTTP date.
    None when absent or unreadable (the backoff applies)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(min(int(text), 10**9))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)
