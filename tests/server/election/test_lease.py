"""The lease arithmetic (``idled.server.election.lease``): deadlines from the request's start, and timings
that leave a healthy leader room to renew."""

from __future__ import annotations

import pytest

from idled.server.election import ElectionConfigError, Timings


def test_defaults_for_five_seconds() -> None:
    timings = Timings.of()
    assert timings.ttl == 5 and timings.margin == 1.0 and timings.request_timeout == 1.0
    assert timings.renew_interval == pytest.approx(5 / 3) and timings.retry_interval == 0.25


def test_the_worked_example_of_the_docstring() -> None:
    timings = Timings.of(5)
    assert timings.deadline(10.0, 5) == 14.0  # counted from the request's start, not its answer
    assert timings.deadline(10.0, 60) == 14.0  # etcd granting more than asked counts for nothing
    assert timings.deadline(10.0, 3) == 12.0  # ... less than asked is what etcd will honour


@pytest.mark.parametrize(("kwargs", "what"), [
    ({"ttl": 1}, "lease ttl"),
    ({"ttl": 2.5}, "lease ttl"),
    ({"ttl": True}, "lease ttl"),
    ({"ttl": 5, "margin": 0}, "lease margin"),
    ({"ttl": 5, "margin": 2.5}, "lease margin"),
    ({"ttl": 5, "request_timeout": 3}, "request timeout"),
    ({"ttl": 5, "retry_interval": 2}, "retry interval"),
    ({"ttl": 5, "renew_interval": 3.5}, "renew interval"),  # 3.5 + 1 >= 5 - 1: would lapse on a slow answer
])
def test_inconsistent_timings_are_refused(kwargs: dict[str, float], what: str) -> None:
    with pytest.raises(ElectionConfigError) as caught:
        Timings.of(**kwargs)  # type: ignore[arg-type]
    assert caught.value.what == what
