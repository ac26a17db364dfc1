"""The election's one exception hierarchy.

Every failure the election reports is an `ElectionError` with a machine-readable ``code``:

* ``not_leader`` (`NotLeader`): this process does not hold leadership now -- checked locally, against the
  lease deadline, before anything is sent to etcd;
* ``fenced`` (`NotLeader`): etcd refused a write conditioned on our leader key: another process holds it
  now (or nobody does), whatever our local state still said;
* ``unavailable`` (`EtcdUnavailable`): no answer from etcd within the request timeout (refused, reset,
  timed out);
* ``etcd_error`` (`EtcdError`): etcd answered, with an error (or with something that is not its JSON).

A malformed ``--election`` URL or inconsistent timings are `ElectionConfigError` (a ``ValueError``: the
operator's mistake, reported before anything starts).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ElectionError", "NotLeader", "EtcdUnavailable", "EtcdError", "ElectionConfigError",
    "NOT_LEADER", "FENCED", "UNAVAILABLE", "ETCD_ERROR",
]

NOT_LEADER: Final = "not_leader"
FENCED: Final = "fenced"
UNAVAILABLE: Final = "unavailable"
ETCD_ERROR: Final = "etcd_error"


class ElectionError(Exception):
    """Base of every election failure. ``code``: one of the codes above; ``reason``: text for the log."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class NotLeader(ElectionError):
    """A leader-only operation refused: ``not_leader`` (local lease check) or ``fenced`` (etcd said no)."""


class EtcdUnavailable(ElectionError):
    """No answer from etcd in time."""

    def __init__(self, reason: str) -> None:
        super().__init__(UNAVAILABLE, reason)


class EtcdError(ElectionError):
    """etcd answered with an error, or with something we cannot read."""

    def __init__(self, reason: str) -> None:
        super().__init__(ETCD_ERROR, reason)


class ElectionConfigError(ValueError):
    """A malformed election URL or inconsistent election timings (``what``: which setting)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason
