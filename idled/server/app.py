"""The daemon: trio listeners, one task per connection, the tick task, the log writer, signals.

Theory of operation
-------------------
Everything below this module is pure; this is the only place that reads clocks, touches sockets and
handles signals. One nursery holds:

* **listeners** (``trio.serve_listeners``): one task per connection. A connection must log in within
  ``login_timeout`` as a *user* (one uid), a *gateway* (many uids, batched ``attach``/``touch``/``detach``) or
  an *observer* (``subscribe``/``query``). A user's task is one loop: read, decode, ``presence.touch``,
  answer pings. No per-connection timer exists: idleness is the detector's job.
* **the tick task**: sleeps until the detector's ``next_due()`` -- not every second -- then expires in
  chunks of ``DEFAULT_CHUNK`` keys, with a checkpoint after every ``TICK_SLICE`` (5 ms) of them, so even
  100k simultaneous expiries never hold the loop for more than a few milliseconds. A login that
  brings the next deadline forward moves the tick task's wake-up (its cancel scope's deadline). Before it
  sleeps, it lets the detector work ahead (the lazy wheel re-files the next tick's active keys now, in 2 ms
  slices), so the next tick itself is only the expiries and they are reported without waiting.
* **the monitor**: wakes ten times a tick to measure event-loop lag (exported as the largest stall), pings
  the systemd watchdog, and runs the stall guard.
* **the log writer** (``idled.log.writer``): group-commits the records the bus queues.

Closing a connection from another task (idle expiry, duplicate login, shutdown) is a cancellation: each
connection owns a ``CancelScope``; the canceller records why (``end``), the connection task sends the error
frame itself and closes. Only the connection's own task ever writes to a user's socket.

Stall guard: the server's clock is ``trio.current_time() - paused``. If the event loop could not run for
``stall_ticks`` ticks or more (SIGSTOP, a VM pause, a starved machine), no packet could be read during that
time, so silence during it proves nothing: the whole pause is added to ``paused``, which moves every
deadline later by the pause at once (no per-key work). Whichever task first runs after the pause applies
it, before it touches or expires anything.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from idled.protocol import tokens

from idled.ops import systemd
from idled.server.bus import EventBus, Subscription, event_frame
from idled.ops.config import Config, ConfigError
from idled.core.detector import DEFAULT_CHUNK
from idled.core.factory import make_detector
from idled.log.eventlog import EventLog, iter_records
from idled.log.seqs import SEQ_BLOCK, SEQ_HEADROOM, SeqReservation
from idled.ops.gcpolicy import GcPolicy
from idled.log.writer import run_writer
from idled.ops.metrics import Metrics, serve_metrics
from idled.core.presence import PresenceEvent, PresenceTable, Uid, ticks_for
from idled.protocol import (
    BYE,
    PING,
    PONG_FRAME,
    Attach,
    Detach,
    Error,
    ErrorCode,
    FrameDecoder,
    Login,
    Msg,
    ProtocolError,
    Query,
    Status,
    Subscribe,
    Touch,
    Welcome,
    encode,
    receive_message,
)

log = logging.getLogger("idled.server.app")

SEND_ERROR_TIMEOUT = 1.0  # a peer that doesn't read can't hold a closing connection longer than this
REPLAY_BATCH = 1000
# Seconds of expiry work the tick task does between two checkpoints. Each checkpoint lets every runnable
# task (20 gateways' touch frames, observers) run before the next chunk, so an expiry in the last chunk of a
# tick waits for all of them: 2 ms slices gave a ~40 ms mean tick at 1M gateway sessions (~600 expiries).
TICK_SLICE = 0.005
CATCH_UP_SLICE = 0.010  # ... once it has fallen a whole tick behind
AHEAD_SLICE = 0.002  # work ahead of the next tick: nobody waits for it, so it yields more often
# Settings SIGHUP applies to the running server; they only shape what happens next (new connections,
# new frames, the log level). The others size structures or bind sockets: they need a restart.
RELOADABLE = ("log_level", "max_connections", "login_timeout", "max_frame", "max_gateway_frame", "stall_ticks")
ATTACH_CHUNK = 2048  # uids of one attach frame logged in between two checkpoints
OBSERVER_WRITE_BYTES = 64 * 1024  # one write to an observer carries up to this much of its backlog


class Connection:
    """A logged-in connection; for a user, also the owner object the presence table stores."""

    __slots__ = ("scope", "end")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.end: tuple[str, str] | None = None  # (error code, reason) when closed by the server

    def close(self, code: str, reason: str) -> None:
        """Make the connection's own task send ``code`` and close (the first reason given wins)."""
        if self.end is None:
            self.end = (code, reason)
        self.scope.cancel()

    def release(self, uid: Uid, code: str, reason: str) -> None:
        """The server ended this user's session (idle, kicked, shutdown): the connection goes with it."""
        self.close(code, reason)


class Gateway(Connection):
    """A gateway connection: owns many sessions; losing it ends them all (``gateway_lost``)."""

    __slots__ = ("name", "uids")

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        # A dict, not a set: the cyclic GC untracks a dict holding only ints and strs, while it would walk
        # every key of a set on each full collection (1M sessions: ~3M container entries per pass).
        self.uids: dict[Uid, None] = {}

    def release(self, uid: Uid, code: str, reason: str) -> None:
        # One session of many ended (expired or taken over): the gateway connection itself stays.
        self.uids.pop(uid, None)


class Server:
    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics | None = None,
        env: dict[str, str] | None = None,
        reload_config: Callable[[], Config] | None = None,
        gc_policy: GcPolicy | None = None,
    ) -> None:
        self.config = config
        self.gc_policy = gc_policy  # None: the interpreter's default (tests run many servers in one process)
        self._reload_config = reload_config
        self.env = dict(os.environ) if env is None else env
        self.metrics = metrics
        self.secret = tokens.load_secret(config.secret_file) if config.secret_file else None
        if self.secret is None and not config.insecure and not _is_loopback(config.host):
            raise ConfigError(
                f"refusing to listen on {config.host} with auth off: give --secret-file, or --insecure to accept it"
            )
        self.log = EventLog(
            config.resolved_data_dir(self.env),
            segment_bytes=config.segment_bytes,
            retention_bytes=config.retention_bytes,
            retention_seconds=config.retention_seconds,
        )
        self.presence: PresenceTable | None = None  # built after recovery, which fixes the first seq
        self.reservation = SeqReservation(self.log.directory)
        self._reserved = 0  # every seq issued is <= this, durably
        self._reserving = False
        self._first_seq = 1  # of this run
        self.bus = EventBus(on_event=self._count_event)
        self.paused = 0.0
        self._last_beat = 0.0
        self._stall_limit = config.stall_ticks * config.tick
        self.connections = {"user": 0, "gateway": 0, "observer": 0, "pending": 0}
        self._tick_scope: trio.CancelScope | None = None
        self._accept_scope = trio.CancelScope()
        self._stop_event = trio.Event()
        self._writer_done = trio.Event()
        self._peers: set[Connection] = set()  # gateways and observers, told when the server stops
        self.stopping = False
        self.largest_stall = 0.0  # seconds the event loop was late, at worst (the monitor's probe)
        self.ports: list[int] = []

    # -- clock ----------------------------------------------------------------------------------------

    def now(self) -> float:
        """The pause-adjusted monotonic clock every deadline is measured on."""
        t = trio.current_time()
        gap = t - self._last_beat
        if gap > self._stall_limit:
            self._last_beat = t
            self.paused += gap
            log.warning("event loop could not run for %.3f s: moved every deadline by the pause", gap)
        return t - self.paused

    # -- seqs -----------------------------------------------------------------------------------------

    async def _reserve_seqs(self, next_seq: int) -> int:
        """The first seq of this run: past every record on disk and every seq a previous run may have
        shown an observer; reserves the first block before anything is issued."""
        reserved = await trio.to_thread.run_sync(self.reservation.load)
        first = max(next_seq, reserved + 1)
        if first > next_seq:
            log.info("seqs %d..%d may have been seen but not logged before the last stop: skipped", next_seq, first - 1)
        await trio.to_thread.run_sync(self.reservation.record, first + SEQ_BLOCK)
        self._reserved = first + SEQ_BLOCK
        self._first_seq = first
        return first

    async def _extend_reservation(self) -> None:
        assert self.presence is not None
        try:
            upto = self.presence.next_seq + SEQ_BLOCK
            await trio.to_thread.run_sync(self.reservation.record, upto)
            self._reserved = upto
        finally:
            self._reserving = False

    async def _room(self) -> None:
        """Wait until a burst of presence changes may be made: the log writer is not too far behind, and
        the seq reservation has headroom (it is extended ahead of need, so this rarely waits)."""
        assert self.presence is not None
        await self.bus.room()
        while self.presence.next_seq + SEQ_HEADROOM > self._reserved:
            await trio.sleep(0.005)

    # -- lifecycle ------------------------------------------------------------------------------------

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener] | None = None,
        *,
        task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Recover the log, listen, and run until cancelled or ``stop()``; then shut down cleanly."""
        cfg = self.config
        recovery = await trio.to_thread.run_sync(self.log.recover)
        if recovery.damaged:  # damage skipped in place, a quarantined tail, a bad snapshot (see log/recovery)
            log.warning("event log: %s", recovery.summary())
        detector = make_detector(cfg.detector_kind, timeout=ticks_for(cfg.timeout, cfg.tick), slots=cfg.slots)
        self.presence = PresenceTable(
            detector,
            tick=cfg.tick,
            timeout=cfg.timeout,
            max_timeout=cfg.max_timeout,
            detector_name=cfg.detector_kind,
            first_seq=await self._reserve_seqs(recovery.next_seq),
        )
        if self.gc_policy is not None:
            self.gc_policy.start()  # after the session maps exist: see idled.ops.gcpolicy
        self._last_beat = trio.current_time()
        if listeners is None:
            listeners = await self._open_listeners()
        self.ports = [listener.socket.getsockname()[1] for listener in listeners]
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._run_writer)
            # Sessions a crashed run left online end now, before anyone can log in again.
            wall = time.time()
            for record in recovery.online.values():
                self.bus.publish(self.presence.restart_event(record, wall))
            if recovery.online:
                log.info("closed %d sessions left online by the previous run (reason restart)", len(recovery.online))
            if self.metrics is not None:
                self.metrics.register_snapshot(self.snapshot)
                if cfg.metrics_port:
                    port = await nursery.start(serve_metrics, self.metrics.registry, cfg.metrics_host, cfg.metrics_port)
                    log.info("metrics on http://%s:%d/metrics", cfg.metrics_host, port)
            nursery.start_soon(self._ticker)
            await nursery.start(self._accept, listeners, nursery)
            for port in self.ports:
                log.info("listening on %s:%d", cfg.host, port)
                print(f"IDLED_LISTENING host={cfg.host} port={port}", file=sys.stderr, flush=True)
            systemd.notify(systemd.READY, env=self.env)
            # Started after READY=1, so the manager never sees WATCHDOG=1 (or STATUS=) before it.
            nursery.start_soon(self._monitor)
            task_status.started(self.ports)
            await self._until_stopped()
            await self._shutdown(nursery)

    async def _accept(
        self, listeners: Sequence[trio.SocketListener], handlers: trio.Nursery, task_status: trio.TaskStatus[None]
    ) -> None:
        # Accept loops under their own scope, handlers in the main nursery: stopping to accept
        # (shutdown) closes the listeners and leaves the connections to end cleanly.
        with self._accept_scope:
            if not listeners:
                # trio.serve_listeners([]) returns at once and then raises AssertionError: with nothing to
                # accept on (connections are handed to _handle directly), just hold the scope.
                task_status.started()
                await trio.sleep_forever()
            await trio.serve_listeners(self._handle, listeners, handler_nursery=handlers, task_status=task_status)

    async def _open_listeners(self) -> list[trio.SocketListener]:
        inherited = systemd.listen_fds(self.env)
        if inherited:
            log.info("socket activation: adopting %d listening socket(s)", len(inherited))
            return [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in inherited]
        return await trio.open_tcp_listeners(self.config.port, host=self.config.host)

    async def _until_stopped(self) -> None:
        """Wait for SIGTERM/SIGINT (or ``stop()``). Once shutdown begins the default handlers are back, so a
        second Ctrl-C interrupts the shutdown itself."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as watch:

                async def on_signals() -> None:
                    async for signum in signals:
                        if signum == signal.SIGHUP:
                            self._reload()
                        else:
                            log.info("%s: shutting down", signal.Signals(signum).name)
                            self._stop_event.set()

                watch.start_soon(on_signals)
                await self._stop_event.wait()
                watch.cancel_scope.cancel()

    def stop(self) -> None:
        """Begin a clean shutdown (what SIGTERM does)."""
        self._stop_event.set()

    def _reload(self) -> None:
        """SIGHUP: re-read the configuration and apply what can change without a restart (``RELOADABLE``);
        report the rest. Logs go to stderr (journald), so there is no log file to reopen."""
        if self._reload_config is None:
            log.info("SIGHUP: no configuration source to reload")
            return
        systemd.notify(systemd.RELOADING, env=self.env)
        try:
            new = self._reload_config()
        except ConfigError as exc:
            log.error("SIGHUP: configuration not reloaded: %s", exc)
            return
        finally:
            systemd.notify(systemd.READY, env=self.env)
        applied = {name: getattr(new, name) for name in RELOADABLE if getattr(new, name) != getattr(self.config, name)}
        ignored = [
            field.name
            for field in dataclasses.fields(new)
            if field.name not in RELOADABLE and getattr(new, field.name) != getattr(self.config, field.name)
        ]
        self.config = dataclasses.replace(self.config, **applied)
        self._stall_limit = self.config.stall_ticks * self.config.tick
        if "log_level" in applied:
            logging.getLogger().setLevel(self.config.log_level.upper())
        log.info(
            "SIGHUP: reloaded %s%s",
            ", ".join(f"{k}={v}" for k, v in applied.items()) or "nothing changed",
            f"; needs a restart: {', '.join(ignored)}" if ignored else "",
        )

    async def _shutdown(self, nursery: trio.Nursery) -> None:
        """Stop accepting, end every session (reason shutdown), flush the log, then cancel the rest."""
        self.stopping = True
        self._accept_scope.cancel()
        systemd.notify(systemd.STOPPING, env=self.env)
        assert self.presence is not None
        with trio.move_on_after(max(5.0, self.config.login_timeout)) as grace:
            grace.shield = True
            wall = time.time()
            ended = 0
            for event, owner in self.presence.end_all(self.now(), wall, "shutdown"):
                self.bus.publish(event)
                owner.release(event.uid, ErrorCode.SERVER_SHUTDOWN, "server is shutting down")
                ended += 1
                if ended % DEFAULT_CHUNK == 0:
                    await trio.sleep(0)
            log.info("shutdown: ended %d sessions", ended)
            self.bus.close_log()
            await self._writer_done.wait()
            # Observers get every shutdown event before their own server_shutdown.
            while self.bus.undelivered():
                await trio.sleep(0.01)
            for peer in list(self._peers):
                peer.close(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")
            # Let every logged-in connection send its server_shutdown frame and close (each send is bounded
            # by SEND_ERROR_TIMEOUT): cancelling the nursery while a gateway's or observer's task is still
            # unwinding its own cancel scope would skip its goodbye. Connections still logging in are not
            # waited for; they are cancelled below.
            while any(self.connections[role] for role in ("user", "gateway", "observer")):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()

    async def _run_writer(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        metrics = self.metrics
        try:
            await run_writer(
                self.log,
                self.bus.log_receive,
                fsync=self.config.fsync,
                interval=self.config.fsync_interval,
                on_batch=None if metrics is None else _count_batch(metrics),
                on_fsync=None if metrics is None else metrics.eventlog_fsync_duration.observe,
                task_status=task_status,
            )
        except BaseException:
            self.log.close()
            self._writer_done.set()
            raise
        self._writer_done.set()  # every event is written: shutdown may tell the peers goodbye
        # Drained cleanly (run_writer raises on any failure). A clean stop syncs even under --fsync never;
        # then every issued seq is durable and the next run may continue right after the last one: no gap.
        # Shielded: cancelling the server must not stop this half-way.
        with trio.CancelScope(shield=True):
            if self.config.fsync == "never":
                await trio.to_thread.run_sync(self.log.sync)
            assert self.presence is not None
            await trio.to_thread.run_sync(self.reservation.record, self.presence.next_seq - 1)
            self.log.close()

    def _count_event(self, event: PresenceEvent) -> None:
        if self.metrics is not None:
            self.metrics.presence_events.labels(kind=event.kind, reason=event.reason).inc()

    # -- the tick task ----------------------------------------------------------------------------------

    async def _ticker(self) -> None:
        presence = self.presence
        assert presence is not None
        metrics = self.metrics
        while True:
            due = presence.next_due()
            with trio.CancelScope() as self._tick_scope:
                self._tick_scope.deadline = math.inf if due is None else self._wake_time(due)
                await trio.sleep_forever()
            self._tick_scope = None
            started = time.perf_counter()
            slice_end = started + TICK_SLICE
            while True:
                now = self.now()
                due = presence.next_due()
                if due is None or due > now:
                    break
                await self._room()
                wall = time.time()
                for event, owner in presence.expire(now, wall, DEFAULT_CHUNK):
                    self.bus.publish(event)
                    owner.release(event.uid, ErrorCode.IDLE_TIMEOUT, "no activity within the timeout")
                    if metrics is not None:
                        metrics.offline_lateness.observe(event.ts - event.deadline)
                # Chunks until the slice is used up, then a checkpoint: nobody waits behind a mass expiry
                # for more than ~TICK_SLICE. Between two slices every other runnable task gets a turn, so on
                # a busy loop the tick gets TICK_SLICE per loop turn; once it has fallen a tick behind it
                # takes CATCH_UP_SLICE turns instead (measured at 1M gateway sessions, 20 busy gateway
                # tasks: one checkpoint per chunk made offlines up to 4 s late, 2 ms slices up to 3 s).
                if time.perf_counter() >= slice_end:
                    await trio.sleep(0)
                    behind = self.now() - due >= self.config.tick
                    slice_end = time.perf_counter() + (CATCH_UP_SLICE if behind else TICK_SLICE)
            if metrics is not None:
                metrics.detector_ticks.inc()
                metrics.tick_duration.observe(time.perf_counter() - started)
            await self._work_ahead()

    async def _work_ahead(self) -> None:
        """The detector's work for the next tick that need not wait for it, in AHEAD_SLICE slices; stops as
        soon as a tick is due (its expiries come first)."""
        presence = self.presence
        assert presence is not None
        slice_end = time.perf_counter() + AHEAD_SLICE
        while presence.work_ahead(DEFAULT_CHUNK):
            if time.perf_counter() >= slice_end:
                await trio.sleep(0)
                due = presence.next_due()
                if due is not None and due <= self.now():
                    return
                slice_end = time.perf_counter() + AHEAD_SLICE

    def _wake_ticker(self) -> None:
        """A new session may be due before the tick task's wake-up: bring the wake-up forward."""
        assert self.presence is not None
        scope = self._tick_scope
        if scope is None:
            return  # the tick task is awake: it asks next_due() itself before it sleeps again
        due = self.presence.next_due()
        if due is not None and (wake := self._wake_time(due)) < scope.deadline:
            scope.deadline = wake

    def _wake_time(self, due: float) -> float:
        """The trio time at which the server clock (``current_time() - paused``) reads at least ``due``.

        ``(due + paused) - paused`` can be one ulp below ``due``: woken at exactly that deadline (a virtual
        clock does so), the tick task would find nothing due yet, sleep until the same deadline, and spin."""
        t = due + self.paused
        while t - self.paused < due:
            t = math.nextafter(t, math.inf)
        return t

    # -- the monitor --------------------------------------------------------------------------------------

    async def _monitor(self) -> None:
        interval = min(0.1, self.config.tick / 10)
        watchdog = systemd.watchdog_interval(self.env)
        notifier = systemd.Notifier(self.env)
        next_ping = trio.current_time()
        next_status = trio.current_time()
        with notifier:
            while True:
                before = trio.current_time()
                await trio.sleep(interval)
                t = trio.current_time()
                self.now()  # applies the stall guard if the loop was held up
                self._last_beat = t
                if self.gc_policy is not None:
                    self.gc_policy.maybe_thaw()
                lag = max(0.0, t - before - interval)
                self.largest_stall = max(self.largest_stall, lag)
                if self.metrics is not None:
                    self.metrics.observe_loop_lag(lag)
                if watchdog is not None and t >= next_ping:
                    notifier.send(systemd.WATCHDOG)
                    next_ping = t + watchdog
                if notifier.enabled and t >= next_status:
                    notifier.send(systemd.status(self._status_line()))
                    next_status = t + 5.0
                if self.presence is not None and not self._reserving and (
                    self.presence.next_seq + SEQ_BLOCK // 2 > self._reserved
                ):
                    self._reserving = True
                    self._nursery.start_soon(self._extend_reservation)

    def _status_line(self) -> str:
        c = self.connections
        return f"{len(self.presence or ())} online; connections: {c['user']} users, {c['gateway']} gateways, {c['observer']} observers"

    def snapshot(self) -> dict[str, Any]:
        assert self.presence is not None
        stats = self.presence.detector_stats()
        return {
            "connections": dict(self.connections),
            "sessions_online": len(self.presence),
            "detector_keys": stats.keys,
            "detector_overflow_keys": stats.overflow_keys,
        }

    # -- connections ----------------------------------------------------------------------------------------

    async def _handle(self, stream: trio.SocketStream) -> None:
        role = "pending"
        self.connections[role] += 1
        try:
            if self.stopping:
                await self._close_with(stream, ErrorCode.SERVER_SHUTDOWN, "shutting down")
                return
            if sum(self.connections.values()) > self.config.max_connections:
                await self._close_with(stream, ErrorCode.BUSY, "too many connections")
                return
            decoder = FrameDecoder(self.config.max_frame)
            try:
                login = await self._login(stream, decoder)
                if login is None:
                    return
                self._refuse_if_stopping()
                self.connections[role] -= 1
                role = "user" if login.role == "uid" else login.role
                self.connections[role] += 1
                if login.role == "uid":
                    await self._run_user(stream, decoder, login)
                elif login.role == "gateway":
                    await self._run_gateway(stream, decoder, login)
                else:
                    await self._run_observer(stream, decoder, login)
            except ProtocolError as exc:
                self._reject(exc.code)
                await self._close_with(stream, exc.code, exc.reason)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away: its session (if any) was ended where it was read
        except Exception:
            log.exception("connection handler failed (bug); connection closed, server unaffected")
        finally:
            self.connections[role] -= 1
            await stream.aclose()

    def _refuse_if_stopping(self) -> None:
        """No session may start once shutdown began: end_all() has run (or is running), so it would never be
        ended, and its online event would miss the log."""
        if self.stopping:
            raise ProtocolError(ErrorCode.SERVER_SHUTDOWN, "server is shutting down")

    def _reject(self, code: str) -> None:
        if self.metrics is not None:
            self.metrics.frames_rejected.labels(reason=str(code)).inc()

    async def _close_with(self, stream: trio.SocketStream, code: str, reason: str) -> None:
        """Send an error frame (bounded in time, even while cancelled) before the caller closes."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + SEND_ERROR_TIMEOUT
            try:
                await stream.send_all(encode(Error(str(code), reason)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                pass

    async def _login(self, stream: trio.SocketStream, decoder: FrameDecoder) -> Login | None:
        with trio.move_on_after(self.config.login_timeout):
            message = await receive_message(stream, decoder)
            if message is None:
                return None
            if not isinstance(message, Login):
                raise ProtocolError(ErrorCode.NOT_LOGGED_IN, f"log in first (got {type(message).__name__.lower()})")
            role_label = "user" if message.role == "uid" else message.role
            if self.secret is not None:
                try:
                    tokens.verify(self.secret, message.token or "", message.role, message.name, time.time())
                except tokens.AuthError as exc:
                    if self.metrics is not None:
                        self.metrics.logins.labels(role=role_label, result="auth_failed").inc()
                    raise ProtocolError(ErrorCode.AUTH_FAILED, str(exc)) from None
            if self.metrics is not None:
                self.metrics.logins.labels(role=role_label, result="ok").inc()
            return message
        self._reject(ErrorCode.LOGIN_TIMEOUT)
        await self._close_with(stream, ErrorCode.LOGIN_TIMEOUT, f"no login within {self.config.login_timeout:g} s")
        return None

    def _take_over(self, uid: Uid, previous: Any, owner: Connection) -> None:
        if previous is not None and previous is not owner:
            previous.release(uid, ErrorCode.KICKED, "logged in elsewhere")

    def _publish(self, event: PresenceEvent | None) -> None:
        if event is not None:
            self.bus.publish(event)

    # -- users ------------------------------------------------------------------------------------------------

    async def _run_user(self, stream: trio.SocketStream, decoder: FrameDecoder, login: Login) -> None:
        presence = self.presence
        assert presence is not None
        uid = login.name
        conn = Connection()
        await self._room()
        self._refuse_if_stopping()  # again after the wait
        previous, event = presence.login(uid, conn, self.now(), time.time(), login.keepalive)
        self._take_over(uid, previous, conn)
        self._publish(event)
        self._wake_ticker()
        reason = "closed"
        try:
            with conn.scope:
                await stream.send_all(encode(Welcome("uid", uid, presence.timeout_of(uid))))
                while (message := await receive_message(stream, decoder)) is not None:
                    if conn.end is None:  # a kicked connection's last frames are not the new owner's activity
                        presence.touch(uid, self.now())  # any frame is activity
                    if message is PING:
                        await stream.send_all(PONG_FRAME)
                    elif message is BYE:
                        reason = "logout"
                        break
                    elif type(message) is not Msg:
                        raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for users")
        except ProtocolError as exc:
            self._reject(exc.code)
            self._publish(presence.logout(uid, conn, self.now(), time.time(), "closed"))
            await self._close_with(stream, exc.code, exc.reason)
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        if conn.end is not None:
            await self._close_with(stream, *conn.end)
        else:
            self._publish(presence.logout(uid, conn, self.now(), time.time(), reason))

    # -- gateways ---------------------------------------------------------------------------------------------

    async def _run_gateway(self, stream: trio.SocketStream, decoder: FrameDecoder, login: Login) -> None:
        presence = self.presence
        assert presence is not None
        gateway = Gateway(str(login.name))
        decoder.max_frame = self.config.max_gateway_frame
        self._peers.add(gateway)
        try:
            with gateway.scope:
                await stream.send_all(encode(Welcome("gateway", gateway.name, None, self.config.max_gateway_frame)))
                while True:
                    message = await receive_message(stream, decoder)
                    if message is None or message is BYE:
                        break
                    if type(message) is Touch:
                        now = self.now()
                        for uid in message.uids:
                            presence.touch_owned(uid, gateway, now)
                    elif type(message) is Attach:
                        await self._attach(gateway, message)
                    elif type(message) is Detach:
                        await self._room()
                        now, wall = self.now(), time.time()
                        for uid in message.uids:
                            self._publish(presence.logout(uid, gateway, now, wall, "detach"))
                            gateway.uids.pop(uid, None)
                    elif message is PING:
                        await stream.send_all(PONG_FRAME)
                    else:
                        raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for gateways")
        finally:
            self._peers.discard(gateway)
            with trio.CancelScope(shield=True):
                await self._gateway_lost(gateway)
        if gateway.end is not None:
            await self._close_with(stream, *gateway.end)

    async def _attach(self, gateway: Gateway, message: Attach) -> None:
        presence = self.presence
        assert presence is not None
        await self._room()
        self._refuse_if_stopping()
        now, wall = self.now(), time.time()
        for index, uid in enumerate(message.uids, 1):
            previous, event = presence.login(uid, gateway, now, wall, message.keepalive)
            self._take_over(uid, previous, gateway)
            gateway.uids[uid] = None
            self._publish(event)
            if index % ATTACH_CHUNK == 0:  # a 1 MiB attach is ~100k uids: don't hold the loop for all of them
                self._wake_ticker()
                await trio.sleep(0)
                self._refuse_if_stopping()
                now, wall = self.now(), time.time()
        self._wake_ticker()

    async def _gateway_lost(self, gateway: Gateway) -> None:
        presence = self.presence
        assert presence is not None
        ended = 0
        while gateway.uids:
            await self._room()
            now, wall = self.now(), time.time()
            for _ in range(min(DEFAULT_CHUNK, len(gateway.uids))):
                self._publish(presence.logout(gateway.uids.popitem()[0], gateway, now, wall, "gateway_lost"))
                ended += 1
            await trio.sleep(0)
        if ended:
            log.info("gateway %s lost: %d sessions offline", gateway.name, ended)

    # -- observers --------------------------------------------------------------------------------------------

    async def _run_observer(self, stream: trio.SocketStream, decoder: FrameDecoder, login: Login) -> None:
        observer = Connection()
        subscription = Subscription(
            lambda: observer.close(ErrorCode.BUSY, "observer fell behind; subscribe again with from=<last seq + 1>")
        )
        self._peers.add(observer)
        try:
            error: ProtocolError | None = None
            with observer.scope:
                await stream.send_all(encode(Welcome("observer", login.name)))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._observer_sender, stream, subscription, nursery.cancel_scope)
                    # Caught here, not outside: out of a nursery it would come wrapped in an ExceptionGroup,
                    # which _handle's `except ProtocolError` does not catch (no error frame, a logged "bug").
                    try:
                        await self._observer_requests(stream, decoder, subscription)
                    except ProtocolError as exc:
                        error = exc
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    nursery.cancel_scope.cancel()
        finally:
            self._peers.discard(observer)
            self.bus.unsubscribe(subscription)
        if error is not None:
            raise error
        if observer.end is not None:
            await self._close_with(stream, *observer.end)

    async def _observer_requests(self, stream: trio.SocketStream, decoder: FrameDecoder, subscription: Subscription) -> None:
        presence = self.presence
        assert presence is not None
        while True:
            message = await receive_message(stream, decoder)
            if message is None or message is BYE:
                return
            if type(message) is Subscribe:
                if self.bus.is_subscribed(subscription):
                    raise ProtocolError(ErrorCode.NOT_ALLOWED, "already subscribed")
                start = message.from_seq
                if start is not None and start > presence.next_seq:
                    raise ProtocolError(ErrorCode.BAD_MESSAGE, f"from={start} is beyond the next seq {presence.next_seq}")
                if start is not None and start < presence.next_seq:
                    oldest = await trio.to_thread.run_sync(self.log.oldest_seq)
                    if oldest is None:  # nothing on disk yet: this run's events are all written or queued to be
                        oldest = self._first_seq
                    available = min(x for x in (oldest, self.bus.oldest_recent(), presence.next_seq) if x is not None)
                    # Seq 1 is the first ever: asking for anything before it misses nothing.
                    if start < available and available > 1:
                        raise ProtocolError(ErrorCode.GONE, f"seq {start} is no longer retained; oldest available is {available}")
                # No checkpoint between these two lines: the replay marker precedes every live frame.
                self.bus.subscribe(subscription, presence.next_seq, start)
                self._queue(subscription, REPLAY_MARKER)
            elif type(message) is Query:
                self._queue(subscription, encode(Status({uid: presence.is_online(uid) for uid in message.uids})))
            elif message is PING:
                self._queue(subscription, PONG_FRAME)
            else:
                raise ProtocolError(ErrorCode.NOT_ALLOWED, f"{type(message).__name__.lower()} is not for observers")

    def _queue(self, subscription: Subscription, frame: bytes) -> None:
        try:
            subscription.send.send_nowait(frame)
        except trio.WouldBlock:
            subscription.on_overflow()

    async def _observer_sender(self, stream: trio.SocketStream, subscription: Subscription, done: trio.CancelScope) -> None:
        """The only task writing to an observer's socket: replies, replay (at the marker), live events."""
        try:
            async for frame in subscription.receive:
                # Whatever else is already queued goes out in the same write: one send per burst, not
                # per event, or a mass expiry outruns the observer (~3k sends/s against ~10k events/s).
                batch: list[bytes] = []
                size = 0
                while True:
                    if frame is REPLAY_MARKER:
                        if batch:
                            await stream.send_all(b"".join(batch))
                            batch, size = [], 0
                        if subscription.replay_from is not None:
                            await self._replay(stream, subscription.replay_from, subscription.live_from)
                    else:
                        batch.append(frame)
                        size += len(frame)
                    if size >= OBSERVER_WRITE_BYTES:
                        break
                    try:
                        frame = subscription.receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                if batch:
                    await stream.send_all(b"".join(batch))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            done.cancel()  # the observer went away: end the connection (its reader may be blocked)

    async def _replay(self, stream: trio.SocketStream, start: int, below: int) -> None:
        """Send events ``[start, below)``: older ones from the log on disk, the rest from the recent window."""
        window_start, frames = self.bus.recent_from(start, below)
        if start < window_start:
            # Everything before the window has reached the writer; wait until it is on disk too.
            while self.log.last_seq < window_start - 1:
                await trio.sleep(0.01)
            records = iter_records(self.log.directory, start)
            while batch := await trio.to_thread.run_sync(_take, records, REPLAY_BATCH, window_start):
                await stream.send_all(b"".join(event_frame(record) for record in batch))
        for i in range(0, len(frames), REPLAY_BATCH):  # batched like the disk part: up to 100k frames
            await stream.send_all(b"".join(frames[i : i + REPLAY_BATCH]))


REPLAY_MARKER = b""  # queued at subscribe: "replay the requested range here, before the live frames"


def _take(records: Any, count: int, below: int) -> list[dict[str, Any]]:
    out = []
    for record in records:
        if record["seq"] >= below:
            break
        out.append(record)
        if len(out) >= count:
            break
    return out


def _count_batch(metrics: Metrics) -> Callable[[int, int], None]:
    def on_batch(records: int, nbytes: int) -> None:
        metrics.eventlog_records.inc(records)
        metrics.eventlog_bytes.inc(nbytes)

    return on_batch


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
