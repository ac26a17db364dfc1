"""The load test's observer connection: every presence event, in order, handed to a callback.

Theory of operation
-------------------
`Observer.connect()` logs in as an observer and sends ``subscribe`` and a ``ping``. The protocol has no
acknowledgement for ``subscribe``, but the server answers an observer's frames in order: the ``pong`` proves
the subscription is in place. Only then does `fence()` log a probe user in (a str uid, which no session of
the run uses) -- before it, through an edge, the probe's login could reach the core ahead of the subscribe
relayed by another edge, and its event would be missed -- and wait until the observer has read that user's
online event. Events reach an observer in the order the server emitted them, so once the probe's event is
read, every event emitted before the probe logged in has been read too. The coordinator fences once before
the first session connects (no event of the run can be missed) and once when the measurement ends (every
event up to that moment has been matched), then closes the observer before tearing the sessions down.

`run()` reads until cancelled, recording each event's delivery delay (read time minus its ``ts``); it pings
every `ping_interval` seconds so that a server that times out silent observers keeps this one, and it checks
the sequence numbers: gaps (events never delivered) and duplicates (skipped) are counted. A server drops an
observer that falls behind with ``busy``; the observer then reconnects and subscribes ``from`` its last seq
+ 1, so the stream resumes without a gap (the server replays what it missed). Any other error frame or EOF
ends the stream: `lost` says why, and the run is then not to be trusted.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import trio

from idled.protocol import (
    BYE_FRAME, PING_FRAME, PONG, Error, Event, FrameDecoder, Login, ProtocolError, Subscribe, Welcome, encode,
    parse_server_message, receive_message,
)
from idled.tools.loadtest.connect import open_from
from idled.tools.loadtest.histogram import Histogram

__all__ = ["Observer", "ObserverLost"]

_probe_numbers = itertools.count(1)
_WELCOME_BYTES = 65536
_READ_BYTES = 1 << 18


class ObserverLost(Exception):
    pass


class _CountingStream:
    """Counts reads (the ``reads`` figure: events per read shows how far behind the observer ran)."""

    __slots__ = ("_stream", "reads")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self.reads = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        self.reads += 1
        return await self._stream.receive_some(max_bytes)


class Observer:
    def __init__(self, host: str, port: int, on_event: Callable[[Event], None], *, name: str | None = None,
                 token: Callable[[str, str], str | None] | None = None, keepalive: float = 30.0,
                 ping_interval: float = 0.5, max_resubscribes: int = 1000,
                 front: Mapping[str, Any] | None = None) -> None:
        self.host = host
        self.front = front  # TLS / PROXY, as the users connect (connect.open_from)
        self.port = port
        self.on_event = on_event
        self.name = name or f"loadtest-{os.getpid()}"
        self._token = token or (lambda role, name: None)
        self.keepalive = keepalive
        self.ping_interval = ping_interval
        self._stream: trio.abc.Stream | None = None
        self._decoder = FrameDecoder(1 << 20, parse=parse_server_message)
        self._waiting: dict[str, trio.Event] = {}  # probe uid -> set when its online event is read
        self.events = 0
        self.last_seq: int | None = None
        self.seq_gaps = 0  # events missing between consecutive sequence numbers
        self.seq_duplicates = 0  # events seen twice (skipped)
        self.resubscribes = 0
        self.max_resubscribes = max_resubscribes
        self.reads = 0
        self.last_delay: float | None = None  # delivery delay of the latest event read: how far behind
        self.lost: str | None = None
        self._subscribed = trio.Event()  # the pong to the ping after the first subscribe was read
        # wall time an event was read minus its ts: the server's delivery delay plus our own reading delay
        self.delivery = Histogram()

    async def connect(self) -> None:
        self._stream = await self._open(None)

    async def _open(self, from_seq: int | None) -> trio.abc.Stream:
        stream = await open_from("127.0.0.1", self.host, self.port, self.front)
        decoder = FrameDecoder(1 << 20, parse=parse_server_message)
        try:
            await stream.send_all(encode(Login("observer", self.name, self._token("observer", self.name))))
            with trio.fail_after(10):
                while True:
                    msg = await receive_message(stream, decoder, _WELCOME_BYTES)
                    if msg is None:
                        raise ObserverLost("server closed the observer connection before welcome")
                    if type(msg) is Welcome:
                        break
                    if type(msg) is Error:
                        raise ObserverLost(f"observer login refused: {msg.code}: {msg.reason}")
            await stream.send_all(encode(Subscribe(from_seq)) + PING_FRAME)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        self._decoder = decoder
        return stream

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read events until cancelled or the stream ends for good (then `lost` says why).

        A server that drops this observer for falling behind (``busy``) is asked to resume from the next
        sequence number, on a new connection, up to `max_resubscribes` times: nothing is lost or repeated.
        """
        assert self._stream is not None, "connect() first"
        task_status.started()
        try:
            while True:
                reason = await self._read(self._stream)
                await trio.aclose_forcefully(self._stream)
                if (reason.startswith("server:busy") and self.last_seq is not None
                        and self.resubscribes < self.max_resubscribes):
                    self.resubscribes += 1
                    try:
                        self._stream = await self._open(self.last_seq + 1)
                        continue
                    except (OSError, ObserverLost, trio.TooSlowError) as exc:
                        reason = f"{reason}; resubscribing failed: {exc}"
                self.lost = reason
                self._stream = None
                return
        finally:
            self._subscribed.set()
            for waiter in self._waiting.values():
                waiter.set()  # nobody waits forever on a dead observer

    async def _read(self, stream: trio.abc.Stream) -> str:
        """Read one connection's events until it ends; return why it ended."""
        decoder = self._decoder
        on_event = self.on_event
        record_delivery = self.delivery.record
        wall = time.time
        waiting = self._waiting
        counted = _CountingStream(stream)
        reason = "eof"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pinger, stream)
            try:
                while (msg := await receive_message(counted, decoder, _READ_BYTES)) is not None:
                    if type(msg) is Event:
                        last = self.last_seq
                        if last is not None and msg.seq <= last:
                            self.seq_duplicates += 1
                            continue
                        if last is not None and msg.seq != last + 1:
                            self.seq_gaps += msg.seq - last - 1
                        self.last_seq = msg.seq
                        self.events += 1
                        self.last_delay = wall() - msg.ts
                        record_delivery(self.last_delay)
                        if type(msg.uid) is str and msg.uid in waiting:
                            waiting[msg.uid].set()
                        on_event(msg)
                    elif msg is PONG:
                        self._subscribed.set()
                    elif type(msg) is Error:
                        reason = f"server:{msg.code}: {msg.reason}"
                        break
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            self.reads += counted.reads
            nursery.cancel_scope.cancel()
        return reason

    async def _pinger(self, stream: trio.abc.Stream) -> None:
        try:
            while True:
                await trio.sleep(self.ping_interval)
                await stream.send_all(PING_FRAME)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def fence(self, timeout: float = 15.0, source: str = "127.0.0.1") -> float | None:
        """Log a probe user in and out; return how long its online event took to arrive, None on timeout."""
        uid = f"loadtest-probe-{os.getpid()}-{next(_probe_numbers)}"
        seen = trio.Event()
        self._waiting[uid] = seen
        start = time.monotonic()
        try:
            with trio.move_on_after(timeout):
                await self._subscribed.wait()
                stream = await open_from(source, self.host, self.port, self.front)
                async with stream:
                    await stream.send_all(encode(Login("uid", uid, self._token("uid", uid), self.keepalive)))
                    await seen.wait()
                    if self.lost:
                        return None
                    elapsed = time.monotonic() - start
                    await stream.send_all(BYE_FRAME)
                    return elapsed
            return None
        finally:
            del self._waiting[uid]

    async def aclose(self) -> None:
        if self._stream is not None:
            try:
                with trio.move_on_after(1):
                    await self._stream.send_all(BYE_FRAME)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            await trio.aclose_forcefully(self._stream)
            self._stream = None
