"""When to try a failed webhook request again, and when to give up on it. Pure: time and randomness are
arguments.

Theory of operation
-------------------
A batch is sent until a 2xx, at most ``max_attempts`` times (0: forever). After failure number n (1-based)
the runner sleeps `RetryPolicy.delay`:

* the receiver's ``Retry-After`` when it sent one with a 429 or 503 (seconds or an HTTP date, see
  `parse_retry_after`), capped at ``retry_after_cap`` so a receiver cannot park the hook for a day;
* otherwise **full jitter**: uniform(0, min(cap, base * 2^(n-1))) -- AWS's "exponential backoff and jitter";
  with 0.5 s base and 30 s cap, failures 1..7 wait on average 0.25, 0.5, 1, 2, 4, 8, 15 s, then 15 s each.
  Full jitter keeps many hooks cut off by one receiver outage from coming back in lockstep.

With the defaults (10 attempts) a batch is dead-lettered after ~9 failures' sleeps: ~75 s on average,
at most ~2.5 min, plus the requests' own timeouts.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RetryPolicy", "parse_retry_after"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base: float = 0.5
    cap: float = 30.0
    max_attempts: int = 10  # 0: retry forever, never dead-letter
    retry_after_cap: float = 60.0

    def __post_init__(self) -> None:
        if not (0 < self.base <= self.cap and math.isfinite(self.cap)):
            raise ValueError("backoff base must be positive and at most the cap")
        if self.max_attempts < 0:
            raise ValueError("max_attempts must be >= 0 (0: forever)")
        if not 0 <= self.retry_after_cap < math.inf:
            raise ValueError("retry_after_cap must be >= 0")

    def exhausted(self, failures: int) -> bool:
        """Whether ``failures`` failed attempts are all a batch gets."""
        return self.max_attempts > 0 and failures >= self.max_attempts

    def delay(self, failures: int, random: Callable[[], float], retry_after: float | None = None) -> float:
        """Seconds to wait after failure number ``failures`` (>= 1); ``random()`` returns [0, 1)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.retry_after_cap)
        ceiling = min(self.cap, self.base * 2.0 ** min(failures - 1, 62))
        return random() * ceiling


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
