"""User connections of a load-test worker: one epoll loop for all of them, no task per connection.

Theory of operation
-------------------
A worker owns sessions i = worker, worker + workers, ...; local index k numbers them 0..n-1, and their state
is a table of parallel lists (`idled.tools.loadtest.conntable`): no task, no decoder, no buffer per idle
connection. The whole engine is ONE trio task (`run_users`) in the worker's trio loop, which also carries the
pipes to the coordinator. It waits on its own ``select.epoll`` object's fd with
`trio.lowlevel.wait_readable`, or sleeps until the next timer, and then makes one *turn*:

1. ``epoll.poll(0)``: every ready socket. A logged-in session's read is compared with the wire's pong first (one
   pong, nothing pending: counted, done); anything else goes through the wire's cutter and decoder (`wire`:
   idled's frames, as WebSocket messages with ``--websocket``, or MQTT 3.1.1 with ``--peer mqtt``). An ``error``
   frame, EOF or a socket error ends the session; a connecting session that turned writable is checked
   (``SO_ERROR``), sends its PROXY header, steps its TLS handshake or sends its login (``--websocket``: upgrade
   + login, ``frames``); a logging-in session waits for its ``welcome``.
2. Timers due (`wheel.TimerWheel`, 40 ms slots; an entry is ``k << 2 | kind``): PING sends a keepalive
   and files the next one (`wheel.Schedule`, the load test's rule), or the session's silent / bye MOMENT
   instead once the next keepalive would fall after it; CONNECT_DEADLINE fails a connection still
   opening after ``connect_timeout``; BYE_DEADLINE gives up on a bye the server has not closed in 10 s.
   Entries left behind by a state change are skipped when they come due (the state byte says so).
3. The ramp: session k starts at ``t0 + i / ramp`` while fewer than ``max_inflight`` are opening. On
   loopback the TCP handshake is over when ``connect()`` returns, so a new connection sends its login in
   the same turn (no EPOLLOUT round trip) unless it really is still connecting. Session i logs in as uid
   ``uid_base + i // K`` with device ``"d<i % K>"`` (``--devices K``; K = 1: no device, as before); without
   a secret its login frame is one of K precomputed templates with the uid patched in (`frames.login_frame`).

Pacing. A trio wakeup costs ~50 us of CPU on this machine, and a whole turn ~230 us of fixed cost at 16,000
connections -- as much as a few dozen keepalives -- so a busy loop must not wake once per packet. Turns run
on a grid of 40 ms (``--user-tick``; the wheel's slots lie on it: timers are never late by design, and at most one slot
early): while sockets keep turning ready, the loop sleeps to the next grid point and collects everything at
once; only an idle loop waits on the epoll fd (then on to the grid point after the wakeup) or for the next
timer. A busy worker makes 25 turns a second. Each worker's grid has its own phase (worker w of W starts
its slots w / W of a slot later), so the bursts of keepalives the workers send interleave at the server
instead of coinciding. Reads are seen up to one grid step late: a login's latency is taken from the
kernel's receive timestamp of the welcome (``SO_TIMESTAMPNS``), not from the turn that read it, and the
connect latency is measured around the ``connect()`` itself. TLS handshakes need several round trips, so
while connections are opening over TLS the grid is 2 ms.

What goes on the record is read where it happens: the wall time of each send with `time.time()` just before
the ``send()`` that put the frame in the socket (the last two per session are kept: a pinger the server
closes is reported with them, its close time and the error code, so the coordinator can tell a server's
false offline from the generator's own lateness); the lag of every timer (now minus its due time) and the
duration of every turn into the worker's histograms. A planned *late* session (``--late-fraction``) sends
the first keepalive due after its moment ``late_by`` seconds late, and reports its last send and when the
delayed one is planned; its sends are recorded when they actually happen, like everyone's.

The engine stops by itself: when every session has ended, or ``max_seconds`` after t0, or when cancelled
(the coordinator's ``stop``); then it counts the sessions it cut short and closes every socket. It refuses
any address outside 127.0.0.0/8 before opening anything.
"""

from __future__ import annotations

import math
import select
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Final

import trio

from idled.protocol import DEFAULT_MAX_FRAME, Error, Pong, ProtocolError, Welcome
from idled.tools.loadtest.connect import client_context, error_name
from idled.tools.loadtest.conntable import (
    BYE_WAIT, CONNECTING, DONE, HANDSHAKE, LOGIN, PHASE, SILENT_WAIT, UP, WOULD_BLOCK, ConnTable,
)
from idled.tools.loadtest.dial import (
    SO_TIMESTAMPNS, arrival, check_loopback, connect_error, dial, handshake_step, proxy_header, tls_rest, wrap_tls,
)
from idled.tools.loadtest.frames import past_upgrade
from idled.tools.loadtest.stats import BYE, LATE, SILENT
from idled.tools.loadtest.wheel import Schedule, TimerWheel
from idled.tools.loadtest.wire import wire_for
from idled.tools.loadtest.workerstate import Worker

__all__ = ["run_users", "Engine"]

# timer kinds (low two bits of a wheel entry)
PING, MOMENT, CONNECT_DEADLINE, BYE_DEADLINE = range(4)

SLOT: Final = 0.040  # default wheel slot (--user-tick) and the turns' grid when busy: timers run up to one
PACE_TLS: Final = 0.002  # slot early, never late by design; the grid while TLS handshakes are in flight
BYE_WAIT_S: Final = 10.0  # how long a bye waits for the server to close
RECV_BYTES: Final = 4096


async def run_users(w: Worker) -> None:
    """Run this worker's user sessions until every one has ended, max_seconds passed, or cancellation."""
    await Engine(w).run()


class Engine(ConnTable):
    """Every user connection of one worker process, driven from one trio task (see the module docstring)."""

    def __init__(self, w: Worker) -> None:
        check_loopback(w.host, w.sources)
        super().__init__(w)
        self.moments: dict[int, tuple[int, float]] = {}  # k -> (SILENT | BYE, engine time)
        self.late_at: dict[int, float] = {}  # k -> engine time after which one keepalive goes late
        # each worker's turns on a grid of its own phase: the workers' bursts interleave at the server
        self.slot = float(w.cfg.get("user_tick") or SLOT)
        self.origin = self.slot * w.index / max(1, w.workers)
        self.wheel = TimerWheel(self.slot, self.origin)
        # engine time is time.perf_counter(); trio's clock is the same plus a constant offset
        self.offset = trio.current_time() - time.perf_counter()
        self.wall_offset = time.time() - time.perf_counter()  # wall time = engine time + wall_offset
        self.stamps = True  # SO_TIMESTAMPNS works here (cleared at the first failure)
        self.t0 = w.t0 - self.offset  # engine time of the plan's moment 0
        self.schedule = Schedule(w.keepalive, w.jitter, w.ping_every, w.fast_from - self.offset, w.rng.random)
        self.max_inflight = w.max_inflight
        self.tls: ssl.SSLContext | None = client_context(w.cfg.get("tls_ca")) if w.cfg.get("tls") else None
        self.proxy = bool(w.cfg.get("proxy_protocol"))
        # idled's frames, the same as WebSocket messages (--websocket), or MQTT (--peer mqtt): wire.py
        self.wire = wire = wire_for(w)
        self.ws = wire.name == "websocket"
        self.ping_frame, self.bye_frame, self.pong_frame = wire.ping, wire.bye, wire.pong
        # --ask-one-in N: one keepalive in N (over all the worker's sessions) asks for an answer; 0: none
        self.quiet_frame, self.ask_one_in, self.asked = wire.quiet, int(w.cfg.get("ask_one_in", 1)), 0
        self.closes_are_events = wire.closes_are_events
        self.heads: set[int] = set()  # sessions whose upgrade answer (101) has not arrived yet
        self.max_frame = DEFAULT_MAX_FRAME  # a user reads pongs and errors
        self._load_plan()

    # ------------------------------------------------------------------------------------------ the loop

    async def run(self) -> None:
        w = self.w
        clock = time.perf_counter
        offset = self.offset
        stop_at = self.t0 + w.max_seconds
        try:
            last = clock()
            busy = False
            while self.next_k < self.n or self.live:
                if clock() >= stop_at:
                    w.errors["engine:max_seconds"] += 1
                    break
                # Turns run on a grid of `pace` seconds (the wheel's slots lie on it): the first point after
                # the previous turn, unless the loop is idle -- then it waits for a socket or the next timer.
                pace = PACE_TLS if self.tls is not None and self.inflight else self.slot
                origin = self.origin
                grid = origin + (math.floor((last - origin) / pace) + 1.0) * pace
                wake = min(self._wake(), stop_at)
                if busy or wake <= grid:
                    await trio.sleep_until(grid + offset)
                else:
                    with trio.move_on_at(wake + offset):
                        await trio.lowlevel.wait_readable(self.ep.fileno())
                    now = clock()
                    if now < wake:  # a socket is ready: on to the grid, collecting whatever else comes
                        point = origin + math.ceil((now - origin) / pace) * pace
                        await trio.sleep_until(max(grid, point) + offset)
                last = clock()
                busy = self._turn(last)
                w.turn_hist.record(clock() - last)
        finally:
            self._shutdown()

    def _wake(self) -> float:
        """When the next timer or ramp start is due (inf: none)."""
        t = self.wheel.next_time()
        wake = math.inf if t is None else t
        if self.next_k < self.n and self.inflight < self.max_inflight:
            wake = min(wake, self._start_time(self.next_k))
        return wake

    def _start_time(self, k: int) -> float:
        w = self.w
        return self.t0 + self.index(k) / w.ramp

    def _turn(self, now: float) -> bool:
        """Ready sockets, due timers, ramp starts; True if any socket was ready."""
        events = self.ep.poll(0)
        if events:
            self._ready(events, now)
            now = time.perf_counter()
        self._timers(now)
        self._ramp(now)
        return bool(events)

    def _load_plan(self) -> None:
        w = self.w
        for i, (kind, moment) in w.plan.items():
            k, r = divmod(i - w.index, w.workers)
            if r or not 0 <= k < self.n:
                continue
            if kind == LATE:
                self.late_at[k] = self.t0 + moment
                self.late_planned.add(k)
            elif kind in (SILENT, BYE):
                self.moments[k] = (kind, self.t0 + moment)

    # ------------------------------------------------------------------------------------------- reading

    def _ready(self, events: list[tuple[int, int]], now: float) -> None:
        owner, state, socks, pending, tls = self.owner, self.state, self.socks, self.pending, self.tls
        pong, pongs = self.pong_frame, 0
        for fd, ev in events:
            k = owner.get(fd)
            if k is None:
                continue
            if ev & select.EPOLLOUT and k in self.outq:  # (rare: a socket that would not take a frame)
                self._flush(k)
                if state[k] == DONE or not ev & ~select.EPOLLOUT:
                    continue
            st = state[k]
            if st >= UP:
                try:
                    data = socks[k].recv(RECV_BYTES)  # type: ignore[union-attr]
                    if tls is not None and data:
                        data += self._tls_rest(k)
                except WOULD_BLOCK:
                    continue
                except OSError as exc:
                    self._ended(k, error_name(exc), error=True)
                    continue
                if data == pong and k not in pending:  # the hot path: one pong per keepalive
                    pongs += 1
                    continue
                pongs += self._inbound(k, data, now)
            elif st == CONNECTING:
                self._connected(k)
            elif st == HANDSHAKE:
                self._handshake(k)
            elif st == LOGIN:
                self._login_read(k, now)
        self.w.pongs += pongs

    def _tls_rest(self, k: int) -> bytes:
        return tls_rest(self.socks[k], RECV_BYTES)  # type: ignore[arg-type]

    def _inbound(self, k: int, data: bytes, now: float) -> int:
        """Frames (or EOF) for a logged-in session; returns the pongs among them."""
        if not data:
            self._ended(k, "eof")
            return 0
        try:
            pongs = 0
            for msg in self._messages(k, data):
                if type(msg) is Error:
                    self._ended(k, f"server:{msg.code}")
                    return pongs
                if type(msg) is Pong:
                    pongs += 1
            return pongs
        except ProtocolError as exc:
            self._ended(k, f"protocol:{exc.code}", error=True)
            return 0

    def _messages(self, k: int, data: bytes) -> Iterator[object]:
        """The messages in the session's pending bytes + `data` (a split frame stays pending)."""
        rest = self.pending.pop(k, b"")
        data = rest + data if rest else data
        if k in self.heads:  # --websocket: the upgrade's answer comes first
            after = past_upgrade(data)
            if after is None:
                self.pending[k] = data
                return
            self.heads.discard(k)
            data = after
        bodies, tail = self.wire.cut(data, self.max_frame)
        if tail:
            self.pending[k] = tail
        parse = self.wire.parse
        for body in bodies:
            yield parse(body)

    # ----------------------------------------------------------------------------------------- opening

    def _ramp(self, now: float) -> None:
        w = self.w
        while self.next_k < self.n and self.inflight < self.max_inflight and self._start_time(self.next_k) <= now:
            self._start(self.next_k)
            self.next_k += 1
        if not w.ramp_done and self.next_k == self.n and not self.inflight:
            w.set_ramp_done()

    def _start(self, k: int) -> None:
        w = self.w
        i = self.index(k)
        now = time.perf_counter()  # (not the turn's start: earlier dials in this turn are not this one's latency)
        try:
            sock = dial(w.sources[i % len(w.sources)], w.host, w.port)
        except OSError as exc:
            w.errors[f"connect:{error_name(exc)}"] += 1
            w.failed_records.append(i)
            self.state[k] = DONE
            return
        fd = sock.fileno()
        self.owner[fd] = k
        self.socks[k] = sock
        self.state[k] = CONNECTING
        self.opened[k] = now
        self.wheel.add(k << 2 | CONNECT_DEADLINE, now + w.connect_timeout)
        self.inflight += 1
        self.live += 1
        try:
            sock.getpeername()
        except OSError:  # still connecting: EPOLLOUT will say when
            self.ep.register(fd, select.EPOLLOUT)
            return
        # On loopback the handshake is usually over when connect() returns EINPROGRESS: go on at once,
        # saving an epoll round trip per connection (register, wake, modify).
        self.ep.register(fd, select.EPOLLIN)
        self._connected(k, rearm=False)

    def _connected(self, k: int, rearm: bool = True) -> None:
        """TCP is up: PROXY header, then TLS or the login (`rearm`: switch epoll from EPOLLOUT to EPOLLIN)."""
        sock = self.socks[k]
        assert sock is not None
        try:
            err = connect_error(sock)
            if err:
                raise OSError(err, "connect")
            if self.proxy:
                sock.send(proxy_header(sock, self.w.host, self.w.port))  # 28 bytes, empty buffer: whole
        except OSError as exc:
            self._fail(k, f"connect:{error_name(exc)}")
            return
        if self.tls is None:
            self.connected[k] = time.perf_counter()
            self._send_login(k, rearm)
            return
        try:
            self.socks[k] = wrap_tls(sock, self.tls, self.w.host)
        except (OSError, ValueError) as exc:
            self._fail(k, f"connect:{error_name(exc)}")
            return
        self.state[k] = HANDSHAKE
        self._handshake(k)

    def _handshake(self, k: int) -> None:
        sock = self.socks[k]
        try:
            wait = handshake_step(sock)  # type: ignore[arg-type]
        except OSError as exc:
            self._fail(k, f"connect:{error_name(exc)}")
            return
        if wait:
            self.ep.modify(sock.fileno(), wait)  # type: ignore[union-attr]
            return
        self.connected[k] = time.perf_counter()  # the TLS handshake is part of the connect phase
        self._send_login(k)

    def _send_login(self, k: int, rearm: bool = True) -> None:
        w = self.w
        i = self.index(k)
        self.state[k] = LOGIN
        sock = self.socks[k]
        if rearm:
            self.ep.modify(sock.fileno(), select.EPOLLIN)  # type: ignore[union-attr]
        if self.stamps and self.tls is None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # type: ignore[union-attr]
            except OSError:
                self.stamps = False
        # session i is device "d<i % K>" of uid uid_base + i // K (--devices K)
        frame = self.wire.login(i, w.uid_base + i // w.devices)
        if self.ws:
            self.heads.add(k)
        self._send(k, frame)
        self.sent_prev[k] = self.sent_last[k]

    def _login_read(self, k: int, now: float) -> None:
        sock = self.socks[k]
        arrived = now
        try:
            if self.tls is not None:
                data = sock.recv(RECV_BYTES)  # type: ignore[union-attr]
                if data:
                    data += self._tls_rest(k)
            else:
                data, ancillary, _, _ = sock.recvmsg(RECV_BYTES, 64)  # type: ignore[union-attr]
                arrived = self._arrival(ancillary, now)
        except WOULD_BLOCK:
            return
        except OSError as exc:
            self._fail(k, f"login:{error_name(exc)}")
            return
        if not data:
            self._fail(k, "login:eof_before_welcome")
            return
        try:
            for msg in self._messages(k, data):
                if self.state[k] == UP:  # frames after the welcome in the same read
                    if type(msg) is Error:
                        self._ended(k, f"server:{msg.code}")
                        return
                    continue
                if type(msg) is Welcome:
                    self._welcome(k, msg, arrived)
                elif type(msg) is Error:
                    self._fail(k, f"login:server:{msg.code}")
                    return
                # anything else before the welcome is ignored (lenient client)
        except ProtocolError as exc:
            if self.state[k] == UP:
                self._ended(k, f"protocol:{exc.code}", error=True)
            else:
                self._fail(k, f"login:protocol:{exc.code}")

    def _arrival(self, ancillary: list[tuple[int, int, bytes]], now: float) -> float:
        """When the kernel received the packet just read (engine time), from its SO_TIMESTAMPNS stamp."""
        return arrival(ancillary, now, self.wall_offset)

    def _welcome(self, k: int, hello: Welcome, welcomed: float) -> None:
        """Logged in; `welcomed`: when the welcome arrived (engine time)."""
        w = self.w
        start = self.opened.pop(k)
        welcomed = max(welcomed, start)
        w.connect_hist.record(self.connected.pop(k, welcomed) - start)
        w.login_hist.record(welcomed - start)
        w.logged_in += 1
        w.conns += 1
        w.pinging += 1
        if hello.timeout is not None:
            if w.timeout is None:
                w.timeout = hello.timeout
            elif hello.timeout != w.timeout:
                w.timeouts_differ += 1
        self.inflight -= 1
        self.state[k] = UP
        if self.closes_are_events:  # (MQTT: the CONNACK is the only "online" there is)
            w.online_records.append(self.index(k))
        self._file_next(k, self.schedule.first(welcomed), time.perf_counter())

    # ---------------------------------------------------------------------------------------- timers

    def _file_next(self, k: int, due: float, now: float) -> None:
        """File the session's next keepalive -- or its silent / bye moment, if that comes first."""
        moment = self.moments.get(k)
        if moment is not None and due >= moment[1]:
            self.due[k] = max(moment[1], now)  # (logged in after its moment: not late by our fault)
            self.wheel.add(k << 2 | MOMENT, self.due[k])
            return
        late = self.late_at.get(k)
        if late is not None and due >= late:
            del self.late_at[k]
            w = self.w
            due += w.late_by
            w.late_records.append((self.index(k), self.sent_last[k], time.time() + (due - now)))
        self.due[k] = due
        self.wheel.add(k << 2 | PING, due)

    def _timers(self, now: float) -> None:
        state, due, w = self.state, self.due, self.w
        sent = 0
        for entry in self.wheel.due(now):
            k = entry >> 2
            kind = entry & 3
            st = state[k]
            if kind == PING:
                if st != UP:
                    continue  # ended meanwhile
                w.lag(now - due[k])
                if self._send(k, self._keepalive()):
                    sent += 1
                if state[k] != UP:
                    continue
                nxt = self.schedule.next(due[k])
                self._file_next(k, nxt if nxt > now else now, now)  # fell behind: don't burst to catch up
            elif kind == MOMENT:
                if st == UP:
                    w.lag(now - due[k])
                    self._moment(k, now)
            elif kind == CONNECT_DEADLINE:
                if st in PHASE:
                    self._fail(k, f"{PHASE[st]}:timeout")
            elif st == BYE_WAIT:  # BYE_DEADLINE
                self._close(k, "bye:timeout")
        w.pings += sent
        w.frames += sent

    def _keepalive(self) -> bytes:
        """The next keepalive: a ping (answered) one time in ``--ask-one-in`` N, else the quiet one (0: never)."""
        self.asked += 1
        if self.ask_one_in and self.asked >= self.ask_one_in:
            self.asked = 0
            return self.ping_frame
        return self.quiet_frame

    def _moment(self, k: int, now: float) -> None:
        """The planned moment: go silent (the server must notice), or log out."""
        w = self.w
        kind = self.moments[k][0]
        i = self.index(k)
        w.pinging -= 1
        if kind == SILENT:
            self.state[k] = SILENT_WAIT
            w.silent_records.append((i, self.sent_last[k]))
            return
        self.state[k] = BYE_WAIT
        if self._send(k, self.bye_frame):
            w.frames += 1
            w.bye_records.append((i, self.sent_last[k]))
            self.wheel.add(k << 2 | BYE_DEADLINE, now + BYE_WAIT_S)

