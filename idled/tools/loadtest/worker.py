"""One load-generator worker process: many user connections, or a few gateways carrying many sessions.

Theory of operation
-------------------
The coordinator starts `python -m idled.tools.loadtest.worker`, writes its configuration (a map) on the worker's
stdin, waits for ``{"t": "ready"}`` on its stdout, then sends ``{"t": "start", "t0": WALL}``: moment 0 of
the plan, shared by every worker. Later ``{"t": "stop"}`` (or EOF) ends the run: every connection is
closed, a final report with the latency histograms is written, and the process exits.

Time: the plan is in seconds after t0 (wall clock); each worker converts it to trio time once
(``t0_trio = t0 - (time.time() - trio.current_time())``) and schedules on trio's monotonic clock. What goes
on the record -- the moment a session's last frame was sent, the moment a bye was sent -- is read with
`time.time()` just before the `send_all`, the same wall clock the server puts in its events.

**Users** (``mode = "users"``). Session i (global index; this worker owns i = worker, worker + workers, ...)
connects at ``t0 + i / ramp``: one task per connection, at most `max_inflight` connecting at once. A task
binds a loopback source address (``127.0.0.x``, chosen by i) before connecting -- with
IP_BIND_ADDRESS_NO_PORT, so the ephemeral port is chosen per (source, destination) by connect() -- logs in
with ``keepalive = K``, and then loops: sleep, reading pongs, until the next ping is due, at a random
phase in (0.05 K, K] after the welcome and then every ``K * U(1 - jitter, 1 + jitter)``. A planned silent
session stops at its moment, reports the wall time of its last frame (ping or login), and keeps the socket
open until the server closes it (idle_timeout): the server has to notice the silence itself. A planned bye
session sends ``bye`` at its moment and reports when it did. The per-connection state is the task's locals
and one idle FrameDecoder (~80 bytes).

**Gateways** (``mode = "gateways"``). Gateway g (this worker owns g = worker, worker + workers, ...) carries
sessions i = g, g + G, g + 2G, ... One task per gateway runs a timing wheel of its own with slots of
`gateway_tick` seconds covering one keepalive and its jitter: every slot it attaches the sessions whose
ramp time has come (``attach`` frames carrying ``keepalive``, first touch a random phase later), then sends
one batch of ``touch`` frames for every session in the current slot and re-files each one ``K * U(1 -
jitter, 1 + jitter)`` later. Frames are filled up to the gateway's frame limit (the welcome's ``max_frame``
or 4096). A silent session is dropped from the wheel at its first slot after its moment; a bye session is
``detach``ed there. A session costs 8 bytes of wheel array: one process drives a million of them.

Reports (``{"t": "report", ...}``) go to the coordinator every `report_interval` seconds from one task;
records (silent, bye, failed) accumulate in lists bounded by the number of sessions between reports, so a
slow coordinator delays reports but never the pings.
"""

from __future__ import annotations

import errno
import math
import os
import random
import socket
import sys
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

import trio

from idled.tools.loadtest import ipc
from idled.tools.loadtest.stats import PINGER, SILENT, Histogram
from idled.protocol import (
    BYE_FRAME, DEFAULT_MAX_FRAME, NEED_DATA, PING_FRAME, PONG, Attach, Detach, Error, FrameDecoder, Login,
    ProtocolError, Touch, Welcome, encode, parse_server_message,
)

__all__ = ["Worker", "TouchWheel", "uid_bytes", "uids_per_frame", "chunked", "error_name", "main"]

# Linux: defer the ephemeral port choice from bind() to connect(), which then only needs the 4-tuple to be
# unique: ports can be reused across destinations (e.g. a new server port per --compare run).
IP_BIND_ADDRESS_NO_PORT: Final = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
RECV_SIZE: Final = 4096
# largest msgpack encoding of an int uid (uint64) and the fixed part of a touch/attach/detach frame
_MAX_UID_BYTES: Final = 9
_FRAME_OVERHEAD: Final = 48


# ---------------------------------------------------------------------------------------- pure helpers


def uid_bytes(largest_uid: int) -> int:
    """Bytes msgpack needs for a non-negative int up to `largest_uid`."""
    if largest_uid < 128:
        return 1
    if largest_uid < 256:
        return 2
    if largest_uid < 65536:
        return 3
    if largest_uid < 2**32:
        return 5
    return _MAX_UID_BYTES


def uids_per_frame(max_frame: int, largest_uid: int, cap: int = 65536) -> int:
    """How many int uids fit in one touch / attach / detach frame under `max_frame` (body bytes)."""
    return max(1, min(cap, (max_frame - _FRAME_OVERHEAD) // uid_bytes(largest_uid)))


def chunked(items: Sequence[int], size: int) -> list[Sequence[int]]:
    return [items[k : k + size] for k in range(0, len(items), size)]


def error_name(exc: BaseException) -> str:
    """A short, countable name for a failure: the errno name where there is one."""
    while True:
        if isinstance(exc, OSError) and exc.errno:
            return errno.errorcode.get(exc.errno, f"errno{exc.errno}")
        if isinstance(exc, trio.TooSlowError):
            return "timeout"
        if isinstance(exc, ProtocolError):
            return f"protocol:{exc.code}"
        cause = exc.__cause__ or exc.__context__
        if cause is None or cause is exc:
            return type(exc).__name__
        exc = cause


class TouchWheel:
    """Slots of `width` seconds over a ring long enough for one interval; pure (no clock, no I/O).

    `add(i, slot)` files session i into absolute slot number `slot` (which must be within `slots` of the
    cursor), `take(slot)` returns and empties the sessions filed there.
    """

    __slots__ = ("slots", "_ring")

    def __init__(self, slots: int) -> None:
        if slots < 2:
            raise ValueError("a wheel needs at least 2 slots")
        self.slots = slots
        self._ring = [array("q") for _ in range(slots)]

    def add(self, index: int, slot: int) -> None:
        self._ring[slot % self.slots].append(index)

    def take(self, slot: int) -> array:
        k = slot % self.slots
        due = self._ring[k]
        self._ring[k] = array("q")
        return due

    def __len__(self) -> int:
        return sum(len(a) for a in self._ring)


# ------------------------------------------------------------------------------------------- the worker


class _Failed(Exception):
    """A connection could not log in; `name` is what to count."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Worker:
    """State and counters of one worker process. Everything here runs on one trio loop."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.index: int = cfg["worker"]
        self.workers: int = cfg["workers"]
        self.mode: str = cfg["mode"]
        self.host: str = cfg["host"]
        self.port: int = cfg["port"]
        self.sources: list[str] = cfg["sources"]
        self.uid_base: int = cfg["uid_base"]
        self.sessions: int = cfg["sessions"]
        self.keepalive: float = cfg["keepalive"]
        self.jitter: float = cfg["jitter"]
        self.ramp: float = cfg["ramp"]
        self.connect_timeout: float = cfg["connect_timeout"]
        self.plan: dict[int, tuple[int, float]] = {int(k): (int(v[0]), float(v[1])) for k, v in cfg["plan"].items()}
        self.gateways: int = cfg.get("gateways", 0)
        self.gateway_tick: float = cfg.get("gateway_tick", 0.05)
        self.secret: bytes | None = bytes.fromhex(cfg["secret"]) if cfg.get("secret") else None
        self.rng = random.Random(cfg.get("seed", 0) * 1000 + self.index)
        self.inflight = trio.CapacityLimiter(cfg.get("max_inflight", 500))
        self.name = cfg.get("name", f"loadtest-{os.getpid()}")
        self.t0 = 0.0  # trio time of the plan's moment 0
        # counters (cumulative)
        self.conns = 0  # connections logged in and open now
        self.logged_in = 0
        self.attached = 0  # gateway sessions attached
        self.pinging = 0  # sessions currently kept alive
        self.pings = 0  # session keepalives sent (pings, or uids touched)
        self.frames = 0
        self.pongs = 0
        self.lag_max = 0.0  # how late a ping / slot ran behind its schedule (client overload)
        self.errors: Counter[str] = Counter()
        self.closes: Counter[str] = Counter()  # how silent / bye connections ended (expected)
        self.timeout: float | None = None
        self.timeouts_differ = 0
        self.ramp_done = False
        self._gateways_ramped = 0
        self._gw_attached: dict[int, int] = {}  # gateway -> sessions attached so far
        self.connect_hist = Histogram()
        self.login_hist = Histogram()
        # records since the last report
        self.silent_records: list[tuple[int, float]] = []
        self.bye_records: list[tuple[int, float]] = []
        self.failed_records: list[int] = []

    # -- helpers --

    def token(self, role: str, name: str | int) -> str | None:
        if self.secret is None:
            return None
        from idled.protocol.tokens import mint  # only when auth is on

        return mint(self.secret, role, name, time.time() + 7 * 86400)

    def _lag(self, late: float) -> None:
        if late > self.lag_max:
            self.lag_max = late

    def report(self, final: bool = False) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "t": "final" if final else "report", "worker": self.index, "wall": time.time(), "conns": self.conns,
            "logged_in": self.logged_in, "attached": self.attached, "pinging": self.pinging, "pings": self.pings,
            "frames": self.frames, "pongs": self.pongs, "lag_max": self.lag_max, "errors": dict(self.errors),
            "closes": dict(self.closes), "timeout": self.timeout, "timeouts_differ": self.timeouts_differ,
            "ramp_done": self.ramp_done, "silent": self.silent_records, "bye": self.bye_records,
            "failed": self.failed_records,
        }
        self.silent_records, self.bye_records, self.failed_records = [], [], []
        if final:
            msg["connect_hist"] = self.connect_hist.to_dict()
            msg["login_hist"] = self.login_hist.to_dict()
        return msg

    async def _open(self, source: str) -> trio.SocketStream:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            try:
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            except OSError:
                pass  # not Linux: bind() picks the port, fine below ~28k connections per source
            await sock.bind((source, 0))
            await sock.connect((self.host, self.port))
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)

    @staticmethod
    async def _welcome(stream: trio.SocketStream, decoder: FrameDecoder) -> Welcome:
        while True:
            msg = decoder.next_event()
            if msg is NEED_DATA:
                data = await stream.receive_some(RECV_SIZE)
                if not data:
                    raise _Failed("eof_before_welcome")
                decoder.receive_data(data)
                continue
            if type(msg) is Welcome:
                return msg
            if type(msg) is Error:
                raise _Failed(f"server:{msg.code}")
            # anything else before the welcome is ignored (lenient client)

    # -- users --

    async def run_users(self) -> None:
        n, w = self.sessions, self.workers
        pending = range(self.index, n, w)
        started = 0
        try:
            async with trio.open_nursery() as nursery:
                for i in pending:
                    await trio.sleep_until(self.t0 + i / self.ramp)
                    await self.inflight.acquire_on_behalf_of(i)
                    nursery.start_soon(self._user, i)
                    started += 1
                self.ramp_done = True
        finally:
            # stopped before the ramp finished: these never tried, and nothing is expected of them
            if started < len(pending):
                self.errors["ramp:not_started"] += len(pending) - started
                self.failed_records.extend(pending[started:])

    async def _user(self, i: int) -> None:
        uid = self.uid_base + i
        kind, moment = self.plan.get(i, (PINGER, math.inf))
        moment_t = self.t0 + moment
        decoder = FrameDecoder(DEFAULT_MAX_FRAME, parse=parse_server_message)
        stream: trio.SocketStream | None = None
        phase = "connect"
        try:
            try:
                start = trio.current_time()
                with trio.fail_after(self.connect_timeout):
                    stream = await self._open(self.sources[i % len(self.sources)])
                    connected = trio.current_time()
                    phase = "login"
                    last_sent = time.time()
                    await stream.send_all(encode(Login("uid", uid, self.token("uid", uid), self.keepalive)))
                    welcome = await self._welcome(stream, decoder)
            except _Failed as exc:
                self.errors[f"login:{exc.name}"] += 1
                self.failed_records.append(i)
                return
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, ProtocolError) as exc:
                self.errors[f"{phase}:{error_name(exc)}"] += 1
                self.failed_records.append(i)
                return
            except trio.Cancelled:
                self.errors[f"{phase}:stopped"] += 1  # the run ended while this one was logging in
                self.failed_records.append(i)
                raise
            finally:
                self.inflight.release_on_behalf_of(i)
            welcomed = trio.current_time()
            self.connect_hist.record(connected - start)
            self.login_hist.record(welcomed - start)
            self.logged_in += 1
            self.conns += 1
            self.pinging += 1
            if welcome.timeout is not None:
                if self.timeout is None:
                    self.timeout = welcome.timeout
                elif welcome.timeout != self.timeout:
                    self.timeouts_differ += 1
            try:
                await self._keepalive(i, stream, decoder, kind, moment_t, last_sent, welcomed)
            finally:
                self.conns -= 1
        finally:
            if stream is not None:
                await trio.aclose_forcefully(stream)

    async def _keepalive(self, i: int, stream: trio.SocketStream, decoder: FrameDecoder, kind: int,
                         moment_t: float, last_sent: float, welcomed: float) -> None:
        k, j = self.keepalive, self.jitter
        rand = self.rng.random
        next_ping = welcomed + k * (0.05 + 0.95 * rand())
        pinging = True
        try:
            while True:
                wake = next_ping if next_ping < moment_t else moment_t
                with trio.move_on_at(wake):
                    while True:
                        data = await stream.receive_some(RECV_SIZE)
                        if not data:
                            self.errors["session:eof"] += 1
                            return
                        decoder.receive_data(data)
                        while (msg := decoder.next_event()) is not NEED_DATA:
                            if msg is PONG:
                                self.pongs += 1
                            elif type(msg) is Error:
                                self.errors[f"session:server:{msg.code}"] += 1
                                return
                if wake == moment_t:
                    break
                now = trio.current_time()
                self._lag(now - next_ping)
                last_sent = time.time()
                await stream.send_all(PING_FRAME)
                self.pings += 1
                self.frames += 1
                next_ping += k * (1.0 - j + 2.0 * j * rand())
                if next_ping < now:  # fell behind (overloaded client): don't burst to catch up
                    next_ping = now
            # the planned moment: go silent, or log out
            self.pinging -= 1
            pinging = False
            # (a session that logged in after its moment -- a slow ramp -- is not late by the client's fault)
            self._lag(trio.current_time() - max(moment_t, welcomed))
            if kind == SILENT:
                self.silent_records.append((i, last_sent))
                how = await self._until_closed(stream, decoder, math.inf)
            else:
                sent = time.time()
                await stream.send_all(BYE_FRAME)
                self.frames += 1
                self.bye_records.append((i, sent))
                how = await self._until_closed(stream, decoder, 10.0)
            self.closes[f"{'silent' if kind == SILENT else 'bye'}:{how}"] += 1
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
            self.errors[f"session:{error_name(exc)}"] += 1
        finally:
            if pinging:
                self.pinging -= 1

    @staticmethod
    async def _until_closed(stream: trio.SocketStream, decoder: FrameDecoder, limit: float) -> str:
        """Read until the server closes; return how it ended (error code, "eof", "timeout")."""
        code = "eof"
        with trio.move_on_after(limit):
            while True:
                data = await stream.receive_some(RECV_SIZE)
                if not data:
                    return code
                decoder.receive_data(data)
                while (msg := decoder.next_event()) is not NEED_DATA:
                    if type(msg) is Error:
                        code = f"server:{msg.code}"
        return "timeout"

    # -- gateways --

    async def run_gateways(self) -> None:
        mine = list(range(self.index, self.gateways, self.workers))
        async with trio.open_nursery() as nursery:
            for g in mine:
                nursery.start_soon(self._gateway, g)

    async def _gateway(self, g: int) -> None:
        name = f"{self.name}-g{g}"
        decoder = FrameDecoder(1 << 20, parse=parse_server_message)
        try:
            async with self.inflight:
                start = trio.current_time()
                with trio.fail_after(self.connect_timeout):
                    stream = await self._open(self.sources[g % len(self.sources)])
                    connected = trio.current_time()
                    await stream.send_all(encode(Login("gateway", name, self.token("gateway", name))))
                    welcome = await self._welcome(stream, decoder)
        except _Failed as exc:
            self.errors[f"gateway_login:{exc.name}"] += 1
            self._fail_gateway(g)
            return
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, ProtocolError) as exc:
            self.errors[f"gateway_connect:{error_name(exc)}"] += 1
            self._fail_gateway(g)
            return
        self.connect_hist.record(connected - start)
        self.login_hist.record(trio.current_time() - start)
        self.logged_in += 1
        self.conns += 1
        try:
            async with stream, trio.open_nursery() as nursery:
                nursery.start_soon(self._gateway_reader, stream, decoder, nursery.cancel_scope)
                await self._gateway_wheel(g, stream, welcome.max_frame or DEFAULT_MAX_FRAME)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.errors[f"gateway:{error_name(exc)}"] += 1
        finally:
            self.conns -= 1
            # stopped (or lost) before the ramp finished: these were never attached
            unattached = range(g, self.sessions, self.gateways)[self._gw_attached.get(g, 0):]
            if unattached:
                self.errors["ramp:not_attached"] += len(unattached)
                self.failed_records.extend(unattached)

    def _fail_gateway(self, g: int) -> None:
        self.failed_records.extend(range(g, self.sessions, self.gateways))

    async def _gateway_reader(self, stream: trio.SocketStream, decoder: FrameDecoder, scope: trio.CancelScope) -> None:
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    self.errors["gateway:eof"] += 1
                    break
                decoder.receive_data(data)
                while (msg := decoder.next_event()) is not NEED_DATA:
                    if msg is PONG:
                        self.pongs += 1
                    elif type(msg) is Error:
                        self.errors[f"gateway:server:{msg.code}"] += 1
                        scope.cancel()
                        return
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
            self.errors[f"gateway:{error_name(exc)}"] += 1
        scope.cancel()  # the gateway is gone: stop feeding it

    async def _gateway_wheel(self, g: int, stream: trio.SocketStream, max_frame: int) -> None:
        k, j, dt = self.keepalive, self.jitter, self.gateway_tick
        base = self.uid_base
        per_frame = uids_per_frame(max_frame, base + self.sessions)
        wheel = TouchWheel(int(math.ceil(k * (1.0 + j) / dt)) + 3)
        rand = self.rng.random
        plan = self.plan
        gw = self.gateways
        pending = range(g, self.sessions, gw)  # sessions of this gateway, in attach order
        attached_upto = 0  # sessions pending[:attached_upto] are attached
        last_sent: dict[int, float] = {}  # planned silent / bye sessions only: wall time of the last frame
        ping_every = min(5.0, k / 2.0)
        last_frame = trio.current_time()
        slot = 0
        while True:
            due_at = self.t0 + slot * dt
            await trio.sleep_until(due_at)
            now = trio.current_time()
            self._lag(now - due_at)
            rel = now - self.t0
            # 1. attach the sessions whose ramp time has come: session i at i / ramp
            upto = min(len(pending), max(0, math.floor((rel * self.ramp - g) / gw) + 1))
            if upto > attached_upto:
                batch = pending[attached_upto:upto]
                for chunk in chunked(batch, per_frame):
                    uids = tuple(base + i for i in chunk)
                    sent = time.time()
                    await stream.send_all(encode(Attach(uids, k)))
                    self.frames += 1
                    for i in chunk:
                        if i in plan:
                            last_sent[i] = sent
                        wheel.add(i, slot + 1 + int(k * (0.05 + 0.95 * rand()) / dt))
                attached_upto = upto
                self._gw_attached[g] = upto
                self.attached += len(batch)
                self.pinging += len(batch)
                last_frame = now
                if attached_upto == len(pending):
                    self._gateways_ramped += 1
                    self.ramp_done = self._gateways_ramped == len(range(self.index, gw, self.workers))
            # 2. touch this slot's sessions, re-filing each one interval later
            due = wheel.take(slot)
            if due:
                touch: list[int] = []
                special_touched: list[tuple[int, int]] = []  # (session, position in `touch`)
                detach: list[int] = []
                for i in due:
                    entry = plan.get(i)
                    if entry is not None:
                        if rel >= entry[1]:
                            self.pinging -= 1
                            if entry[0] == SILENT:
                                self.silent_records.append((i, last_sent[i]))
                            else:
                                detach.append(i)
                            continue
                        special_touched.append((i, len(touch)))
                    touch.append(i)
                    wheel.add(i, slot + max(1, int(k * (1.0 - j + 2.0 * j * rand()) / dt)))
                if touch:
                    chunk_sent: list[float] = []
                    for chunk in chunked(touch, per_frame):
                        chunk_sent.append(time.time())
                        await stream.send_all(encode(Touch(tuple([base + i for i in chunk]))))
                        self.frames += 1
                    self.pings += len(touch)
                    last_frame = now
                    for i, pos in special_touched:
                        last_sent[i] = chunk_sent[pos // per_frame]
                for chunk in chunked(detach, per_frame):
                    sent = time.time()
                    await stream.send_all(encode(Detach(tuple(base + i for i in chunk))))
                    self.frames += 1
                    for i in chunk:
                        self.bye_records.append((i, sent))
            if now - last_frame >= ping_every:
                await stream.send_all(PING_FRAME)
                self.frames += 1
                last_frame = now
            slot += 1

    # -- the process --

    async def serve(self, control: ipc.Reader, out: trio.abc.SendStream) -> None:
        await ipc.send(out, {"t": "ready", "worker": self.index, "pid": os.getpid()})
        start = await control.recv()
        if not start or start.get("t") != "start":
            return
        self.t0 = trio.current_time() + (float(start["t0"]) - time.time())
        interval = float(self.cfg.get("report_interval", 0.5))
        async with trio.open_nursery() as outer:

            async def reporter() -> None:
                while True:
                    await trio.sleep(interval)
                    with trio.CancelScope(shield=True):  # a frame cut in half would garble the pipe
                        await ipc.send(out, self.report())

            outer.start_soon(reporter)
            async with trio.open_nursery() as sessions:

                async def until_stop() -> None:
                    while True:
                        msg = await control.recv()
                        if msg is None or msg.get("t") == "stop":
                            sessions.cancel_scope.cancel()
                            return

                sessions.start_soon(until_stop)
                if self.mode == "users":
                    await self.run_users()
                else:
                    await self.run_gateways()
            outer.cancel_scope.cancel()
        await ipc.send(out, self.report(final=True))


async def _amain() -> None:
    control = ipc.Reader(trio.lowlevel.FdStream(os.dup(0)))
    out = trio.lowlevel.FdStream(os.dup(1))
    cfg = await control.recv()
    if cfg is None:
        return
    await Worker(cfg).serve(control, out)


def main() -> int:
    sys.stdout = sys.stderr  # fd 1 carries the reports: nothing else may write there
    try:
        trio.run(_amain)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
