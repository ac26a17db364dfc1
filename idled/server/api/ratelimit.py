"""A token bucket per client: pure, time passed in.

Theory of operation
-------------------
Each key (a client address, or a token's name) has a bucket of at most ``burst`` tokens that refills at
``rate`` tokens a second; a request takes one token. A bucket is two floats, ``(tokens, at)``: the tokens it
held at time ``at``; it is refilled lazily, when its key asks again (``take``), never by a timer::

    rate 2/s, burst 2; t=0: take -> 1 left; take -> 0 left; take -> refused, retry after 0.5 s
    t=0.5: refilled to 1 -> take -> 0 left

A full bucket is the same as no bucket, so the map is bounded (``max_keys``): when it is full, buckets that
have refilled completely are dropped; if none has, the new key is refused for as long as the oldest bucket
needs to refill (so a flood of addresses cannot grow memory, nor reset anyone's bucket).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

__all__ = ["DEFAULT_MAX_KEYS", "RateLimiter"]

DEFAULT_MAX_KEYS: Final = 100_000  # buckets kept at once (two floats and a key each: ~10 MB at worst)


class RateLimiter:
    """``take(key, now)``: 0.0 if ``key`` may make a request at ``now`` (seconds, any monotonic clock), else the
    seconds until it may."""

    __slots__ = ("rate", "burst", "max_keys", "buckets", "_no_prune_before")

    def __init__(self, rate: float, burst: int, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if not rate > 0 or burst < 1 or max_keys < 1:
            raise ValueError("need rate > 0, burst >= 1, max_keys >= 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self.max_keys = max_keys
        self.buckets: dict[Hashable, tuple[float, float]] = {}
        self._no_prune_before = -float("inf")  # a prune that freed nothing is not tried again before then

    def take(self, key: Hashable, now: float) -> float:
        bucket = self.buckets.get(key)
        if bucket is None:
            if len(self.buckets) >= self.max_keys and not self._prune(now):
                return self._oldest_refill(now)
            tokens = self.burst
        else:
            tokens, at = bucket
            tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate)
        if tokens < 1.0:
            self.buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self.buckets[key] = (tokens - 1.0, now)
        return 0.0

    def _prune(self, now: float) -> bool:
        """Drop the buckets that are full again (they mean nothing); True if any was. A scan that finds none is
        not repeated before the oldest bucket could be full: a flood of new keys costs one scan, not one each."""
        if now < self._no_prune_before:
            return False
        full = [key for key, (tokens, at) in self.buckets.items() if tokens + (now - at) * self.rate >= self.burst]
        for key in full:
            del self.buckets[key]
        if not full:
            self._no_prune_before = now + self._oldest_refill(now)
        return bool(full)

    def _oldest_refill(self, now: float) -> float:
        tokens, at = next(iter(self.buckets.values()))
        return max((self.burst - tokens) / self.rate - (now - at), 1.0 / self.rate)

    def __len__(self) -> int:
        return len(self.buckets)
