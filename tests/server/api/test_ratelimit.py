from __future__ import annotations

import pytest

from idled.server.api.ratelimit import RateLimiter


def test_burst_then_rate() -> None:
    limiter = RateLimiter(2.0, 2)
    assert limiter.take("a", 0.0) == 0.0
    assert limiter.take("a", 0.0) == 0.0
    assert limiter.take("a", 0.0) == pytest.approx(0.5)
    assert limiter.take("b", 0.0) == 0.0  # buckets are per key
    assert limiter.take("a", 0.5) == 0.0
    assert limiter.take("a", 0.5) > 0


def test_refill_is_capped_at_burst() -> None:
    limiter = RateLimiter(1.0, 3)
    for _ in range(3):
        assert limiter.take("a", 0.0) == 0.0
    # a long silence refills to burst, never beyond
    assert [limiter.take("a", 1000.0) for _ in range(4)][-1] > 0


def test_full_map_drops_refilled_buckets_and_refuses_when_none() -> None:
    limiter = RateLimiter(1.0, 1, max_keys=2)
    assert limiter.take("a", 0.0) == 0.0
    assert limiter.take("b", 0.0) == 0.0
    assert limiter.take("c", 0.0) > 0  # no bucket has refilled: a new key waits
    assert len(limiter) == 2
    assert limiter.take("c", 2.0) == 0.0  # a and b are full again: dropped
    assert len(limiter) == 1


def test_a_refused_key_does_not_grow_the_map() -> None:
    limiter = RateLimiter(1.0, 1, max_keys=1)
    limiter.take("a", 0.0)
    for i in range(100):
        assert limiter.take(i, 0.1) > 0
    assert len(limiter) == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        RateLimiter(0, 1)
    with pytest.raises(ValueError):
        RateLimiter(1, 0)
