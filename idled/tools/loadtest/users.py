"""User connections of a load-test worker: one TCP connection and one task per session.

Theory of operation
-------------------
Session i (global index; this worker owns i = worker, worker + workers, ...) connects at ``t0 + i /
ramp``, at most `max_inflight` connecting at once, from a loopback source address chosen by i, logs in with
``keepalive = K``, and then loops: read pongs until the next ping is due, at a random phase in (0.05 K, K]
after the welcome and then every ``K * U(1 - jitter, 1 + jitter)``. With ``--ping-every S`` the interval
is S instead from the ramp's planned end on (a session joins that schedule at a random phase), so the
steady phase offers a fixed N / S keepalives per second while every timeout stays 1.5 K. A planned silent
session stops at its moment, reports the wall time of its last frame (ping or login), and keeps the socket
open until the server closes it (idle_timeout): the server has to notice the silence itself. A planned bye
session sends ``bye`` at its moment and reports when it did. The per-connection state is the task's locals and one idle
FrameDecoder (~80 bytes); every read goes through the protocol's one receive loop.

Time: what goes on the record -- the moment a session's last frame was sent, the moment a bye was sent --
is read with `time.time()` just before the `send_all`, the same wall clock the server puts in its events.
"""

from __future__ import annotations

import math
import time

import trio

from idled.protocol import (
    BYE_FRAME, DEFAULT_MAX_FRAME, PING_FRAME, PONG, Error, FrameDecoder, Login, ProtocolError, Welcome, encode,
    parse_server_message, receive_message,
)
from idled.tools.loadtest.connect import RECV_SIZE, LoginFailed, error_name, open_from, welcome
from idled.tools.loadtest.workerstate import Worker
from idled.tools.loadtest.stats import PINGER, SILENT

__all__ = ["run_users"]

_BROKEN = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError)


async def run_users(w: Worker) -> None:
    """Start this worker's sessions on the ramp's schedule; returns when every one has ended."""
    pending = range(w.index, w.sessions, w.workers)
    started = 0
    try:
        async with trio.open_nursery() as nursery:
            for i in pending:
                await trio.sleep_until(w.t0 + i / w.ramp)
                await w.inflight.acquire_on_behalf_of(i)
                nursery.start_soon(_user, w, i)
                started += 1
            w.ramp_done = True
    finally:
        # stopped before the ramp finished: these never tried, and nothing is expected of them
        if started < len(pending):
            w.errors["ramp:not_started"] += len(pending) - started
            w.failed_records.extend(pending[started:])


async def _user(w: Worker, i: int) -> None:
    kind, moment = w.plan.get(i, (PINGER, math.inf))
    decoder = FrameDecoder(DEFAULT_MAX_FRAME, parse=parse_server_message)
    stream: trio.SocketStream | None = None
    try:
        logged_in = await _log_in(w, i, decoder)
        if logged_in is None:
            return
        stream, last_sent, welcomed = logged_in
        w.conns += 1
        w.pinging += 1
        try:
            await _keepalive(w, i, stream, decoder, kind, w.t0 + moment, last_sent, welcomed)
        finally:
            w.conns -= 1
    finally:
        if stream is not None:
            await trio.aclose_forcefully(stream)


async def _log_in(w: Worker, i: int, decoder: FrameDecoder) -> tuple[trio.SocketStream, float, float] | None:
    """Connect and log in: (stream, wall time the login was sent, trio time of the welcome), or None
    (counted and recorded as failed)."""
    uid = w.uid_base + i
    stream: trio.SocketStream | None = None
    phase = "connect"
    done = False
    try:
        start = trio.current_time()
        with trio.fail_after(w.connect_timeout):
            stream = await open_from(w.sources[i % len(w.sources)], w.host, w.port, w.cfg)
            connected = trio.current_time()
            phase = "login"
            last_sent = time.time()
            await stream.send_all(encode(Login("uid", uid, w.token("uid", uid), w.keepalive)))
            hello = await welcome(stream, decoder)
        done = True
    except (LoginFailed, OSError, trio.BrokenResourceError, trio.TooSlowError, ProtocolError) as exc:
        w.errors[f"login:{exc.name}" if isinstance(exc, LoginFailed) else f"{phase}:{error_name(exc)}"] += 1
        w.failed_records.append(i)
        return None
    except trio.Cancelled:
        w.errors[f"{phase}:stopped"] += 1  # the run ended while this one was logging in
        w.failed_records.append(i)
        raise
    finally:
        w.inflight.release_on_behalf_of(i)
        if not done and stream is not None:
            await trio.aclose_forcefully(stream)
    welcomed = trio.current_time()
    w.connect_hist.record(connected - start)
    w.login_hist.record(welcomed - start)
    w.logged_in += 1
    _note_timeout(w, hello)
    return stream, last_sent, welcomed


def _note_timeout(w: Worker, hello: Welcome) -> None:
    if hello.timeout is not None:
        if w.timeout is None:
            w.timeout = hello.timeout
        elif hello.timeout != w.timeout:
            w.timeouts_differ += 1


async def _keepalive(w: Worker, i: int, stream: trio.SocketStream, decoder: FrameDecoder, kind: int,
                     moment_t: float, last_sent: float, welcomed: float) -> None:
    """Ping until the planned moment (forever for a pinger), then go silent or say bye."""
    next_ping = _due(w, welcomed, first=True)
    pinging = True
    try:
        while True:
            wake = next_ping if next_ping < moment_t else moment_t
            with trio.move_on_at(wake):
                while True:  # the per-packet path: one pong per keepalive
                    msg = await receive_message(stream, decoder, RECV_SIZE)
                    if msg is PONG:
                        w.pongs += 1
                    elif msg is None:
                        w.errors["session:eof"] += 1
                        return
                    elif type(msg) is Error:
                        w.errors[f"session:server:{msg.code}"] += 1
                        return
            if wake == moment_t:
                break
            now = trio.current_time()
            w.lag(now - next_ping)
            last_sent = time.time()
            await stream.send_all(PING_FRAME)
            w.pings += 1
            w.frames += 1
            next_ping = _due(w, next_ping)
            if next_ping < now:  # fell behind (overloaded client): don't burst to catch up
                next_ping = now
        # the planned moment: go silent, or log out
        w.pinging -= 1
        pinging = False
        # (a session that logged in after its moment -- a slow ramp -- is not late by the client's fault)
        w.lag(trio.current_time() - max(moment_t, welcomed))
        if kind == SILENT:
            w.silent_records.append((i, last_sent))
            how = await _until_closed(stream, decoder, math.inf)
        else:
            sent = time.time()
            await stream.send_all(BYE_FRAME)
            w.frames += 1
            w.bye_records.append((i, sent))
            how = await _until_closed(stream, decoder, 10.0)
        w.closes[f"{'silent' if kind == SILENT else 'bye'}:{how}"] += 1
    except _BROKEN as exc:
        w.errors[f"session:{error_name(exc)}"] += 1
    finally:
        if pinging:
            w.pinging -= 1


def _due(w: Worker, last: float, first: bool = False) -> float:
    """When the keepalive after the one due at `last` (or after the welcome at `last`, `first`) is due."""
    fast = w.ping_every is not None and last >= w.fast_from
    interval = w.ping_every if fast else w.keepalive
    r = w.rng.random()
    due = last + interval * ((0.05 + 0.95 * r) if first else (1.0 - w.jitter + 2.0 * w.jitter * r))
    if w.ping_every is not None and not fast and due > w.fast_from:
        due = w.fast_from + w.ping_every * (0.05 + 0.95 * w.rng.random())  # join the fast schedule
    return due


async def _until_closed(stream: trio.SocketStream, decoder: FrameDecoder, limit: float) -> str:
    """Read until the server closes; return how it ended (error code, "eof", "timeout")."""
    code = "eof"
    with trio.move_on_after(limit):
        while (msg := await receive_message(stream, decoder, RECV_SIZE)) is not None:
            if type(msg) is Error:
                code = f"server:{msg.code}"
        return code
    return "timeout"
