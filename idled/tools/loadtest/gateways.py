"""Gateway connections of a load-test worker: a few connections carrying many sessions each.

Theory of operation
-------------------
Gateway g (this worker owns g = worker, worker + workers, ...) carries sessions i = g, g + G, g + 2G, ...
One task per gateway runs a timing wheel of its own (`TouchWheel`) with slots of `gateway_tick` seconds
covering one keepalive and its jitter. Every slot it (1) attaches the sessions whose ramp time has come
(``attach`` frames carrying ``keepalive``, first touch a random phase later), then (2) sends one batch of
``touch`` frames for every session in the current slot and re-files each one ``K * U(1 - jitter, 1 +
jitter)`` later. Frames are filled up to the gateway's frame limit (the welcome's ``max_frame`` or 4096). A
silent session is dropped from the wheel at its first slot after its moment; a bye session is
``detach``ed there. A session costs 8 bytes of wheel array: one process drives a million of them. A second
task per gateway reads (pongs, an error frame) through the protocol's one receive loop.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Sequence
from typing import Final

import trio

from idled.protocol import (
    DEFAULT_MAX_FRAME, PING_FRAME, PONG, Attach, Detach, Error, FrameDecoder, Login, ProtocolError, Touch, encode,
    parse_server_message, receive_message,
)
from idled.tools.loadtest.connect import LoginFailed, error_name, open_from, welcome
from idled.tools.loadtest.stats import SILENT
from idled.tools.loadtest.workerstate import Worker

__all__ = ["TouchWheel", "uid_bytes", "uids_per_frame", "chunked", "run_gateways"]

# largest msgpack encoding of an int uid (uint64) and the fixed part of a touch/attach/detach frame
_MAX_UID_BYTES: Final = 9
_FRAME_OVERHEAD: Final = 48
_READ_BYTES: Final = 65536


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


# ------------------------------------------------------------------------------------------- gateways


async def run_gateways(w: Worker) -> None:
    async with trio.open_nursery() as nursery:
        for g in range(w.index, w.gateways, w.workers):
            nursery.start_soon(_gateway, w, g)


async def _gateway(w: Worker, g: int) -> None:
    name = f"{w.name}-g{g}"
    decoder = FrameDecoder(1 << 20, parse=parse_server_message)
    try:
        async with w.inflight:
            start = trio.current_time()
            with trio.fail_after(w.connect_timeout):
                stream = await open_from(w.sources[g % len(w.sources)], w.host, w.port, w.cfg)
                connected = trio.current_time()
                await stream.send_all(encode(Login("gateway", name, w.token("gateway", name))))
                hello = await welcome(stream, decoder)
    except LoginFailed as exc:
        w.errors[f"gateway_login:{exc.name}"] += 1
        w.failed_records.extend(range(g, w.sessions, w.gateways))
        return
    except (OSError, trio.BrokenResourceError, trio.TooSlowError, ProtocolError) as exc:
        w.errors[f"gateway_connect:{error_name(exc)}"] += 1
        w.failed_records.extend(range(g, w.sessions, w.gateways))
        return
    w.connect_hist.record(connected - start)
    w.login_hist.record(trio.current_time() - start)
    w.logged_in += 1
    w.conns += 1
    run = _GatewayRun(w, g, stream, hello.max_frame or DEFAULT_MAX_FRAME)
    try:
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(_reader, w, stream, decoder, nursery.cancel_scope)
            await run.drive()
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        w.errors[f"gateway:{error_name(exc)}"] += 1
    finally:
        w.conns -= 1
        # stopped (or lost) before the ramp finished: these were never attached
        unattached = run.pending[run.attached_upto:]
        if unattached:
            w.errors["ramp:not_attached"] += len(unattached)
            w.failed_records.extend(unattached)


async def _reader(w: Worker, stream: trio.abc.Stream, decoder: FrameDecoder, scope: trio.CancelScope) -> None:
    try:
        while (msg := await receive_message(stream, decoder, _READ_BYTES)) is not None:
            if msg is PONG:
                w.pongs += 1
            elif type(msg) is Error:
                w.errors[f"gateway:server:{msg.code}"] += 1
                scope.cancel()
                return
        w.errors["gateway:eof"] += 1
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
        w.errors[f"gateway:{error_name(exc)}"] += 1
    scope.cancel()  # the gateway is gone: stop feeding it


class _GatewayRun:
    """One gateway's wheel: which of its sessions are attached, and when each one is touched next."""

    def __init__(self, w: Worker, g: int, stream: trio.abc.Stream, max_frame: int) -> None:
        self.w = w
        self.g = g
        self.stream = stream
        self.per_frame = uids_per_frame(max_frame, w.uid_base + w.sessions)
        self.wheel = TouchWheel(int(math.ceil(w.keepalive * (1.0 + w.jitter) / w.gateway_tick)) + 3)
        self.pending = range(g, w.sessions, w.gateways)  # sessions of this gateway, in attach order
        self.attached_upto = 0  # sessions pending[:attached_upto] are attached
        self.last_sent: dict[int, float] = {}  # planned silent / bye sessions only: wall time of the last frame
        self.last_frame = trio.current_time()

    async def drive(self) -> None:
        w = self.w
        dt = w.gateway_tick
        ping_every = min(5.0, w.keepalive / 2.0)
        slot = 0
        while True:
            due_at = w.t0 + slot * dt
            await trio.sleep_until(due_at)
            now = trio.current_time()
            w.lag(now - due_at)
            rel = now - w.t0
            await self._attach(slot, rel, now)
            await self._touch(slot, rel, now)
            if now - self.last_frame >= ping_every:  # a gateway with nothing due still shows it is alive
                await self.stream.send_all(PING_FRAME)
                w.frames += 1
                self.last_frame = now
            slot += 1

    async def _attach(self, slot: int, rel: float, now: float) -> None:
        """Attach the sessions whose ramp time has come (session i at i / ramp), first touch at a random phase."""
        w, g, gw = self.w, self.g, self.w.gateways
        upto = min(len(self.pending), max(0, math.floor((rel * w.ramp - g) / gw) + 1))
        if upto <= self.attached_upto:
            return
        k, dt, rand, plan = w.keepalive, w.gateway_tick, w.rng.random, w.plan
        batch = self.pending[self.attached_upto:upto]
        for chunk in chunked(batch, self.per_frame):
            uids = tuple(w.uid_base + i for i in chunk)
            sent = time.time()
            await self.stream.send_all(encode(Attach(uids, k)))
            w.frames += 1
            for i in chunk:
                if i in plan:
                    self.last_sent[i] = sent
                self.wheel.add(i, slot + 1 + int(k * (0.05 + 0.95 * rand()) / dt))
        self.attached_upto = upto
        w.attached += len(batch)
        w.pinging += len(batch)
        self.last_frame = now
        if upto == len(self.pending):
            w.gateway_ramped()

    async def _touch(self, slot: int, rel: float, now: float) -> None:
        """Touch this slot's sessions, re-filing each one interval later; drop the silent, detach the byes."""
        due = self.wheel.take(slot)
        if not due:
            return
        w = self.w
        k, j, dt, rand, plan, base = w.keepalive, w.jitter, w.gateway_tick, w.rng.random, w.plan, w.uid_base
        touch: list[int] = []
        special_touched: list[tuple[int, int]] = []  # (session, position in `touch`)
        detach: list[int] = []
        for i in due:
            entry = plan.get(i)
            if entry is not None:
                if rel >= entry[1]:
                    w.pinging -= 1
                    if entry[0] == SILENT:
                        w.silent_records.append((i, self.last_sent[i]))
                    else:
                        detach.append(i)
                    continue
                special_touched.append((i, len(touch)))
            touch.append(i)
            self.wheel.add(i, slot + max(1, int(k * (1.0 - j + 2.0 * j * rand()) / dt)))
        if touch:
            chunk_sent: list[float] = []
            for chunk in chunked(touch, self.per_frame):
                chunk_sent.append(time.time())
                await self.stream.send_all(encode(Touch(tuple([base + i for i in chunk]))))
                w.frames += 1
            w.pings += len(touch)
            self.last_frame = now
            for i, pos in special_touched:
                self.last_sent[i] = chunk_sent[pos // self.per_frame]
        for chunk in chunked(detach, self.per_frame):
            sent = time.time()
            await self.stream.send_all(encode(Detach(tuple(base + i for i in chunk))))
            w.frames += 1
            for i in chunk:
                w.bye_records.append((i, sent))
