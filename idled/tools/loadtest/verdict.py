"""The settled load-test run (`Verdict`), and whose fault a pinger's offline was (`classify_offline`).

Theory of operation
-------------------
A *pinger* is a session the generator meant to keep alive. If the server reports one offline, either the
server was wrong (a **false offline**: the worst failure there is) or the generator itself did not send in
time (**generator late**: its own lag -- an overloaded client -- measured as if it were the server's). The
two are told apart by the client's own send times: when the server closes a pinger, the worker reports the
wall times of the session's last two sends, read just before the ``send()`` that put each frame in the
socket (two suffice: the close arrives within milliseconds of the event, so at most one send can follow
the event). With timeout T, tolerance e (clock granularity) and bound B (T + 2 ticks), an offline at ts is:

* **generator late** if ``ts >= L + T - e``, L the latest send at or before ts: nothing was sent within T
  before the event, so the server was right;
* also **generator late** if the gap before L exceeded T (``L - P > T``, P the send before L) and the event
  came where that gap entitled the server to fire it: ``P + T - e <= ts <= P + B``. That is a keepalive sent
  after the deadline but before the server's tick: the server may expire the session at that tick;
* otherwise a **false offline**: the client had sent within T of the event.

Worked by hand, T = 30, e = 0.005, B = 32: sends at 100 and 118, offline at 140 -> L = 118, 140 < 148 - e:
false. Sends at 100 and 131 (a ping 31 s after the previous), offline at 130.4 -> L = 100 (131 is after the
event), 130.4 >= 130 - e: late. Offline at 131.2 -> L = 131, 131.2 < 161; but 131 - 100 > 30 and
130 <= 131.2 <= 132: late. An offline with no close record at all (the worker never saw the server close
the session) is counted as false: the server is blamed unless the client's own record clears it.

`Verdict` holds every count of a judged run; `ok` is the server's correctness only (no false, missed,
early or duplicate offlines, no unreported or missing sessions). Generator-late sessions not planned by
``--late-fraction`` do not make the server wrong, but they make the run's figures untrustworthy: the result
carries them as a target of their own, so such a run is FAILED with that reason, never quietly OK.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from idled.tools.loadtest.histogram import Histogram

__all__ = ["FALSE", "LATE_SEND", "classify_offline", "Verdict", "Tally"]

FALSE: Final = "false"  # the server's fault
LATE_SEND: Final = "late"  # the generator did not send within the timeout


def classify_offline(ts: float, sends: tuple[float, float], *, timeout: float, tolerance: float,
                     bound: float) -> str:
    """FALSE or LATE_SEND for a pinger's offline at `ts`, given its last two send times (any order)."""
    prev, last = (sends[0], sends[1]) if sends[0] <= sends[1] else (sends[1], sends[0])
    if last <= ts:
        latest, before = last, prev
    elif prev <= ts:
        latest, before = prev, None  # the last send came after the event (before the close reached us)
    else:
        return FALSE  # both sends after the event: the client was busy sending, no case against it
    if ts >= latest + timeout - tolerance:
        return LATE_SEND
    if (before is not None and latest - before > timeout
            and before + timeout - tolerance <= ts <= before + bound):
        return LATE_SEND
    return FALSE


@dataclass(frozen=True, slots=True)
class Verdict:
    """The settled run. Every count is of sessions -- with devices, of users (uids) but `sessions` and
    `failed_logins` (connections); `ok` is the server's correctness."""

    sessions: int
    planned: Mapping[str, int]
    failed_logins: int
    online_events: int
    online_missing: int  # logged in, yet no online event seen
    online_duplicates: int
    offline_events: int
    false_offlines: int  # the server's fault: see the module docstring (and silent / bye before they stopped)
    false_offline_reasons: Mapping[str, int]
    false_offline_examples: tuple[Mapping[str, Any], ...]
    no_close_record: int  # of the false offlines: pingers whose close the worker never reported
    generator_late: int  # pingers offline because the generator itself did not send in time (unplanned)
    generator_late_examples: tuple[Mapping[str, Any], ...]
    late_planned: int  # --late-fraction sessions that delayed a keepalive
    late_expected: int  # ... by more than the timeout allows: an offline is owed
    late_offlines: int  # ... offline, and rightly so (the delayed keepalive was past the timeout)
    late_missed: int  # owed an offline by last_sent + bound and did not get it
    early_offlines: int  # silent sessions reported offline before last_sent + timeout (or their own deadline)
    missed_offlines: int  # silent sessions not reported offline by last_sent + timeout + bound
    missed_never: int
    missed_late: int
    unjudged_silent: int  # bound falls after the cutoff (the run ended first)
    unreported: int  # planned silent / bye, logged in, yet the worker never said it stopped
    silent_wrong_reason: Mapping[str, int]
    logouts_seen: int
    missed_logouts: int
    logout_wrong_reason: Mapping[str, int]
    duplicate_offlines: int
    foreign_events: int  # events for uids outside this run
    timeout: float
    tick: float
    bound: float
    lateness_generator: Histogram = field(repr=False)
    lateness_server: Histogram = field(repr=False)
    # server's deadline minus the generator's (last_sent + timeout): how much later than we sent it the
    # server took the last frame to have arrived (loopback, its read queue, its clock)
    deadline_shift: Histogram = field(repr=False)
    devices: int = 1  # connections per user (--devices): `sessions` counts connections, `users` uids
    users: int = 0

    @property
    def ok(self) -> bool:
        """Every event the server emitted was right, and every one it owed was emitted."""
        return (self.false_offlines == 0 and self.missed_offlines == 0 and self.early_offlines == 0
                and self.missed_logouts == 0 and self.duplicate_offlines == 0 and self.unreported == 0
                and self.online_missing == 0 and self.late_missed == 0)

    def to_dict(self) -> dict[str, Any]:
        skip = {"lateness_generator", "lateness_server", "deadline_shift"}
        out: dict[str, Any] = {"ok": self.ok}
        for name in self.__dataclass_fields__:
            if name in skip:
                continue
            value = getattr(self, name)
            if isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = [dict(e) for e in value]
            out[name] = value
        return out


@dataclass(slots=True)
class Tally:
    """What `Matcher.judge` accumulates while it settles the sessions one by one."""

    timeout: float
    tick: float
    bound: float
    cutoff: float
    tolerance: float
    false_reasons: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    late_examples: list[dict[str, Any]] = field(default_factory=list)
    gen: Histogram = field(default_factory=Histogram)
    srv: Histogram = field(default_factory=Histogram)
    shift: Histogram = field(default_factory=Histogram)
    false: int = 0
    no_close_record: int = 0
    generator_late: int = 0
    late_offlines: int = 0
    late_planned: int = 0
    late_expected: int = 0
    late_missed: int = 0
    early: int = 0
    missed_never: int = 0
    missed_late: int = 0
    unjudged: int = 0
    unreported: int = 0
    logouts: int = 0
    missed_logouts: int = 0
    silent_wrong: Counter[str] = field(default_factory=Counter)
    logout_wrong: Counter[str] = field(default_factory=Counter)

    MAX_EXAMPLES: ClassVar[int] = 20

    def false_offline(self, reason: str, example: dict[str, Any] | None) -> None:
        self.false += 1
        self.false_reasons[reason] += 1
        if example is not None and len(self.examples) < self.MAX_EXAMPLES:
            self.examples.append(example)
