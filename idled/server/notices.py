"""Session-ended notices: the server telling a gateway which of its sessions it ended, and why.

Theory of operation
-------------------
A gateway that logged in with ``"ended": true`` gets a ``Notices`` object. Whenever the server ends one of
its sessions -- the tick task (``idle_timeout``), a newer login elsewhere (``kicked``), shutdown
(``server_shutdown``) -- ``Gateway.release`` calls ``add(uid, code)``, which only files the uid under its
reason (``idle``, ``kicked``, ``shutdown``): no I/O on the caller's path, which may be the tick task expiring
thousands of sessions in one slice.

``run(stream)`` is the gateway connection's second task (the first reads its frames): it sleeps until
something is pending, then ``FLUSH_INTERVAL`` more so that a tick's expiries travel together, and sends every
pending notice as ``ended`` frames no larger than the gateway's frame limit, in one write. Writes to the
gateway's stream from both tasks (notices, pongs) go through one lock (``send``): a trio stream forbids
concurrent ``send_all``. Before the gateway task answers a ``ping`` it flushes what is pending, so a notice
generated before the ping was processed always arrives before its pong.

Bound: a uid is pending at most once per reason, and only for a session the gateway owned and lost, so the
pending notices never exceed the sessions the gateway attached. When the connection is closed by the server
(``flush_final``) whatever is still pending goes out before the closing ``error`` frame, bounded in time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import trio

from idled.core.presence import Uid
from idled.protocol import MAX_UID_BYTES, Ended, ErrorCode, encode

__all__ = ["FLUSH_INTERVAL", "Notices", "notices_sent"]

FLUSH_INTERVAL: Final = 0.010  # seconds a notice waits for company (the expiries of one tick travel together)
FINAL_FLUSH_TIMEOUT: Final = 1.0  # a gateway that does not read can't hold a closing connection longer
_FRAME_OVERHEAD: Final = 64  # op, keys, reason, array header: generous, so a frame never exceeds the limit

# The error code a session's owner is released with -> the reason an `ended` notice carries.
REASONS: Final[dict[str, str]] = {
    ErrorCode.IDLE_TIMEOUT: "idle",
    ErrorCode.KICKED: "kicked",
    ErrorCode.SERVER_SHUTDOWN: "shutdown",
}


def _uid_size(uid: Uid) -> int:
    """Upper bound of a uid's msgpack size."""
    return 9 if type(uid) is int else len(str(uid).encode()) + 3


class Notices:
    """One opted-in gateway's pending notices (see the module docstring)."""

    __slots__ = ("max_frame", "pending", "lock", "_wake", "sent_frames")

    def __init__(self, max_frame: int) -> None:
        if max_frame < MAX_UID_BYTES + 3 + _FRAME_OVERHEAD:
            raise ValueError(f"max_frame {max_frame} is too small for an ended frame")
        self.max_frame = max_frame
        self.pending: dict[str, dict[Uid, None]] = {}  # reason -> uids, in the order they ended
        self.lock = trio.Lock()
        self._wake = trio.Event()
        self.sent_frames = 0

    def add(self, uid: Uid, code: str) -> None:
        self.pending.setdefault(REASONS.get(code, str(code)), {})[uid] = None
        self._wake.set()

    def take(self) -> list[bytes]:
        """Every pending notice as frames of at most ``max_frame`` body bytes; clears them."""
        budget = self.max_frame - _FRAME_OVERHEAD
        frames: list[bytes] = []
        for reason, uids in self.pending.items():
            chunk: list[Uid] = []
            size = 0
            for uid in uids:
                n = _uid_size(uid)
                if size + n > budget:
                    frames.append(encode(Ended(tuple(chunk), reason)))
                    chunk, size = [], 0
                chunk.append(uid)
                size += n
            if chunk:
                frames.append(encode(Ended(tuple(chunk), reason)))
        self.pending = {}
        return frames

    async def send(self, stream: trio.abc.SendStream, data: bytes) -> None:
        """Write ``data`` after every pending notice (the lock orders it with the flusher's writes)."""
        async with self.lock:
            frames = self.take()
            if frames:
                self.sent_frames += len(frames)
                data = b"".join(frames) + data
            await stream.send_all(data)

    async def run(self, stream: trio.abc.SendStream) -> None:
        """Flush pending notices within FLUSH_INTERVAL of the first, until cancelled."""
        while True:
            await self._wake.wait()
            await trio.sleep(FLUSH_INTERVAL)
            self._wake = trio.Event()
            if self.pending:
                await self.send(stream, b"")

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
async def notices_sent(notices: Notices | None, stream: trio.abc.SendStream) -> AsyncIterator[None]:
    """Run ``notices``' flusher (if the gateway opted in) while the block runs."""
    if notices is None:
        yield
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(notices.run, stream)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()
