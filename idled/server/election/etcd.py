"""`EtcdElection`: campaign for ``<prefix>/leader`` in etcd, hold it by lease, fence by the lease deadline.

Theory of operation
-------------------
*Keys.* ``<prefix>/leader`` holds the leader's advertised address and is attached to the leader's lease, so
it disappears when the lease ends (expiry, revoke). ``<prefix>/seq`` holds the last event seq a leader
published, in decimal, with no lease: it outlives every leader.

*Campaign* (``_campaign``): keep a lease of our own alive (grant one, or renew the one we have), then one
transaction: "if ``<prefix>/leader``'s create revision is 0 (absent), put our address with our lease, else
read it". Won: the key's create revision is our *term*. Lost: we know the leader's address (``leader()``,
for redirects), and watch the key from the next revision until it is deleted -- at most a renew interval,
so our own lease is renewed meanwhile -- then try again. A resigned leader revokes its lease, which deletes
the key: the watchers try at once. A crashed one's key goes when etcd expires its lease: within the ttl.

*Hold* (``_hold``): every renew interval, a keepalive (the start of the request is what the deadline counts
from; ``idled.server.election.lease``), then a transaction checking that the leader key is still ours (same
create revision, same lease): someone deleting it by hand deposes us. A failed renewal is retried every
retry interval. The whole hold runs in a cancel scope whose deadline is the lease deadline, moved on by each
renewal: when it passes, we step down then and there, whatever request was in flight. ``is_leader(now)``
does not wait for that: it compares ``now`` with the same deadline. Once it has said false, it never says
true again in the same term: a renewal answered after the deadline ends the term rather than resuming it.

*Step down*: ``is_leader`` false first, then the status, then revoke the lease (best effort, bounded) and
campaign again with a new lease: every term has a lease of its own.

*Seq fencing*: ``publish_seq`` checks ``is_leader`` locally (a process waking from SIGSTOP is refused
without a round trip), then writes ``<prefix>/seq`` in a transaction conditioned on the leader key's create
revision and lease being ours; a deposed leader's write fails (``fenced``) even in the window before its
next renewal would have told it. ``last_seq`` reads it: a new leader continues after it.

*Clock.* ``clock`` (default ``time.monotonic``, CLOCK_MONOTONIC: it runs while a process is stopped, and
processes on one machine share it) is what the deadlines and ``is_leader(now)`` are in. trio's own clock
serves only to sleep: a deadline becomes a trio time as ``trio.current_time() + (deadline - clock())``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import trio

from idled.server.election.base import Status, StatusBoard
from idled.server.election.errors import FENCED, NOT_LEADER, ElectionError, EtcdError, NotLeader
from idled.server.election.etcdclient import EtcdClient, KeyValue, compare_create, compare_lease, get, put
from idled.server.election.lease import Timings
from idled.server.election.target import EtcdTarget

__all__ = ["EtcdElection"]

log = logging.getLogger("idled.server.election")


class EtcdElection:
    """Leader election in etcd (use ``async with``, then run ``run`` in a nursery). ``address``: what
    followers are told to redirect to."""

    def __init__(self, target: EtcdTarget, address: str, *, timings: Timings | None = None,
                 clock: Callable[[], float] = time.monotonic, gateway: EtcdClient | None = None) -> None:
        self.target = target
        self.address = address
        self.timings = timings or Timings.of()
        self._clock = clock
        self._etcd = gateway or EtcdClient(target.base_urls, timeout=self.timings.request_timeout)
        self._board = StatusBoard(Status(0, False, None, 0, "not campaigning yet"))
        self._lease = 0
        self._lease_deadline = -math.inf  # until when _lease may be counted on (clock time)
        self._renewed_at = -math.inf  # the start of the request that set _lease_deadline
        self._leading = False
        self._term = 0
        self._published = 0
        self._resigning = False
        self._running = False
        self._run_scope: trio.CancelScope | None = None
        self._hold_scope: trio.CancelScope | None = None
        self._done = trio.Event()
        self._trouble = ""  # the last etcd failure logged, so a streak is logged once

    async def __aenter__(self) -> EtcdElection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._etcd.aclose()

    # -- what the server asks -------------------------------------------------------------------------

    @property
    def status(self) -> StatusBoard:
        return self._board

    def is_leader(self, now: float) -> bool:
        return self._leading and now < self._lease_deadline

    def leader(self) -> str | None:
        return self._board.current.address

    @property
    def deadline(self) -> float | None:
        """The current lease deadline while leading (clock time), else None: for logs and tests."""
        return self._lease_deadline if self._leading else None

    async def publish_seq(self, seq: int, *, lower: bool = False) -> None:
        if not self.is_leader(self._clock()):
            raise NotLeader(NOT_LEADER, "not the leader (or the lease deadline has passed)")
        if seq < self._published and not lower:
            raise ValueError(f"seq {seq} is below the last published {self._published}")
        key = self.target.leader_key
        won, _, _ = await self._etcd.txn([compare_create(key, self._term), compare_lease(key, self._lease)],
                                         [put(self.target.seq_key, str(seq))], [])
        if not won:
            self._step_down("etcd refused a seq write: the leader key is no longer ours")
            if self._hold_scope is not None:
                self._hold_scope.cancel()
            raise NotLeader(FENCED, f"seq {seq} not written: the leader key is no longer ours")
        self._published = seq

    async def last_seq(self) -> int:
        kv, _ = await self._etcd.range(self.target.seq_key)
        if kv is None:
            return 0
        try:
            return int(kv.value.decode("ascii"))
        except ValueError:
            raise EtcdError(f"{self.target.seq_key} holds {kv.value[:40]!r}, not a seq") from None

    async def resign(self) -> None:
        """Stop leading and campaigning; returns once ``run`` has revoked the lease and ended."""
        self._resigning = True
        self._step_down("resigned")
        if self._run_scope is not None:
            self._run_scope.cancel()
        if self._running:
            await self._done.wait()
        else:
            await trio.lowlevel.checkpoint()

    # -- the task ---------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._running or self._done.is_set():
            raise RuntimeError("EtcdElection.run runs once")
        self._running = True
        try:
            with trio.CancelScope() as self._run_scope:
                task_status.started()
                while not self._resigning:
                    await self._campaign()
                    reason = await self._hold()
                    self._step_down(reason)
                    await self._drop_lease()
        finally:
            self._step_down("resigned" if self._resigning else "stopped")
            await self._drop_lease()
            self._board.set(leader=False, address=None, term=0, reason="not campaigning")
            self._running = False
            self._done.set()

    async def _campaign(self) -> None:
        """Return once we hold the leader key (``_leading``)."""
        key = self.target.leader_key
        while True:
            try:
                await self._fresh_lease()
                won, responses, revision = await self._etcd.txn(
                    [compare_create(key, 0)], [put(key, self.address, self._lease)], [get(key)])
                holder = None if won else _range_kv(responses)
                if won or (holder is not None and holder.lease == self._lease):  # ours: an answer we missed
                    self._term = revision if won or holder is None else holder.create_revision
                    self._leading = True
                    self._recovered()
                    log.warning("elected leader of %s (term %d, lease %x), advertising %s",
                                self.target, self._term, self._lease, self.address)
                    self._board.set(leader=True, address=self.address, term=self._term, reason="elected")
                    return
                self._recovered()
                self._follow(holder)
                with trio.move_on_after(self.timings.renew_interval):
                    await self._await_vacancy(revision + 1)
            except EtcdError as exc:
                if "lease not found" in exc.reason:  # our lease expired between renewal and txn: take another
                    self._lease = 0
                    continue
                self._trouble_with(exc, "campaign")
                await trio.sleep(self.timings.retry_interval)
            except ElectionError as exc:
                self._trouble_with(exc, "campaign")
                self._board.set(leader=False, address=None, term=0, reason=f"etcd unavailable: {exc.reason}")
                await trio.sleep(self.timings.retry_interval)

    def _follow(self, holder: KeyValue | None) -> None:
        address = holder.value.decode("utf-8", "replace") if holder is not None else None
        self._board.set(leader=False, address=address, term=0, reason="following")

    async def _await_vacancy(self, start_revision: int) -> None:
        """Return when the leader key is deleted at or after ``start_revision`` (or the watch is cancelled)."""
        while True:
            events = await self._etcd.watch(self.target.leader_key, start_revision)
            if not events:
                return
            for event in events:
                if event.deleted:
                    return
                self._follow(event.kv)
                start_revision = event.kv.mod_revision + 1

    async def _fresh_lease(self) -> None:
        """Make sure ``_lease`` is alive: renew it, or grant a new one if there is none (or etcd lost it)."""
        if self._lease:
            sent = self._clock()
            ttl = await self._etcd.keepalive(self._lease)
            if ttl > 0:
                self._renewed(sent, ttl)
                return
        sent = self._clock()
        self._lease, ttl = await self._etcd.grant(self.timings.ttl)
        self._renewed(sent, ttl)

    def _renewed(self, sent: float, ttl: int) -> None:
        self._renewed_at = sent
        self._lease_deadline = self.timings.deadline(sent, ttl)

    async def _hold(self) -> str:
        """Renew until leadership is lost; returns why."""
        next_renew = self._renewed_at + self.timings.renew_interval
        with trio.CancelScope() as self._hold_scope:
            while True:
                reason: str | None = None
                with trio.move_on_at(self._trio_time(self._lease_deadline)) as deadline:
                    await trio.sleep_until(self._trio_time(next_renew))
                    if self._clock() >= self._lease_deadline:  # the clock jumped (a stopped process)
                        return "the lease deadline passed without a renewal"
                    try:
                        reason = await self._renew()
                        next_renew = self._renewed_at + self.timings.renew_interval
                    except ElectionError as exc:
                        self._trouble_with(exc, "renewal")
                        next_renew = self._clock() + self.timings.retry_interval
                if deadline.cancelled_caught:
                    return "the lease deadline passed without a renewal"
                if reason is not None:
                    return reason
        return "fenced: etcd refused a write"

    async def _renew(self) -> str | None:
        """One renewal: None when still leading, else why not."""
        sent = self._clock()
        ttl = await self._etcd.keepalive(self._lease)
        if ttl <= 0:
            return "etcd no longer has our lease"
        key = self.target.leader_key
        ours, responses, _ = await self._etcd.txn(
            [compare_create(key, self._term), compare_lease(key, self._lease)], [], [get(key)])
        if not ours:
            self._follow(_range_kv(responses))
            return "the leader key is no longer ours"
        if self._clock() >= self._lease_deadline:  # is_leader went false meanwhile: it stays so this term
            return "the lease deadline passed before the renewal came back"
        self._recovered()
        self._renewed(sent, ttl)
        return None

    def _step_down(self, reason: str) -> None:
        was = self._leading
        self._leading = False  # first: is_leader is false from here on
        self._term = 0
        if was:
            log.warning("no longer leader of %s: %s", self.target, reason)
            self._board.set(leader=False, address=None, term=0, reason=reason)

    async def _drop_lease(self) -> None:
        """Revoke our lease, if any (best effort, bounded; shielded: also on the way out of a cancelled run)."""
        lease, self._lease = self._lease, 0
        self._lease_deadline = -math.inf
        if not lease:
            return
        with trio.CancelScope(shield=True):
            try:
                await self._etcd.revoke(lease)
            except ElectionError as exc:
                log.info("lease %x not revoked (%s): it expires by itself within %d s", lease, exc, self.timings.ttl)

    def _trio_time(self, clock_time: float) -> float:
        return trio.current_time() + (clock_time - self._clock())

    def _trouble_with(self, exc: ElectionError, during: str) -> None:
        text = f"{during}: {exc}"
        if text != self._trouble:
            log.warning("etcd %s", text)
            self._trouble = text

    def _recovered(self) -> None:
        if self._trouble:
            log.warning("etcd answers again (%s)", self.target)
            self._trouble = ""


def _range_kv(responses: list[dict[str, Any]]) -> KeyValue | None:
    """The key-value of the first range response of a transaction's branch (None: the key is absent)."""
    for response in responses:
        kvs = response.get("response_range", {}).get("kvs") or []
        if kvs:
            return KeyValue.parse(kvs[0])
    return None
