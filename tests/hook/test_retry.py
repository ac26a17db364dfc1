"""The retry policy: full jitter under a doubling, capped ceiling; Retry-After capped; when to give up (a day
of failures by default); the whole schedule as a pure function."""

from __future__ import annotations

import pytest

from idled.hook.retry import RetryPolicy, parse_retry_after


def test_full_jitter_ceiling_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(base=0.5, cap=30.0)
    assert [policy.delay(n, lambda: 0.999999) for n in range(1, 9)] == pytest.approx(
        [0.5, 1, 2, 4, 8, 16, 30, 30], rel=1e-5)
    assert policy.delay(3, lambda: 0.0) == 0.0
    assert policy.delay(10_000, lambda: 0.5) == 15.0  # no overflow however many failures


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


@pytest.mark.parametrize("draw", [0.999999, 0.5, 0.01])
def test_the_default_schedule_outlives_an_hour_and_gives_up_after_a_day(draw: float) -> None:
    policy = RetryPolicy()
    times = list(policy.schedule(lambda: draw))
    assert times[0] == 0.0 and max(gaps(times)) <= 60.0  # a receiver that comes back waits a minute at most
    assert 86_400.0 <= times[-1] < 86_400.0 + 60.0  # the dead letter comes after a day of failures, not before
    assert not any(policy.exhausted(n, at) for n, at in enumerate(times[:-1], 1))
    assert policy.exhausted(len(times), times[-1])
    within_an_hour = [at for at in times if at <= 3600.0]
    if draw > 0.1:  # with every draw near 0 the hook retries often (full jitter), still never dead-letters
        assert len(within_an_hour) <= 3600 / (60 * draw) + 9  # ~one request per cap*draw seconds: no hammering


def test_the_schedule_with_the_old_defaults_dead_lettered_within_two_minutes() -> None:
    old = RetryPolicy(cap=30.0, max_attempts=10, retry_for=0)
    times = list(old.schedule(lambda: 0.999999))
    assert len(times) == 10 and times[-1] < 150.0  # what the issue saw: an outage of a minute or two loses a batch


def test_both_limits_zero_is_forever_and_either_limit_ends_it() -> None:
    forever = RetryPolicy(max_attempts=0, retry_for=0)
    assert len(list(forever.schedule(lambda: 0.5, limit=5000))) == 5000
    assert not forever.exhausted(10**6, 10.0**9)
    assert RetryPolicy(max_attempts=3).exhausted(3, 1.0)
    assert RetryPolicy(retry_for=100.0).exhausted(1, 100.0)
    assert not RetryPolicy(retry_for=100.0).exhausted(1000, 99.9)


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
                                    {"retry_after_cap": -1}, {"retry_for": -1}, {"retry_for": float("inf")}])
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
