"""What the server sends a gateway on its own initiative: session-ended notices and mark requests.

Theory of operation
-------------------
A gateway that logged in with ``"ended": true`` and/or ``"marks": true`` gets an ``Outbox``; its second task
(``run(stream)``, beside the one reading its frames) is the only one that writes on its own initiative.

*Ended notices.* Whenever the server ends one of the gateway's sessions -- the tick task (``idle_timeout``),
a newer login elsewhere (``kicked``), shutdown (``server_shutdown``) -- ``Gateway.release`` calls
``add(uid, code)``, which only files the uid under its reason (``idle``, ``kicked``, ``shutdown``): no I/O on
the caller's path, which may be the tick task expiring thousands of sessions in one slice. The task sends
them ``FLUSH_INTERVAL`` after the first, so that a tick's expiries travel together, as ``ended`` frames no
larger than the gateway's frame limit, in one write.

*Mark requests* (``idled.core.watermarks``). The task sends ``mark(t)``, ``t`` the server clock at that moment,
every ``mark_interval`` and at once when the tick task holds a session of this gateway (``want``): the answer,
``marked(t)`` (``answered``), raises the gateway's watermark. At most ``MAX_OUTSTANDING`` requests are
unanswered at a time (a stopped gateway is not flooded); a periodic one is sent only when none is, or when
the newest is a period old; a wanted one whenever no request already sent covers the deadline waited on.
An answer must echo a request actually sent (a gateway cannot claim a watermark it was never asked for).

Writes to the gateway's stream from both tasks (this one, and the gateway task's pongs) go through one lock
(``send``): a trio stream forbids concurrent ``send_all``. Before the gateway task answers a ``ping`` it
flushes the pending notices, so a notice generated before the ping was processed always arrives before its
pong.

Bounds: a uid is pending at most once per reason, and only for a session the gateway owned and lost, so the
pending notices never exceed the sessions the gateway attached; requests in flight are at most
``MAX_OUTSTANDING``. When the connection is closed by the server (``flush_final``) whatever notice is still
pending goes out before the closing ``error`` frame, bounded in time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final, cast

import trio

from idled.core.presence import SessionKey as Key
from idled.protocol import MAX_DEVICE_BYTES, MAX_UID_BYTES, Ended, ErrorCode, Mark, ProtocolError, SessionKey, encode

__all__ = ["FLUSH_INTERVAL", "MAX_OUTSTANDING", "Outbox", "mark_interval", "outbox_running"]

FLUSH_INTERVAL: Final = 0.010  # seconds a notice waits for company (the expiries of one tick travel together)
FINAL_FLUSH_TIMEOUT: Final = 1.0  # a gateway that does not read can't hold a closing connection longer
MAX_OUTSTANDING: Final = 16  # mark requests in flight at most (a stopped gateway gets no more)
_FRAME_OVERHEAD: Final = 64  # op, keys, reason, array header: generous, so a frame never exceeds the limit

# The error code a session's owner is released with -> the reason an `ended` notice carries.
REASONS: Final[dict[str, str]] = {
    ErrorCode.IDLE_TIMEOUT: "idle",
    ErrorCode.KICKED: "kicked",
    ErrorCode.SERVER_SHUTDOWN: "shutdown",
    ErrorCode.UNAVAILABLE: "unavailable",  # an attach refused (``idled.server.gateways``)
}


def mark_interval(tick: float) -> float:
    """Seconds between periodic mark requests: a quarter tick, within [20 ms, 250 ms]. A held session waits
    for a request of its own (one round trip), so the period only bounds how stale an idle watermark is."""
    return min(0.25, max(0.02, tick / 4))


def _uid_size(uid: object) -> int:
    """Upper bound of a uid's msgpack size."""
    return 9 if type(uid) is int else len(str(uid).encode()) + 3


def _key_size(key: object) -> int:
    """Upper bound of a session key's msgpack size: a uid, or the 2-array [uid, device]."""
    if type(key) is tuple:
        return 1 + _uid_size(key[0]) + len(key[1].encode()) + 2
    return _uid_size(key)


_MAX_KEY_SIZE: Final = 1 + MAX_UID_BYTES + 3 + MAX_DEVICE_BYTES + 2


class Outbox:
    """One gateway's pending notices and mark requests (see the module docstring). ``notices`` / ``marks``:
    what it opted in to; ``now`` is the server clock marks are read from."""

    __slots__ = ("max_frame", "notices", "marks", "pending", "lock", "sent_frames", "_wake", "_now", "_interval",
                 "_sent", "_sent_at", "_wanted")

    def __init__(self, max_frame: int, *, notices: bool = True, marks: bool = False,
                 now: Callable[[], float] = trio.current_time, interval: float = 0.25) -> None:
        if max_frame < _MAX_KEY_SIZE + _FRAME_OVERHEAD:
            raise ValueError(f"max_frame {max_frame} is too small for an ended frame")
        self.max_frame = max_frame
        self.notices = notices
        self.marks = marks
        self.pending: dict[str, dict[SessionKey, None]] = {}  # reason -> keys, in the order they ended
        self.lock = trio.Lock()
        self.sent_frames = 0
        self._wake = trio.Event()
        self._now = now
        self._interval = interval
        self._sent: deque[float] = deque()  # mark requests in flight, oldest first
        self._sent_at = -math.inf  # trio time of the newest request sent
        self._wanted = -math.inf  # a request is wanted whose t is at least this

    # -- ended notices ---------------------------------------------------------------------------------------

    def add(self, key: Key, code: str) -> None:
        if self.notices:
            # A gateway attaches wire keys (a uid, or (uid, device)); the core's key type is wider only because
            # the core is generic. The notice names the key as the gateway attached it.
            self.pending.setdefault(REASONS.get(code, str(code)), {})[cast(SessionKey, key)] = None
            self._wake.set()

    def take(self) -> list[bytes]:
        """Every pending notice as frames of at most ``max_frame`` body bytes; clears them."""
        budget = self.max_frame - _FRAME_OVERHEAD
        frames: list[bytes] = []
        for reason, uids in self.pending.items():
            chunk: list[SessionKey] = []
            size = 0
            for uid in uids:
                n = _key_size(uid)
                if size + n > budget:
                    frames.append(encode(Ended(tuple(chunk), reason)))
                    chunk, size = [], 0
                chunk.append(uid)
                size += n
            if chunk:
                frames.append(encode(Ended(tuple(chunk), reason)))
        self.pending = {}
        return frames

    # -- marks -----------------------------------------------------------------------------------------------

    def want(self, deadline: float) -> None:
        """A held session waits for this gateway's watermark to pass ``deadline``: ask unless a request in
        flight already covers it."""
        if self.marks and not (self._sent and self._sent[-1] >= deadline) and deadline > self._wanted:
            self._wanted = deadline
            self._wake.set()

    def answered(self, t: float) -> None:
        """The gateway answered ``marked(t)``: forget every request up to it. ProtocolError if it was never
        asked (an answer must echo a request, in order)."""
        sent = self._sent
        full = len(sent) >= MAX_OUTSTANDING
        while sent and sent[0] < t:
            sent.popleft()
        if not sent or sent[0] != t:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "marked: no such mark was requested")
        sent.popleft()
        if full:
            self._wake.set()  # room for a request again

    def _mark_due(self) -> bool:
        if not self.marks or len(self._sent) >= MAX_OUTSTANDING:
            return False
        if self._wanted > -math.inf:
            return True
        return not self._sent or trio.current_time() >= self._sent_at + self._interval

    def _mark_frame(self) -> bytes:
        t = self._now()
        self._sent.append(t)
        self._sent_at = trio.current_time()
        self._wanted = -math.inf
        return encode(Mark(t))

    # -- writing ---------------------------------------------------------------------------------------------

    async def send(self, stream: trio.abc.SendStream, data: bytes) -> None:
        """Write ``data`` after every pending notice (the lock orders it with the task's own writes)."""
        async with self.lock:
            frames = self.take()
            if frames:
                self.sent_frames += len(frames)
                data = b"".join(frames) + data
            await stream.send_all(data)

    async def run(self, stream: trio.abc.SendStream) -> None:
        """Send notices within FLUSH_INTERVAL of the first, and mark requests when due; until cancelled."""
        while True:
            periodic = self.marks and len(self._sent) < MAX_OUTSTANDING
            with trio.move_on_at(self._sent_at + self._interval if periodic else math.inf):
                await self._wake.wait()
            self._wake = trio.Event()
            if self.pending and self._wanted == -math.inf:
                await trio.sleep(FLUSH_INTERVAL)  # company for the notices (a wanted mark does not wait)
            if self.pending or self._mark_due():
                async with self.lock:
                    frames = self.take()
                    self.sent_frames += len(frames)
                    if self._mark_due():
                        frames.append(self._mark_frame())
                    await stream.send_all(b"".join(frames))

    async def flush_final(self, stream: trio.abc.SendStream) -> None:
        """Send what is still pending before the server closes the gateway (bounded, even while cancelled)."""
        if not self.pending:
            return
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + FINAL_FLUSH_TIMEOUT
            try:
                await self.send(stream, b"")
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                pass


@asynccontextmanager
async def outbox_running(outbox: Outbox | None, stream: trio.abc.SendStream) -> AsyncIterator[None]:
    """Run ``outbox``'s task (if the gateway opted in to anything) while the block runs."""
    if outbox is None:
        yield
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run, stream)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()
