"""The user engine's table of connections: per-session state, and the primitives that send and end them.

Theory of operation
-------------------
`ConnTable` holds what the engine (`idled.tools.loadtest.engine`, which extends it with the loop, the
opening of connections and the timers) knows about each of a worker's n sessions, numbered k = 0..n-1
(global index ``i = worker + k * workers``): parallel lists -- socket, state byte, due time, the wall times
of the last two sends -- and small dicts for what only a few sessions have at a time (a partial inbound
frame, bytes the socket would not take yet, a connect in progress, a planned moment). An idle logged-in
session costs one socket object and a few list slots: no task, no decoder, no buffer.

Sending (`_send`) reads the wall clock just before the ``send()`` that puts a frame in the socket and keeps
that time as the session's last send (the one before moves to `sent_prev`); bytes a full socket will not
take wait in `outq` under EPOLLOUT and their time is read when the last of them goes. Ending is in one
place per kind: `_fail` for a connection that never logged in (counted by phase, recorded as failed:
nothing is expected of it), `_ended` for one that did -- a pinger the server let go is recorded with its
last two sends, its close time and how, for the coordinator to judge; a silent or bye session's end is
counted in `closes` -- and `_shutdown` for whatever the stop cut short. With MQTT (`idled.tools.loadtest.wire`)
`_ended` also records the end of every logged-in session as an offline event (`_close_event`): the broker
sends none, the close is all there is.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from typing import Final

from idled.tools.loadtest.connect import error_name
from idled.tools.loadtest.workerstate import Worker

__all__ = ["ConnTable", "NEW", "CONNECTING", "HANDSHAKE", "LOGIN", "UP", "SILENT_WAIT", "BYE_WAIT", "DONE",
           "PHASE", "WOULD_BLOCK"]

# session states (one byte each)
NEW, CONNECTING, HANDSHAKE, LOGIN, UP, SILENT_WAIT, BYE_WAIT, DONE = range(8)
PHASE: Final = {CONNECTING: "connect", HANDSHAKE: "connect", LOGIN: "login"}  # for errors before UP
WOULD_BLOCK: Final = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
MAX_OUTQ: Final = 65536  # unsent bytes per connection before it is given up (the server stopped reading)


class ConnTable:
    """Per-session state of one worker's user connections, and sending / ending them."""

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.n = n = len(range(w.index, w.sessions, w.workers))
        self.socks: list[socket.socket | None] = [None] * n
        self.state = bytearray(n)
        self.due = [0.0] * n  # when the pending PING / MOMENT is due (engine clock): the base of its lag
        self.sent_prev = [0.0] * n  # wall time of the send before the last
        self.sent_last = [0.0] * n  # wall time of the last send (login, keepalive)
        self.owner: dict[int, int] = {}  # fd -> k
        self.pending: dict[int, bytes] = {}  # k -> a partial inbound frame
        self.outq: dict[int, bytes] = {}  # k -> bytes the socket would not take yet
        self.opened: dict[int, float] = {}  # k -> connect start (engine clock), while opening
        self.connected: dict[int, float] = {}  # k -> TCP (+ TLS) up, while logging in
        self.late_planned: set[int] = set()  # sessions planned to send one keepalive late
        self.ep = select.epoll()
        self.next_k = 0  # the next session to start
        self.inflight = 0  # sessions opening (connect, TLS, login)
        self.live = 0  # sessions started and not yet ended
        self.closes_are_events = False  # report ends as events (MQTT): set by the engine from its wire (wire.py)

    def index(self, k: int) -> int:
        """The global session index of local session k."""
        return self.w.index + k * self.w.workers

    # ------------------------------------------------------------------------------------------ writing

    def _send(self, k: int, frame: bytes) -> bool:
        """Put `frame` in the socket, noting the wall time just before; False if the session ended instead.
        Bytes the socket will not take wait in `outq` (EPOLLOUT), and the time is noted when the last goes."""
        if k in self.outq:
            return self._queue(k, frame)
        sock = self.socks[k]
        t = time.time()
        try:
            n = sock.send(frame)  # type: ignore[union-attr]
        except WOULD_BLOCK:
            n = 0
        except OSError as exc:
            self._ended(k, error_name(exc), error=True)
            return False
        if n == len(frame):
            self.sent_prev[k] = self.sent_last[k]
            self.sent_last[k] = t
            return True
        return self._queue(k, frame[n:])

    def _queue(self, k: int, data: bytes) -> bool:
        queued = self.outq.get(k, b"") + data
        if len(queued) > MAX_OUTQ:
            self._ended(k, "send_buffer_full", error=True)
            return False
        if k not in self.outq:
            self.ep.modify(self.socks[k].fileno(), select.EPOLLIN | select.EPOLLOUT)  # type: ignore[union-attr]
        self.outq[k] = queued
        return True

    def _flush(self, k: int) -> None:
        data = self.outq[k]
        sock = self.socks[k]
        t = time.time()
        try:
            n = sock.send(data)  # type: ignore[union-attr]
        except WOULD_BLOCK:
            return
        except OSError as exc:
            self._ended(k, error_name(exc), error=True)
            return
        if n < len(data):
            self.outq[k] = data[n:]
            return
        del self.outq[k]
        self.sent_prev[k] = self.sent_last[k]
        self.sent_last[k] = t
        self.ep.modify(sock.fileno(), select.EPOLLIN)  # type: ignore[union-attr]

    # -------------------------------------------------------------------------------------------- ends

    def _ended(self, k: int, how: str, error: bool = False) -> None:
        """A logged-in connection ended: closed by the server (``how`` = eof / server:<code>) or broken."""
        w = self.w
        st = self.state[k]
        if st in PHASE:  # (a send failed while logging in)
            self._fail(k, f"{PHASE[st]}:{how}")
            return
        i = self.index(k)
        if self.closes_are_events:  # (MQTT: the close is the broker's only word that the session ended)
            self._close_event(i, k, st)
        if st == UP:
            w.pinging -= 1
            if k in self.late_planned:
                w.closes[f"late:{how}"] += 1  # a planned late session: expected when its delay passed the timeout
            else:
                w.errors[f"session:{how}"] += 1
            # a pinger the server let go: what the coordinator needs to judge whose fault it was
            w.closed_records.append((i, self.sent_prev[k], self.sent_last[k], time.time(), how))
            self._close(k, None)
            return
        if error:
            w.errors[f"session:{how}"] += 1
        self._close(k, None if error else f"{'silent' if st == SILENT_WAIT else 'bye'}:{how}")

    def _close_event(self, i: int, k: int, st: int) -> None:
        """Record the end of logged-in session k as the offline event the broker did not send: the wall time
        the engine saw the socket closed, ``logout`` after a bye, else ``idle``; the deadline the client's own
        last send gives it (last send + timeout)."""
        w = self.w
        last = self.sent_last[k]
        timeout = w.timeout or 0.0
        w.offline_records.append((i, time.time(), "logout" if st == BYE_WAIT else "idle", last + timeout, last))

    def _close(self, k: int, closes: str | None) -> None:
        """Close a logged-in connection (counted in `closes` as given: how a silent / bye session ended)."""
        w = self.w
        if closes is not None:
            w.closes[closes] += 1
        w.conns -= 1
        w.ended += 1
        self._drop(k)

    def _fail(self, k: int, name: str) -> None:
        """A connection that never logged in: counted, recorded as failed (nothing is expected of it)."""
        w = self.w
        w.errors[name] += 1
        w.failed_records.append(self.index(k))
        self.inflight -= 1
        self.opened.pop(k, None)
        self.connected.pop(k, None)
        self._drop(k)

    def _drop(self, k: int) -> None:
        sock = self.socks[k]
        self.socks[k] = None
        self.state[k] = DONE
        self.live -= 1
        self.pending.pop(k, None)
        self.outq.pop(k, None)
        if sock is not None:
            self.owner.pop(sock.fileno(), None)
            sock.close()  # (closing the fd takes it out of the epoll set)

    def _shutdown(self) -> None:
        """Stopped (or done): count what was cut short, close every socket."""
        w = self.w
        w.mark("stop")
        for k in range(self.next_k):
            st = self.state[k]
            if st in PHASE:
                w.errors[f"{PHASE[st]}:stopped"] += 1  # the run ended while this one was logging in
                w.failed_records.append(self.index(k))
            sock = self.socks[k]
            if sock is not None:
                sock.close()
                self.socks[k] = None
        if self.next_k < self.n:  # never tried: nothing is expected of them
            w.errors["ramp:not_started"] += self.n - self.next_k
            w.failed_records.extend(range(self.index(self.next_k), w.sessions, w.workers))
        w.conns = w.pinging = 0
        self.ep.close()
