"""Pure statistics for `idled loadtest`: the session plan and event matching (the histogram: `histogram`).

Theory of operation
-------------------
No sockets, no clocks: every time is passed in as wall-clock unix seconds, so all of this is tested with
plain numbers.

**Plan.** Which sessions go silent and which log out is fixed before the run from a seed: exactly
``round(n * fraction)`` sessions of each kind, chosen without replacement, each with a moment drawn
uniformly from the *silent window*. The window starts when the ramp is done and ends early enough that a
session silent at its very end must be reported offline, even two ticks late, before the measurement ends:
``window_end = duration - timeout - bound_ticks * tick - margin``. Everyone else is a pinger.

**Matching.** The coordinator feeds a `Matcher` three streams in any order -- the plan, what the workers did
(`silent(idx, last_sent)`: the wall time the session's last frame was sent before it fell silent;
`bye(idx, sent)`; `failed(idx)`: never logged in) and the observer's events -- and `judge()` settles the
run afterwards. Storage is per kind: one byte per session counts online events, but offline events are kept
in full only for planned silent / bye sessions (bounded by the plan); an offline for a pinger is a *false
offline* (counted, first few kept as examples), whatever its reason, because the generator never stopped
it. For a silent session with last frame sent at ``L``, timeout ``T`` and tick ``k``:

* generator lateness = ``event.ts - (L + T)`` and server lateness = ``event.ts - event.deadline``, both
  recorded in histograms (negative values are clamped to 0 in the buckets but kept exactly as the minimum);
* ``event.deadline - (L + T)``, the *deadline shift*, is how much later than sent the server took the last
  frame to have arrived: loopback latency plus time in its read queue (its own histogram);
* an offline before ``L + T - tolerance`` (or before the server's own deadline) is an *early offline*;
* no offline at or before ``L + T + bound_ticks * k`` is a *missed offline* -- whether one came later
  (`missed_late`) or never (`missed_never`); a session whose bound falls after the cutoff is *unjudged*.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from idled.tools.loadtest.histogram import Histogram

__all__ = [
    "PINGER", "SILENT", "BYE", "IDLE_REASONS", "LOGOUT_REASONS",
    "Plan", "silent_window", "make_plan", "Matcher", "Verdict",
]

# ------------------------------------------------------------------------------------------------ plan

PINGER: Final = 0
SILENT: Final = 1
BYE: Final = 2

# Offline reasons that mean "timed out" and "logged out"; the server names them, other spellings are
# accepted so a rename on the server side shows up as figures, not as a crash here.
IDLE_REASONS: Final = frozenset({"idle", "timeout", "idle_timeout", "expired"})
LOGOUT_REASONS: Final = frozenset({"logout", "bye", "detach", "detached"})


def silent_window(*, duration: float, ramp_end: float, timeout: float, tick: float, bound_ticks: float = 2.0,
                  margin: float | None = None) -> tuple[float, float]:
    """[start, end] (seconds after the start of the run) for silent / bye moments; ValueError if empty.

    A session silent at `end` has its deadline at most `end + timeout` and must be reported by
    `end + timeout + bound_ticks * tick`; `margin` (default 0.5 s + one tick) leaves room for the event to
    travel to the observer before the measurement stops at `duration`.
    """
    if margin is None:
        margin = 0.5 + tick
    start = ramp_end
    end = duration - timeout - bound_ticks * tick - margin
    if end <= start:
        need = ramp_end + timeout + bound_ticks * tick + margin
        raise ValueError(f"the run is too short for silent sessions: --duration must exceed {need:.1f} s "
                         f"(ramp {ramp_end:.1f} s + timeout {timeout:g} s + {bound_ticks:g} ticks + {margin:.1f} s margin)")
    return start, end


@dataclass(frozen=True, slots=True)
class Plan:
    """Session i is a pinger unless `special[i] = (kind, moment)`, moment in seconds after the run start."""

    sessions: int
    special: Mapping[int, tuple[int, float]]
    window: tuple[float, float]

    def kind(self, index: int) -> int:
        entry = self.special.get(index)
        return PINGER if entry is None else entry[0]

    def counts(self) -> dict[str, int]:
        c = Counter(kind for kind, _ in self.special.values())
        return {"pinger": self.sessions - len(self.special), "silent": c[SILENT], "bye": c[BYE]}

    def split(self, owner: Callable[[int], int], parts: int) -> list[dict[int, tuple[int, float]]]:
        """The special entries per part (worker), `owner(i)` naming the part of session i."""
        out: list[dict[int, tuple[int, float]]] = [{} for _ in range(parts)]
        for index, entry in self.special.items():
            out[owner(index)][index] = entry
        return out


def make_plan(sessions: int, *, silent_fraction: float, bye_fraction: float, window: tuple[float, float],
              seed: int) -> Plan:
    """Choose exactly round(n*fraction) silent and bye sessions, each with a moment uniform in `window`."""
    if sessions < 0:
        raise ValueError("sessions must be >= 0")
    if not (0.0 <= silent_fraction <= 1.0 and 0.0 <= bye_fraction <= 1.0 and silent_fraction + bye_fraction <= 1.0):
        raise ValueError("silent and bye fractions must be in [0, 1] and sum to at most 1")
    n_silent = round(sessions * silent_fraction)
    n_bye = min(sessions - n_silent, round(sessions * bye_fraction))
    rng = random.Random(seed)
    chosen = rng.sample(range(sessions), n_silent + n_bye)
    lo, hi = window
    special: dict[int, tuple[int, float]] = {}
    for k, index in enumerate(chosen):
        special[index] = (SILENT if k < n_silent else BYE, rng.uniform(lo, hi))
    return Plan(sessions, special, window)


# -------------------------------------------------------------------------------------------- matching


@dataclass(frozen=True, slots=True)
class Verdict:
    """The settled run. Every count is of sessions; `ok` is what a test or CI asserts."""

    sessions: int
    planned: Mapping[str, int]
    failed_logins: int
    online_events: int
    online_missing: int  # logged in, yet no online event seen
    online_duplicates: int
    offline_events: int
    false_offlines: int  # pingers reported offline, and silent / bye sessions reported offline before they stopped
    false_offline_reasons: Mapping[str, int]
    false_offline_examples: tuple[Mapping[str, Any], ...]
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

    @property
    def ok(self) -> bool:
        """Every event the server emitted was right, and every one it owed was emitted."""
        return (self.false_offlines == 0 and self.missed_offlines == 0 and self.early_offlines == 0
                and self.missed_logouts == 0 and self.duplicate_offlines == 0 and self.unreported == 0
                and self.online_missing == 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "sessions": self.sessions,
            "planned": dict(self.planned),
            "failed_logins": self.failed_logins,
            "online_events": self.online_events,
            "online_missing": self.online_missing,
            "online_duplicates": self.online_duplicates,
            "offline_events": self.offline_events,
            "false_offlines": self.false_offlines,
            "false_offline_reasons": dict(self.false_offline_reasons),
            "false_offline_examples": [dict(e) for e in self.false_offline_examples],
            "early_offlines": self.early_offlines,
            "missed_offlines": self.missed_offlines,
            "missed_never": self.missed_never,
            "missed_late": self.missed_late,
            "unjudged_silent": self.unjudged_silent,
            "unreported": self.unreported,
            "silent_wrong_reason": dict(self.silent_wrong_reason),
            "logouts_seen": self.logouts_seen,
            "missed_logouts": self.missed_logouts,
            "logout_wrong_reason": dict(self.logout_wrong_reason),
            "duplicate_offlines": self.duplicate_offlines,
            "foreign_events": self.foreign_events,
            "timeout": self.timeout,
            "tick": self.tick,
            "bound": self.bound,
        }


class Matcher:
    """Matches presence events to what the generator did. Feed in any order; `judge()` at the end.

    Session `i` has uid `uid_base + i` (an int). Events for any other uid are counted as foreign.
    """

    MAX_EXAMPLES: Final = 20

    def __init__(self, plan: Plan, uid_base: int = 0, t0_wall: float = 0.0) -> None:
        self.plan = plan
        self.uid_base = uid_base
        self.t0_wall = t0_wall  # wall time of the plan's moment 0 (to convert planned moments)
        n = plan.sessions
        self._online = bytearray(n)  # online events per session, saturating at 255
        self._failed: set[int] = set()
        self._silent_sent: dict[int, float] = {}
        self._bye_sent: dict[int, float] = {}
        # first offline of each planned silent / bye session: (ts, reason, deadline)
        self._special_offline: dict[int, tuple[float, str, float]] = {}
        self._pinger_offlines = 0
        self._pinger_offline_seen = bytearray(n)  # to count sessions, not events
        self._false_reasons: Counter[str] = Counter()
        self._examples: list[dict[str, Any]] = []
        self.online_events = 0
        self.offline_events = 0
        self.duplicate_offlines = 0
        self.foreign_events = 0
        self.first_timeout: float | None = None  # deadline - last_seen of the first online event of ours

    # -- what the generator did --

    def failed(self, index: int) -> None:
        self._failed.add(index)

    def silent(self, index: int, last_sent: float) -> None:
        self._silent_sent[index] = last_sent

    def bye(self, index: int, sent: float) -> None:
        self._bye_sent[index] = sent

    # -- what the server said --

    def event(self, kind: str, uid: object, ts: float, reason: str, deadline: float, last_seen: float) -> None:
        index = uid - self.uid_base if type(uid) is int else -1  # type: ignore[operator]
        if not 0 <= index < self.plan.sessions:
            self.foreign_events += 1
            return
        if kind == "online":
            self.online_events += 1
            if self._online[index] < 255:
                self._online[index] += 1
            if self.first_timeout is None:
                self.first_timeout = deadline - last_seen
            return
        self.offline_events += 1
        entry = self.plan.special.get(index)
        if entry is None:
            if self._pinger_offline_seen[index]:
                self.duplicate_offlines += 1
                return
            self._pinger_offline_seen[index] = 1
            self._pinger_offlines += 1
            self._false_reasons[reason] += 1
            if len(self._examples) < self.MAX_EXAMPLES:
                self._examples.append({"uid": uid, "kind": "pinger", "ts": ts, "reason": reason,
                                       "deadline": deadline, "last_seen": last_seen})
            return
        if index in self._special_offline:
            self.duplicate_offlines += 1
            return
        self._special_offline[index] = (ts, reason, deadline)

    # -- settling --

    def judge(self, *, timeout: float, tick: float, cutoff: float, bound_ticks: float = 2.0,
              early_tolerance: float = 0.005) -> Verdict:
        """Settle every session. `cutoff`: wall time up to which events were collected."""
        bound = timeout + bound_ticks * tick
        tally = _Tally(timeout=timeout, tick=tick, bound=bound, cutoff=cutoff, tolerance=early_tolerance,
                       false_reasons=Counter(self._false_reasons), examples=list(self._examples))
        for index, (kind, moment) in self.plan.special.items():
            if index in self._failed:
                continue
            if kind == SILENT:
                self._judge_silent(tally, index, moment)
            else:
                self._judge_bye(tally, index, moment)
        online = self._online
        failed = self._failed
        zeros = online.count(0)
        online_missing = zeros - sum(1 for i in failed if online[i] == 0)
        online_duplicates = len(online) - zeros - online.count(1)
        # A session whose login failed on our side may still have been logged in by the server (e.g. the
        # welcome came after our login timeout): its offline then is our doing, not a false offline.
        seen = self._pinger_offline_seen
        failed_pingers = [i for i in failed if seen[i]]
        pinger_false = self._pinger_offlines - len(failed_pingers)
        examples = tally.examples
        for i in failed_pingers:
            examples = [e for e in examples if e["uid"] != self.uid_base + i]
        return Verdict(
            sessions=self.plan.sessions, planned=self.plan.counts(), failed_logins=len(failed),
            online_events=self.online_events, online_missing=online_missing, online_duplicates=online_duplicates,
            offline_events=self.offline_events, false_offlines=pinger_false + tally.false_special,
            false_offline_reasons=dict(tally.false_reasons), false_offline_examples=tuple(examples),
            early_offlines=tally.early, missed_offlines=tally.missed_never + tally.missed_late,
            missed_never=tally.missed_never, missed_late=tally.missed_late, unjudged_silent=tally.unjudged,
            unreported=tally.unreported, silent_wrong_reason=dict(tally.silent_wrong),
            logouts_seen=tally.logouts, missed_logouts=tally.missed_logouts,
            logout_wrong_reason=dict(tally.logout_wrong), duplicate_offlines=self.duplicate_offlines,
            foreign_events=self.foreign_events, timeout=timeout, tick=tick, bound=bound,
            lateness_generator=tally.gen, lateness_server=tally.srv, deadline_shift=tally.shift,
        )

    def _false_special(self, t: _Tally, reason: str, example: dict[str, Any] | None) -> None:
        """A planned silent / bye session reported offline before it stopped: a false offline."""
        t.false_special += 1
        t.false_reasons[reason] += 1
        if example is not None and len(t.examples) < self.MAX_EXAMPLES:
            t.examples.append(example)

    def _judge_silent(self, t: _Tally, index: int, moment: float) -> None:
        off = self._special_offline.get(index)
        uid = self.uid_base + index
        last_sent = self._silent_sent.get(index)
        if last_sent is None:  # the worker never said it stopped
            if off is not None and off[0] < self.t0_wall + moment:  # offline while it was still pinging
                self._false_special(t, off[1], {"uid": uid, "kind": "silent", "ts": off[0], "reason": off[1],
                                                "planned_silent_at": self.t0_wall + moment})
            else:
                t.unreported += 1
            return
        limit = last_sent + t.bound
        if off is None:
            if limit > t.cutoff:
                t.unjudged += 1
            else:
                t.missed_never += 1
            return
        ts, reason, deadline = off
        if ts < last_sent - t.tolerance:  # reported offline before it even stopped pinging
            self._false_special(t, reason, {"uid": uid, "kind": "silent", "ts": ts, "reason": reason,
                                            "last_sent": last_sent})
            return
        if reason not in IDLE_REASONS:
            t.silent_wrong[reason] += 1
        lateness = ts - (last_sent + t.timeout)
        server_lateness = ts - deadline
        t.gen.record(lateness)
        t.srv.record(server_lateness)
        t.shift.record(deadline - (last_sent + t.timeout))
        if lateness < -t.tolerance or server_lateness < -0.001:
            t.early += 1
        elif ts > limit:
            t.missed_late += 1

    def _judge_bye(self, t: _Tally, index: int, moment: float) -> None:
        off = self._special_offline.get(index)
        sent = self._bye_sent.get(index)
        if sent is None:
            if off is not None and off[0] < self.t0_wall + moment:
                self._false_special(t, off[1], None)
            else:
                t.unreported += 1
            return
        if off is None:
            if sent + 1.0 + 2 * t.tick <= t.cutoff:
                t.missed_logouts += 1
            return
        ts, reason, _ = off
        if ts < sent - t.tolerance:
            self._false_special(t, reason, None)
            return
        t.logouts += 1
        if reason not in LOGOUT_REASONS:
            t.logout_wrong[reason] += 1


@dataclass(slots=True)
class _Tally:
    """What `Matcher.judge` accumulates while it settles the planned sessions one by one."""

    timeout: float
    tick: float
    bound: float
    cutoff: float
    tolerance: float
    false_reasons: Counter[str]
    examples: list[dict[str, Any]]
    gen: Histogram = field(default_factory=Histogram)
    srv: Histogram = field(default_factory=Histogram)
    shift: Histogram = field(default_factory=Histogram)
    early: int = 0
    missed_never: int = 0
    missed_late: int = 0
    unjudged: int = 0
    unreported: int = 0
    false_special: int = 0
    logouts: int = 0
    missed_logouts: int = 0
    silent_wrong: Counter[str] = field(default_factory=Counter)
    logout_wrong: Counter[str] = field(default_factory=Counter)
