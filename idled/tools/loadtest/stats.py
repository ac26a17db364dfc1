"""Pure statistics for `idled loadtest`: the session plan and event matching (the histogram: `histogram`).

Theory of operation
-------------------
No sockets, no clocks: every time is passed in as wall-clock unix seconds, so all of this is tested with
plain numbers.

**Devices** (``--devices K``). Session (connection) i is device ``i % K`` of user ``i // K`` (uid
``uid_base + i // K``, device ``"d<i % K>"``); events are user-level (an ``online`` when the user's first
device logs in, an ``offline`` when its last session ends), so everything below that is said of "a session"
is said of a *user* and its K connections. With K = 1 a user is a session and nothing changes.

**Plan.** Which sessions go silent and which log out is fixed before the run from a seed: exactly
``round(n * fraction)`` sessions of each kind, chosen without replacement, each with a moment drawn
uniformly from the *silent window*. With devices the kinds are drawn per user (all K devices of a silent
user go silent, of a bye user say bye), each device at a moment of its own: the first devices to stop leave
while another still pings (no event owed), the last one ends the user (an event owed). The window starts when the ramp is done and ends early enough that a
session silent at its very end must be reported offline, even two ticks late, before the measurement ends:
``window_end = duration - timeout - bound_ticks * tick - margin``. Everyone else is a pinger.

**Matching.** The coordinator feeds a `Matcher` four streams in any order -- the plan, what the workers did
(`silent(idx, last_sent)`: the wall time the session's last frame was sent before it fell silent;
`bye(idx, sent)`; `failed(idx)`: never logged in; `closed(idx, prev, last, at, how)`: a pinger the server
closed, with the wall times of its last two sends; `late(idx, last_sent, planned)`: a planned late session
delaying a keepalive) and the observer's events -- and `judge()` settles the run afterwards. Storage is per
kind: one byte per session counts online events; offline events are kept in full for planned sessions and
for pingers (a pinger's offline is judged at the end, against its close record:
`idled.tools.loadtest.verdict.classify_offline` tells a *false offline*, the server's fault, from the
generator's own lateness). For a silent session with last frame sent at ``L``, timeout ``T`` and tick ``k``:

* generator lateness = ``event.ts - (L + T)`` and server lateness = ``event.ts - event.deadline``, both
  recorded in histograms (negative values are clamped to 0 in the buckets but kept exactly as the minimum);
* ``event.deadline - (L + T)``, the *deadline shift*, is how much later than sent the server took the last
  frame to have arrived: loopback latency plus time in its read queue (its own histogram);
* with devices ``L`` is the latest of the user's devices' last sends: the user's offline is owed at the
  latest deadline among its devices, and one before it is early (or false, if a device had not even
  stopped yet);
* an offline before ``L + T - tolerance`` (or before the server's own deadline) is an *early offline*;
* no offline at or before ``L + T + bound_ticks * k`` is a *missed offline* -- whether one came later
  (`missed_late`) or never (`missed_never`); a session whose bound falls after the cutoff is *unjudged*.

A planned *late* session (``--late-fraction``) is a pinger that sends one keepalive ``late_by`` seconds late.
If the gap it planned (its delayed send minus the send before) exceeds ``T`` it owes an offline by ``L + T +
bound_ticks * k`` (else *late missed*), and that offline is judged like any pinger's -- by its send times --
so it comes out as generator late, counted apart as planned. A gap within ``T`` owes nothing: an offline
then is false, as for any pinger. (Late sessions are planned with one device per user only.)

A pinger user's offline is judged against every device's close record: it is generator late only if each
device's own sends say so (any device that sent within ``T`` makes it false). With devices the server can
also end one device's session with no event at all (the user stays online through the others); a pinger
device closed ``idle_timeout`` whose sends say it was not silent is counted as a false offline too (reason
``device:idle``), so a wrong device-level expiry cannot hide behind the user-level events.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from idled.tools.loadtest.verdict import FALSE, Tally, Verdict, classify_offline

__all__ = [
    "PINGER", "SILENT", "BYE", "LATE", "IDLE_REASONS", "LOGOUT_REASONS",
    "Plan", "silent_window", "make_plan", "Matcher", "Verdict",
]

# ------------------------------------------------------------------------------------------------ plan

PINGER: Final = 0
SILENT: Final = 1
BYE: Final = 2
LATE: Final = 3  # a pinger that sends one keepalive late (--late-fraction / --late-by)

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
    """Session i is a pinger unless `special[i] = (kind, moment)`, moment in seconds after the run start.
    Session i is device ``i % devices`` of user ``i // devices`` (every device of a user has the same kind)."""

    sessions: int
    special: Mapping[int, tuple[int, float]]
    window: tuple[float, float]
    devices: int = 1

    @property
    def users(self) -> int:
        return self.sessions // self.devices

    def kind(self, index: int) -> int:
        entry = self.special.get(index)
        return PINGER if entry is None else entry[0]

    def counts(self) -> dict[str, int]:
        """Planned users of each kind (with one device per user, sessions)."""
        k = self.devices
        c = Counter(kind for i, (kind, _) in self.special.items() if i % k == 0)
        return {"pinger": self.users - c[SILENT] - c[BYE], "silent": c[SILENT], "bye": c[BYE], "late": c[LATE]}

    def split(self, owner: Callable[[int], int], parts: int) -> list[dict[int, tuple[int, float]]]:
        """The special entries per part (worker), `owner(i)` naming the part of session i."""
        out: list[dict[int, tuple[int, float]]] = [{} for _ in range(parts)]
        for index, entry in self.special.items():
            out[owner(index)][index] = entry
        return out


def make_plan(sessions: int, *, silent_fraction: float, bye_fraction: float, window: tuple[float, float],
              seed: int, late_fraction: float = 0.0, devices: int = 1) -> Plan:
    """Choose exactly round(n*fraction) silent, bye and late sessions, each with a moment uniform in `window`
    (late sessions are pingers: the moment is when one of their keepalives goes late). With `devices` K > 1
    the n / K users are chosen (n a multiple of K), and each device of a chosen user gets its own moment;
    device 0's is the one the same seed gives with K = 1."""
    if sessions < 0:
        raise ValueError("sessions must be >= 0")
    if devices < 1 or sessions % devices:
        raise ValueError("devices must be >= 1 and divide the sessions")
    if devices > 1 and late_fraction:
        raise ValueError("late sessions are planned with one device per user only")
    users = sessions // devices
    if not (0.0 <= silent_fraction <= 1.0 and 0.0 <= bye_fraction <= 1.0 and silent_fraction + bye_fraction <= 1.0):
        raise ValueError("silent and bye fractions must be in [0, 1] and sum to at most 1")
    n_silent = round(users * silent_fraction)
    n_bye = min(users - n_silent, round(users * bye_fraction))
    if not 0.0 <= late_fraction <= 1.0:
        raise ValueError("the late fraction must be in [0, 1]")
    n_late = min(sessions - n_silent - n_bye, round(sessions * late_fraction))
    rng = random.Random(seed)
    chosen = rng.sample(range(users), n_silent + n_bye)
    lo, hi = window
    special: dict[int, tuple[int, float]] = {}
    for k, index in enumerate(chosen):
        special[index * devices] = (SILENT if k < n_silent else BYE, rng.uniform(lo, hi))
    if devices > 1:  # the other devices' moments (drawn after: device 0 keeps the moment K = 1 would give it)
        device_rng = random.Random(seed * 104729 + 2)
        for index in chosen:
            kind = special[index * devices][0]
            for d in range(1, devices):
                special[index * devices + d] = (kind, device_rng.uniform(lo, hi))
        return Plan(sessions, special, window, devices)
    if n_late:  # (drawn after the others: a plan without late sessions is the same as before they existed)
        late_rng = random.Random(seed * 7919 + 1)
        for index in late_rng.sample([i for i in range(sessions) if i not in special], n_late):
            special[index] = (LATE, late_rng.uniform(lo, hi))
    return Plan(sessions, special, window)


# -------------------------------------------------------------------------------------------- matching


class Matcher:
    """Matches presence events to what the generator did. Feed in any order; `judge()` at the end.

    Session `i` is device ``i % K`` of the user with uid ``uid_base + i // K`` (an int; K = `plan.devices`).
    Events for any other uid are counted as foreign. What the generator did is fed per session, what the
    server said per user; `judge()` settles per user (see the module docstring).
    """

    MAX_EXAMPLES: Final = 20

    def __init__(self, plan: Plan, uid_base: int = 0, t0_wall: float = 0.0) -> None:
        self.plan = plan
        self.uid_base = uid_base
        self.t0_wall = t0_wall  # wall time of the plan's moment 0 (to convert planned moments)
        self.devices = plan.devices
        self.users = plan.users
        self._online = bytearray(self.users)  # online events per user, saturating at 255
        self._failed: set[int] = set()  # sessions
        self._silent_sent: dict[int, float] = {}  # per session
        self._bye_sent: dict[int, float] = {}
        self._closed: dict[int, tuple[float, float, float, str]] = {}  # pinger closes: (prev, last, at, how)
        self._late: dict[int, tuple[float, float]] = {}  # planned late: (last sent, delayed send planned)
        # first offline of each planned silent / bye user: (ts, reason, deadline)
        self._special_offline: dict[int, tuple[float, str, float]] = {}
        # first offline of each pinger user (late sessions included): (ts, reason, deadline, last_seen)
        self._pinger_offline: dict[int, tuple[float, str, float, float]] = {}
        self.pinger_offlines = 0  # so far, before judging whose fault they were
        self.online_events = 0
        self.offline_events = 0
        self.duplicate_offlines = 0
        self.foreign_events = 0
        self.first_timeout: float | None = None  # deadline - last_seen of the first online event of ours

    # -- what the generator did (per session) --

    def failed(self, index: int) -> None:
        self._failed.add(index)

    def silent(self, index: int, last_sent: float) -> None:
        self._silent_sent[index] = last_sent

    def bye(self, index: int, sent: float) -> None:
        self._bye_sent[index] = sent

    def closed(self, index: int, sent_prev: float, sent_last: float, at: float, how: str) -> None:
        """The server closed pinger `index` at `at`; its last two sends were at `sent_prev`, `sent_last`."""
        self._closed[index] = (sent_prev, sent_last, at, how)

    def late(self, index: int, last_sent: float, planned: float) -> None:
        """Planned late session `index` last sent at `last_sent` and delays its next keepalive to `planned`."""
        self._late[index] = (last_sent, planned)

    # -- what the server said (per user) --

    def event(self, kind: str, uid: object, ts: float, reason: str, deadline: float, last_seen: float) -> None:
        index = uid - self.uid_base if type(uid) is int else -1
        if not 0 <= index < self.users:
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
        entry = self.plan.special.get(index * self.devices)
        if entry is None or entry[0] == LATE:
            if index in self._pinger_offline:
                self.duplicate_offlines += 1
                return
            self._pinger_offline[index] = (ts, reason, deadline, last_seen)
            self.pinger_offlines += 1
            return
        if index in self._special_offline:
            self.duplicate_offlines += 1
            return
        self._special_offline[index] = (ts, reason, deadline)

    # -- settling --

    def _sessions(self, user: int) -> range:
        """The sessions (connections) of `user`: its devices."""
        k = self.devices
        return range(user * k, user * k + k)

    def judge(self, *, timeout: float, tick: float, cutoff: float, bound_ticks: float = 2.0,
              early_tolerance: float = 0.005) -> Verdict:
        """Settle every user. `cutoff`: wall time up to which events were collected."""
        bound = timeout + bound_ticks * tick
        t = Tally(timeout=timeout, tick=tick, bound=bound, cutoff=cutoff, tolerance=early_tolerance)
        failed = self._failed
        k = self.devices
        # A session whose login failed on our side may still have been logged in by the server (e.g. the
        # welcome came after our login timeout): its offline then is our doing, not a false offline. With
        # devices, a user any of whose devices failed is not judged (what the server owed it is unknown).
        failed_users = {i // k for i in failed}
        for index, off in self._pinger_offline.items():
            if index not in failed_users:
                self._judge_pinger(t, index, off)
        seen: set[int] = set()
        for i, (kind, _) in self.plan.special.items():
            index = i // k
            if index in failed_users or index in seen:
                continue
            seen.add(index)
            if kind == SILENT:
                self._judge_silent(t, index)
            elif kind == BYE:
                self._judge_bye(t, index)
            elif index in self._late:
                self._judge_late(t, index)
        if k > 1:
            self._judge_device_closes(t, failed_users)
        online = self._online
        zeros = online.count(0)
        # a user none of whose devices logged in owes no online event
        all_failed = [u for u in failed_users if all(i in failed for i in self._sessions(u))]
        online_missing = zeros - sum(1 for u in all_failed if online[u] == 0)
        online_duplicates = len(online) - zeros - online.count(1)
        return Verdict(
            sessions=self.plan.sessions, planned=self.plan.counts(), failed_logins=len(failed),
            online_events=self.online_events, online_missing=online_missing, online_duplicates=online_duplicates,
            offline_events=self.offline_events, false_offlines=t.false,
            false_offline_reasons=dict(t.false_reasons), false_offline_examples=tuple(t.examples),
            no_close_record=t.no_close_record, generator_late=t.generator_late,
            generator_late_examples=tuple(t.late_examples), late_planned=t.late_planned,
            late_expected=t.late_expected, late_offlines=t.late_offlines, late_missed=t.late_missed,
            early_offlines=t.early, missed_offlines=t.missed_never + t.missed_late,
            missed_never=t.missed_never, missed_late=t.missed_late, unjudged_silent=t.unjudged,
            unreported=t.unreported, silent_wrong_reason=dict(t.silent_wrong),
            logouts_seen=t.logouts, missed_logouts=t.missed_logouts,
            logout_wrong_reason=dict(t.logout_wrong), duplicate_offlines=self.duplicate_offlines,
            foreign_events=self.foreign_events, timeout=timeout, tick=tick, bound=bound,
            lateness_generator=t.gen, lateness_server=t.srv, deadline_shift=t.shift,
            devices=k, users=self.users,
        )

    def _judge_pinger(self, t: Tally, index: int, off: tuple[float, str, float, float]) -> None:
        """A pinger user reported offline: the server's fault, or the generator's (its devices' own send times
        say: generator late only if every device's do)."""
        ts, reason, deadline, last_seen = off
        example: dict[str, Any] = {"uid": self.uid_base + index, "kind": "pinger", "ts": ts, "reason": reason,
                                   "deadline": deadline, "last_seen": last_seen}
        verdict = None
        for i in self._sessions(index):
            record = self._closed.get(i)
            if self.devices > 1:
                example["device"] = f"d{i % self.devices}"
            if record is None:  # the worker never saw the server close it: nothing clears the server
                t.no_close_record += 1
                t.false_offline(reason, {**example, "close_record": None})
                return
            sent_prev, sent_last, at, how = record
            example.update(sent_prev=sent_prev, sent_last=sent_last, closed_at=at, closed_how=how)
            verdict = classify_offline(ts, (sent_prev, sent_last), timeout=t.timeout, tolerance=t.tolerance,
                                       bound=t.bound)
            if verdict == FALSE:
                t.false_offline(reason, example)
                return
        if self.plan.kind(index) == LATE:
            t.late_offlines += 1  # what --late-fraction asked for
        else:
            t.generator_late += 1
            if len(t.late_examples) < self.MAX_EXAMPLES:
                t.late_examples.append(example)

    def _judge_device_closes(self, t: Tally, failed_users: set[int]) -> None:
        """Devices: a pinger device the server closed ``idle_timeout`` while its user stayed online (no
        offline event to judge) -- false if the device's own sends say it was not silent."""
        k = self.devices
        for i, (sent_prev, sent_last, at, how) in self._closed.items():
            index = i // k
            if (how != "server:idle_timeout" or index in failed_users or index in self._pinger_offline
                    or self.plan.kind(i) != PINGER):
                continue
            if classify_offline(at, (sent_prev, sent_last), timeout=t.timeout, tolerance=t.tolerance,
                                bound=t.bound) == FALSE:
                t.false_offline("device:idle", {"uid": self.uid_base + index, "device": f"d{i % k}",
                                                "kind": "pinger device", "closed_at": at, "sent_prev": sent_prev,
                                                "sent_last": sent_last})

    def _judge_late(self, t: Tally, index: int) -> None:
        """A planned late session: owed an offline if its delayed keepalive was past the timeout."""
        last_sent, planned = self._late[index]
        t.late_planned += 1
        if planned - last_sent <= t.timeout + t.tolerance:
            return  # within the timeout: nothing owed (an offline is judged as any pinger's)
        t.late_expected += 1
        if index not in self._pinger_offline and last_sent + t.bound <= t.cutoff:
            t.late_missed += 1

    def _stopped(self, t: Tally, index: int, sent: dict[int, float],
                 off: tuple[float, str, float] | None) -> float | None:
        """When the last device of special user `index` stopped (None: one never said it did -- then an
        offline before that device's planned moment is false, else the user is unreported)."""
        special, latest = self.plan.special, 0.0
        for i in self._sessions(index):
            at = sent.get(i)
            if at is None:
                moment = self.t0_wall + special[i][1]
                if off is not None and off[0] < moment:  # offline while that device was still pinging
                    example = {"uid": self.uid_base + index, "kind": "silent" if sent is self._silent_sent else "bye",
                               "ts": off[0], "reason": off[1], "planned_silent_at": moment}
                    if self.devices > 1:
                        example["device"] = f"d{i % self.devices}"
                    t.false_offline(off[1], example if sent is self._silent_sent else None)
                else:
                    t.unreported += 1
                return None
            latest = max(latest, at)
        return latest

    def _judge_silent(self, t: Tally, index: int) -> None:
        off = self._special_offline.get(index)
        uid = self.uid_base + index
        last_sent = self._stopped(t, index, self._silent_sent, off)
        if last_sent is None:
            return
        limit = last_sent + t.bound
        if off is None:
            if limit > t.cutoff:
                t.unjudged += 1
            else:
                t.missed_never += 1
            return
        ts, reason, deadline = off
        if ts < last_sent - t.tolerance:  # reported offline before it (its last device) even stopped pinging
            t.false_offline(reason, {"uid": uid, "kind": "silent", "ts": ts, "reason": reason,
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

    def _judge_bye(self, t: Tally, index: int) -> None:
        off = self._special_offline.get(index)
        sent = self._stopped(t, index, self._bye_sent, off)
        if sent is None:
            return
        if off is None:
            if sent + 1.0 + 2 * t.tick <= t.cutoff:
                t.missed_logouts += 1
            return
        ts, reason, _ = off
        if ts < sent - t.tolerance:  # before the last device said bye
            t.false_offline(reason, None)
            return
        t.logouts += 1
        if reason not in LOGOUT_REASONS:
            t.logout_wrong[reason] += 1
