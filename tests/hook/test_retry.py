"""The retry policy: full jitter under a doubling, capped ceiling; Retry-After capped; when to give up."""

from __future__ import annotations

import pytest

from idled.hook.retry import RetryPolicy, parse_retry_after


def test_full_jitter_ceiling_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(base=0.5, cap=30.0)
    assert [policy.delay(n, lambda: 0.999999) for n in range(1, 9)] == pytest.approx(
        [0.5, 1, 2, 4, 8, 16, 30, 30], rel=1e-5)
    assert policy.delay(3, lambda: 0.0) == 0.0
    assert policy.delay(10_000, lambda: 0.5) == 15.0  # no overflow however many failures


def test_retry_after_wins_and_is_capped() -> None:
    policy = RetryPolicy(retry_after_cap=60.0)
    assert policy.delay(1, lambda: 0.5, retry_after=7.0) == 7.0
    assert policy.delay(1, lambda: 0.5, retry_after=86_400.0) == 60.0
    assert policy.delay(1, lambda: 0.5, retry_after=-3.0) == 0.0


def test_exhausted_after_max_attempts_and_never_with_zero() -> None:
    assert not RetryPolicy(max_attempts=3).exhausted(2)
    assert RetryPolicy(max_attempts=3).exhausted(3)
    assert not RetryPolicy(max_attempts=0).exhausted(10**6)


@pytest.mark.parametrize("kwargs", [{"base": 0}, {"base": 2, "cap": 1}, {"max_attempts": -1},
                                    {"retry_after_cap": -1}])
def test_bad_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_retry_after_as_seconds_or_http_date() -> None:
    now = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now) == 30.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now) == 0.0
    assert parse_retry_after(None, now) is None
    assert parse_retry_after("soon", now) is None
