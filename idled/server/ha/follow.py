"""The standby's replication link: follow the active core's event log, record by record, into our own.

Theory of operation
-------------------
`StandbyLink.run` keeps one connection to the active core (``standby_of``): it logs in with the ``standby``
role, the one allowed to replicate (with a ``standby`` token it mints itself when auth is on: a standby
shares the active's secret), and sends ``replicate from=<our last seq + 1>``, so every (re)connection resumes exactly after the last record we hold: no gap,
no duplicate; it names our last record in ``last`` (seq and CRC), so the active can tell whether we hold
records it never had (see *Divergence*). The active sends ``records`` frames of durable records, byte for
byte as its segments hold them (``idled.server.ha.feed``, ``idled.protocol.replication``); each batch is

1. appended to our log as it is (``idled.log.shipping.append_raw``: same bytes, same seqs; the log keeps
   its open sessions, last-seen map, snapshots and retention as the active's does), in a worker thread;
2. synced by *our* ``--fsync`` policy: ``always`` every batch, ``interval`` once ``fsync_interval`` has
   passed (heartbeats come every second, so nothing stays unsynced much longer), ``never`` not at all;
3. handed to our observers (``EventBus.relay``; durable subscribers once we have synced it);
4. acknowledged: ``{"op":"ack","seq":N}``, N the last seq we have synced (``synced``), after every ``records``
   frame, heartbeats included. The active holds its durable observers to our acks when it runs with
   ``sync_standby`` (``idled.server.ha.feed``); an ack also tells it we are alive.

Only then is the next frame read, so a slow disk here stops us reading, the active's send blocks, and no
buffer grows on either side: one frame (``MAX_FRAME``) is in flight.

**Lag.** Every frame carries the active's durable seq (``head``). ``lag_records`` is ``head`` less our
last seq; ``lag_seconds`` is 0 while we hold everything the active last told us of, else the time since
we last did (so it grows while the link is down, or while we fall behind).

**Re-sync.** If our next seq is older than what the active retains, the active answers ``resync``. We say
so in one warning line (which seqs we have, which the active keeps), move our log aside
(``aside-<time>/`` in the data directory: nothing is deleted), receive the active's newest snapshot into a
temporary file, and start a new log with the records from the active's oldest seq. Once the records
below the snapshot's seq are written, the snapshot is installed and the log reopened from it: its open
sessions are then the active's.

**Divergence.** An old leader that comes back as a standby may hold records its successor never got
(written, never acknowledged). Its ``last`` does not match the new active's record at that seq, and the
active answers ``resync`` with ``diverged``: we move the whole log aside as above (one warning line naming
the seq) and copy the active's -- as ``pg_rewind`` would, but simpler: nothing of ours is kept in place.

**Older actives.** An active that predates the ``standby`` role refuses its login (``bad_message: unknown
field 'standby' in login``): the link then logs in as an observer, as standbys did before, until that active
answers an observer's ``replicate`` with the newer refusal (it was upgraded) -- then as a standby again. So
standbys can be upgraded first, and a switchover (``--election``) then hands over to a standby that never
stopped replicating (docs/ha.md#upgrades). Only these two answers, word for word, switch the login.

**Not the active.** A standby core answers a ``standby`` login with ``not_leader`` (no cascading): logged,
and tried again with backoff, so a core that becomes the active (promoted) is followed from then on.

**Failures.** A lost link, a silent one (``LINK_TIMEOUT``), the active restarting: reconnect with
exponential backoff (``BACKOFF_MIN`` .. ``BACKOFF_MAX``), one log line per change of state. The link is opened
by ``idled.door.outbound.dial`` (TLS with ``link_tls``); a configuration the two sides cannot speak (TLS on
one side only, a certificate that does not verify) ends the process with one fatal line if nothing has worked
since it started (``LinkPolicy.strict``), else is logged once and retried like a lost link. A write that
fails (disk full) stops replication with an error line -- one, not one per attempt -- and retries every
``WRITE_RETRY`` seconds from the last record written (the log is left at its last whole record:
``idled.log.eventlog``), with one line again when a write succeeds; a failed fsync stops it for good (the log is poisoned: restart the standby). An
active that says we hold records it never had (``not_allowed``) stops it too: rebuild the standby
(docs/ha.md). The active is unaffected by any of these.

State is kept here, in one place (``state``: connecting, streaming, resyncing, retrying, stopped), so that
a later promotion can stop the link at a known point and start the active role on the same directory.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Final

import trio

from idled.door.outbound import LinkFailed, LinkPolicy, broken_link, close_link, dial
from idled.log.errors import DiskFull, EventLogError, FsyncFailed, LogStateError
from idled.log.eventlog import EventLog
from idled.log.shipping import SnapshotSink, append_raw, move_aside, read_record, record_seqs
from idled.protocol import Error, ErrorCode, FrameDecoder, Login, ProtocolError, Role, Welcome, encode, tokens
from idled.protocol.address import format_address
from idled.protocol.replication import (
    LINK_TIMEOUT, MAX_FRAME, REPLICATE_NEEDS_STANDBY, Records, Resync, SnapshotPart, encode_ack, encode_replicate,
    parse_replication_message, record_crc,
)
from idled.protocol.stream import receive_message
from idled.server.engine.bus import EventBus
from idled.server.runtime.clock import WallClock

__all__ = ["BACKOFF_MAX", "BACKOFF_MIN", "WRITE_RETRY", "StandbyLink", "LinkStopped"]

log = logging.getLogger("idled.server.ha.follow")

BACKOFF_MIN: Final = 0.1
BACKOFF_MAX: Final = 5.0
WRITE_RETRY: Final = 30.0  # seconds between two attempts after a failed write (a full disk)
TOKEN_TTL: Final = 3600.0
# The refusals that switch the login (see *Older actives*): an active older than the standby role (its parser's
# words), and an active of this version refusing an observer's replicate (idled.server.roles.observers).
OLD_ACTIVE_REFUSAL: Final = "unknown field 'standby' in login"


class LinkStopped(Exception):
    """Replication cannot go on without an operator (see the module docstring)."""


class _Reconnect(Exception):
    """The link ended in a way a new connection may cure; ``args[0]`` says why."""


class _Mismatch(_Reconnect):
    """The two sides cannot speak (``failure``): fatal while the link policy is strict, else a reconnect."""

    def __init__(self, failure: LinkFailed) -> None:
        super().__init__(str(failure))
        self.failure = failure


class StandbyLink:
    """The replication link of a standby (see the module docstring). ``reopen(log)`` is called whenever the
    link replaces its `EventLog` (a re-sync, an installed snapshot): the server points its readers at it."""

    def __init__(self, log: EventLog, bus: EventBus, *, host: str, port: int, fsync: str, fsync_interval: float,
                 secret: bytes | None, name: str, reopen: Callable[[EventLog, int], None],
                 make_log: Callable[[], EventLog], wall: Callable[[], float] | None = None,
                 policy: LinkPolicy | None = None) -> None:
        self.log, self.bus = log, bus
        self.wall = WallClock() if wall is None else wall  # a minted token's expiry: the process's wall clock
        self.policy = LinkPolicy(strict=False) if policy is None else policy  # TLS, and whether a mismatch is fatal
        self.host, self.port = host, port
        self.address = format_address((host, port))  # as messages and the status show it ([v6]:port)
        self.fsync, self.fsync_interval = fsync, fsync_interval
        self.secret, self.name = secret, name
        self.reopen, self.make_log = reopen, make_log
        self.state = "connecting"
        self.connected = False
        self.head = log.last_seq  # the active's durable seq, as last heard
        self.synced = log.durable_seq  # the last seq synced under our fsync policy: what we acknowledge
        self.synced_at = time.monotonic()  # when we last held everything the active had told us of
        self.error: str | None = None
        self.records = 0  # records written since start
        self.resyncs = 0
        self.reconnects = 0
        self._last_sync = trio.current_time()
        self._dirty = False
        self._snapshot: SnapshotSink | None = None
        self._received = False  # the current connection brought records (the next attempt is not backed off)
        self.legacy = False  # log in as an observer: the active predates the standby role (*Older actives*)
        self._write_failure: str | None = None  # why the last write failed, until one succeeds (logged once)

    # -- what the outside sees ------------------------------------------------------------------------

    @property
    def lag_records(self) -> int:
        return max(0, self.head - self.log.last_seq)

    def lag_seconds(self, now: float | None = None) -> float:
        if self.connected and self.lag_records == 0:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.synced_at)

    def status(self) -> dict[str, Any]:
        return {"active": self.address, "state": self.state, "connected": self.connected,
                "last_seq": self.log.last_seq, "active_durable_seq": self.head, "lag_records": self.lag_records,
                "lag_seconds": round(self.lag_seconds(), 3), "records": self.records, "resyncs": self.resyncs,
                "reconnects": self.reconnects, "synced": self.synced, "error": self.error,
                "tls": self.policy.tls is not None}

    # -- the loop -------------------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Replicate until cancelled (or stopped: ``LinkStopped`` is logged and ends the link, not the server)."""
        task_status.started()
        backoff = BACKOFF_MIN
        try:
            while True:
                self._received = False
                try:
                    await self._session()
                except _Reconnect as exc:
                    if isinstance(exc, _Mismatch) and self.policy.strict:
                        raise self.policy.fatal("standby link", f"to the active at {self.address}",
                                                exc.failure) from None
                    why = str(exc.args[0])
                    if self.error != why:
                        log.warning("standby: link to the active at %s: %s; reconnecting", self.address, why)
                    self.error = why
                except EventLogError as exc:
                    if isinstance(exc, FsyncFailed):
                        raise LinkStopped(f"fsync failed, the log is poisoned ({exc}): restart the standby") from exc
                    why = f"cannot write the replicated log ({exc}); replication stopped, retrying every {WRITE_RETRY:g} s"
                    if self._write_failure != why:
                        self._set_error(why)
                    self.error = self._write_failure = why
                    self.state = "retrying"
                    await trio.sleep(WRITE_RETRY)
                    continue
                finally:
                    self.connected = False
                    await self._sync_if_dirty()
                self.reconnects += 1
                backoff = BACKOFF_MIN if self._received else min(BACKOFF_MAX, backoff * 2)
                self.state = "connecting"
                await trio.sleep(backoff)
        except LinkStopped as exc:
            self.state = "stopped"
            self._set_error(f"replication stopped: {exc}")

    def _set_error(self, why: str) -> None:
        log.error("standby: %s", why)
        self.error = why

    async def _session(self) -> None:
        """One connection, until it ends (always by an exception)."""
        try:
            with trio.fail_after(LINK_TIMEOUT):
                stream = await dial(self.host, self.port, self.policy)
        except (OSError, trio.TooSlowError) as exc:
            raise _Reconnect(f"cannot connect ({exc or 'timed out'})") from None
        except LinkFailed as exc:
            raise (_Mismatch(exc) if exc.mismatch else _Reconnect(exc.reason)) from None
        try:
            role: Role = "observer" if self.legacy else "standby"
            token = None
            if self.secret is not None:
                token = tokens.mint(self.secret, role, self.name, self.wall() + TOKEN_TTL)
            last = await self._last_record()
            await stream.send_all(encode(Login(role, self.name, token))
                                  + encode_replicate(self.log.last_seq + 1, last))
            decoder = FrameDecoder(MAX_FRAME, parse=parse_replication_message)
            while True:
                with trio.move_on_after(LINK_TIMEOUT) as scope:
                    message = await receive_message(stream, decoder)
                if scope.cancelled_caught:
                    raise _Reconnect(f"nothing from the active for {LINK_TIMEOUT:g} s")
                if message is None:
                    raise _Reconnect("the active closed the connection")
                await self._handle(message)
                if type(message) is Records:
                    with trio.move_on_after(LINK_TIMEOUT) as scope:
                        await stream.send_all(encode_ack(self.synced))
                    if scope.cancelled_caught:
                        raise _Reconnect(f"the active took no acknowledgement for {LINK_TIMEOUT:g} s")
        except ProtocolError as exc:
            raise _Reconnect(f"{exc.code}: {exc.reason}") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            failure = broken_link(exc)  # the active refused our certificate (TLS 1.3: at the first read)
            raise (_Reconnect(f"connection lost ({exc})") if failure is None else _Mismatch(failure)) from None
        finally:
            await close_link(stream)

    async def _last_record(self) -> tuple[int, int] | None:
        """(seq, crc) of our last record, for ``replicate``'s ``last``; None with no record to name."""
        seq = self.log.last_seq
        if seq < 1:
            return None
        raw = await trio.to_thread.run_sync(read_record, str(self.log.directory), seq)
        return None if raw is None else (seq, record_crc(raw))

    async def _handle(self, message: Any) -> None:
        if type(message) is Records:
            await self._records(message)
        elif type(message) is Welcome:
            log.info("standby: replicating from the active at %s from seq %d%s", self.address,
                     self.log.last_seq + 1, " over TLS" if self.policy.tls is not None else "")
            self.connected, self.error, self.state = True, None, "streaming"
            self.policy.proven()  # the configurations agree: a later mismatch is the active's change, not fatal
        elif type(message) is Resync:
            await self._resync(message)
        elif type(message) is SnapshotPart:
            await self._snapshot_part(message)
        else:
            self._refused(message)

    def _refused(self, message: Any) -> None:
        if type(message) is Error:
            self._switch_login(message)
            if message.code == ErrorCode.NOT_ALLOWED:
                raise LinkStopped(f"the active refused: {message.reason}")
            if message.code == ErrorCode.TLS_REQUIRED:
                raise _Mismatch(LinkFailed.tls_required())
            raise _Reconnect(f"{message.code}: {message.reason}")
        raise _Reconnect(f"unexpected {type(message).__name__.lower()} from the active")

    def _switch_login(self, message: Error) -> None:
        """Log in as an observer to an active older than the standby role, as a standby again once it is not."""
        if not self.legacy and message.code == ErrorCode.BAD_MESSAGE and OLD_ACTIVE_REFUSAL in message.reason:
            self.legacy = True
            log.warning("standby: the active at %s predates the standby login (%s); logging in as an observer "
                        "until it is upgraded (docs/ha.md#upgrades)", self.address, message.reason)
            raise _Reconnect("the active is older than this standby: logging in as an observer")
        if self.legacy and message.code == ErrorCode.NOT_ALLOWED and REPLICATE_NEEDS_STANDBY in message.reason:
            self.legacy = False
            log.warning("standby: the active at %s now takes the standby login: logging in as a standby",
                        self.address)
            raise _Reconnect("the active was upgraded: logging in as a standby")

    async def _records(self, message: Records) -> None:
        self.head = message.head
        raws = message.records
        if raws and self._snapshot is not None:  # a re-sync: the records below the snapshot's seq come first
            if not self._snapshot.complete:
                raise _Reconnect("records before the snapshot was complete")
            seqs = record_seqs(raws)
            below = sum(1 for seq in seqs if seq < self._snapshot.seq)
            if below:
                await self._write(raws[:below])
            raws = raws[below:]
            if raws:
                await self._install()
        if raws:
            await self._write(raws)
        elif self._dirty and trio.current_time() >= self._last_sync + self.fsync_interval:
            await self._sync_if_dirty()
        if self._snapshot is not None and self._snapshot.complete and self.log.last_seq >= self.head:
            await self._install()  # nothing below its seq is left to come
        if self.log.last_seq >= self.head:
            self.synced_at = time.monotonic()
            if self.state == "resyncing" and self._snapshot is None:  # a re-sync without a snapshot is done
                self.state = "streaming"
        self._received = self._received or bool(message.records)

    async def _write(self, raws: tuple[bytes, ...]) -> None:
        now = trio.current_time()
        sync = self.fsync == "always" or (self.fsync == "interval" and now >= self._last_sync + self.fsync_interval)
        written, full = await trio.to_thread.run_sync(self._commit, raws, sync)
        if written:  # (a full disk part-way: what fitted is ours, passed on before the retry of the rest)
            self.records += len(written)
            self._relay(written)
        if full is not None:
            raise full
        if self._write_failure is not None:
            log.warning("standby: the replicated log is written again")
            self._write_failure = None

    def _commit(self, raws: tuple[bytes, ...], sync: bool) -> tuple[list[dict[str, Any]], DiskFull | None]:
        """In a worker thread: append the records as they are, and sync if the policy says so now."""
        records, full = append_raw(self.log, raws)
        if sync:  # (what fitted of a batch a full disk stopped too: it is relayed as durable under always)
            self.log.sync()
        elif self.fsync == "never":
            self.log.release_rotated()
        return records, full

    def _relay(self, records: list[dict[str, Any]]) -> None:
        bus = self.bus
        if records[0]["seq"] > bus.next_seq:  # a gap the active's crash left, or a re-sync: a new "run"
            self.reopen(self.log, records[0]["seq"])
        for record in records:
            bus.relay(record)
        if self.fsync == "always" or self.fsync == "never":
            self.synced = self.log.last_seq
            bus.durable_to(self.synced)
            self._last_sync = trio.current_time() if self.fsync == "always" else self._last_sync
        elif self.log.durable_seq >= records[-1]["seq"]:
            self._last_sync = trio.current_time()
            self.synced = self.log.durable_seq
            bus.durable_to(self.synced)
        else:
            self._dirty = True

    async def _sync_if_dirty(self) -> None:
        if self._dirty and self.log.last_seq > self.log.durable_seq:
            try:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self.log.sync)
            except LogStateError:
                return  # closed half-way through a re-sync: the next log is synced on its own
            self.synced = self.log.durable_seq
            self.bus.durable_to(self.synced)
        self._dirty = False
        self._last_sync = trio.current_time()

    # -- re-sync --------------------------------------------------------------------------------------

    async def _resync(self, message: Resync) -> None:
        """Move our log aside and start a new one from what the active retains (see the module docstring)."""
        have = self.log.last_seq
        await self._sync_if_dirty()
        directory = str(self.log.directory)
        self.log.close()
        aside, moved = await trio.to_thread.run_sync(move_aside, directory)
        if message.diverged is not None:
            log.warning(
                "standby: diverged from the active: our last record, seq %d, is not the active's (this log held "
                "seqs up to %d, some the active never had); moved the old log (%d files) aside to %s; starting over "
                "from seq %d (snapshot %s)", message.diverged, have, moved, aside, message.oldest, message.snapshot)
        else:
            log.warning(
                "standby: behind the active's retention: this log held seqs up to %d, the active keeps seqs from %d "
                "on (snapshot %s); moved the old log (%d files) aside to %s; starting over from seq %d",
                have, message.oldest, message.snapshot, moved, aside, message.oldest)
        self.state, self.resyncs = "resyncing", self.resyncs + 1
        await self._open_new_log()
        if message.snapshot is not None:
            self._snapshot = SnapshotSink(directory, message.snapshot, message.size)

    async def _snapshot_part(self, message: SnapshotPart) -> None:
        if self._snapshot is None:
            raise _Reconnect("a snapshot part without a re-sync")
        await trio.to_thread.run_sync(self._snapshot.write, message.data)

    async def _install(self) -> None:
        """Install the received snapshot (every record below its seq is written) and reopen the log from it."""
        sink = self._snapshot
        assert sink is not None
        await self._sync_if_dirty()
        self.log.close()
        path = await trio.to_thread.run_sync(sink.install)
        log.info("standby: installed the active's snapshot %s", os.path.basename(path))
        await self._open_new_log()
        sink.close()
        self._snapshot = None
        self.state = "streaming"

    async def _open_new_log(self) -> None:
        new = self.make_log()
        await trio.to_thread.run_sync(new.recover)
        self.log = new
        self.synced = new.durable_seq
        self.reopen(new, new.last_seq + 1)
