"""The accept loop every listener of the door runs: descriptors running out, and a full process that pauses.

Theory of operation
-------------------
**The accept loop.** trio's ``serve_listeners`` meets EMFILE/ENFILE/ENOMEM/ENOBUFS by logging a traceback
and retrying every 0.1 s, while the connection waits in the kernel's backlog until its own timeout. Here the
descriptor budget (``idled.ops.fdbudget``) normally keeps accept from ever running out: connections past it
are accepted and refused with ``busy`` by the doorway. If descriptors run out anyway (something else used the
reserve, or the machine's file table is full), each loop holds one *spare* descriptor (/dev/null): it closes
the spare, accepts the waiting connection, refuses it with ``busy``, closes it and reopens the spare -- so the
client learns at once, rather than hanging. Without a spare (or for ENOMEM/ENOBUFS) it pauses briefly and
retries; other connections are served meanwhile. ``Shortage`` logs the first failure of an episode as one
warning with the descriptor arithmetic, then at most one line per ``REPORT_EVERY`` seconds with the count.

**At the connection limit: refuse, or pause.** The core accepts every connection, and its doorway refuses
those beyond the limit with ``busy``: nobody else accepts on its sockets, so a connection left in the backlog
would only hang there. An edge shares its socket with the other edges under ``--workers`` (the kernel gives
each connection to whichever accepts first), so it passes a ``Room`` and pauses at its limit instead: a new
connection then goes to an edge with room. One still waiting ``OVERFLOW_WAIT`` later is left longer -- up to
``OVERFLOW_PATIENCE`` -- while another edge has room (``Room.elsewhere``: it is only slower to accept); then,
or at once when every edge is full, it is accepted and refused with ``busy`` (``Room.overflow``), so the
client learns. A room counts a connection the moment it is accepted (``Room.enter``): the loop's next look at the
limit must see it, and its handler's task has not started yet.
"""

from __future__ import annotations

import errno
import logging
import os
import select
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Protocol

import trio

__all__ = [
    "CAPACITY_ERRNOS", "OVERFLOW_PATIENCE", "OVERFLOW_WAIT", "REPORT_EVERY", "SHORTAGE_PAUSE", "Handler", "Room",
    "Shortage", "accept_all", "accept_loop",
]

log = logging.getLogger("idled.door.accept")

CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
SHORTAGE_PAUSE: Final = 0.1  # seconds before accepting again when a connection could not even be refused
REPORT_EVERY: Final = 10.0  # seconds between two lines counting accepts that failed for lack of descriptors
SPARE_ACCEPT_WAIT: Final = 0.05  # the connection is already queued; if it is gone meanwhile, don't wait for another
OVERFLOW_WAIT: Final = 0.05  # seconds a full Room leaves a waiting connection to the others before refusing it
OVERFLOW_PATIENCE: Final = 2.0  # ... at most, while another has room (a busy edge accepts late, not never)

Handler = Callable[[trio.SocketStream], Awaitable[None]]


class Shortage:
    """Connections that could not be served for lack of descriptors (or memory): the first of an episode is
    one warning with ``explain()`` (the descriptor arithmetic), the rest are counted -- refused with busy, or
    retried when not even that was possible -- and reported at most once per ``every`` seconds. A window with
    no failure ends the episode: the next failure warns in full again."""

    def __init__(self, explain: Callable[[], str], *, every: float = REPORT_EVERY) -> None:
        self.explain = explain
        self.every = every
        self.total = 0  # failures since start (every episode)
        self.refused = 0  # of those, connections accepted with the spare and refused with busy
        self._refused = self._retried = 0  # in the current window
        self._window: float | None = None  # start of the current window; None: no episode going on

    def note(self, exc: OSError, *, refused: bool, now: float) -> None:
        self.total += 1
        self.refused += refused
        if self._window is None:
            self._window = now
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            log.warning(
                "accept: %s (%s) although connections are limited to the descriptor budget (%s); "
                "new connections are refused with busy (or wait, when not even that is possible) until "
                "descriptors are free again; counted below at most once every %g s",
                exc.strerror or exc, name, self.explain(), self.every,
            )
            return
        self._refused += refused
        self._retried += not refused
        self.report(now)

    def report(self, now: float) -> None:
        """Log the window's count if it is over (called on every accept, so it is cheap)."""
        if self._window is None or now - self._window < self.every:
            return
        if not (self._refused or self._retried):
            self._window = None  # a quiet window: the episode is over
            return
        log.warning(
            "accept: out of descriptors in the last %.0f s: %d connections refused with busy, %d accepts "
            "retried %g s later (no descriptor even to refuse with)",
            now - self._window, self._refused, self._retried, SHORTAGE_PAUSE,
        )
        self._refused = self._retried = 0
        self._window = now


class Room(Protocol):
    """A server that *pauses* accepting at its connection limit instead of accepting and refusing (an edge:
    the edges under ``--workers`` share one listening socket, so a connection it leaves in the backlog goes
    to one with room). See the module docstring."""

    def full(self) -> bool:
        """At the limit: leave new connections to the others."""

    def enter(self) -> None:
        """Count a connection just accepted, before its handler starts: the next ``full()`` must see it."""

    def elsewhere(self) -> bool:
        """Another process on the socket has room (so a waiting connection is left to it a while longer)."""

    async def overflow(self, stream: trio.SocketStream) -> None:
        """Refuse a connection still waiting ``OVERFLOW_WAIT`` after the room was found full (busy)."""


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


async def accept_all(
    listeners: Sequence[trio.SocketListener], handler: Handler, handlers: trio.Nursery, refuse: Handler,
    shortage: Shortage, room: Room | None = None, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """One ``accept_loop`` per listener, until cancelled (with no listener, just until cancelled)."""
    async with trio.open_nursery() as loops:
        for listener in listeners:
            loops.start_soon(accept_loop, listener, handler, handlers, refuse, shortage, room)
        task_status.started()
        await trio.sleep_forever()


async def accept_loop(
    listener: trio.SocketListener, handler: Handler, handlers: trio.Nursery, refuse: Handler, shortage: Shortage,
    room: Room | None = None,
) -> None:
    """Accept on ``listener`` until cancelled (then close it), each connection served by ``handler`` in
    ``handlers``; out of descriptors, refuse with ``refuse``; with a ``room``, pause while it is full (see the
    module docstring). Other errors raise."""
    acceptor = _Acceptor(listener, refuse, shortage)
    try:
        async with listener:
            while True:
                if room is not None and room.full():
                    await _overflow(acceptor, room, handlers)
                    continue
                stream = await acceptor.accept()
                if stream is not None:
                    if room is not None:
                        room.enter()
                    handlers.start_soon(handler, stream)
    finally:
        acceptor.close()


async def _overflow(acceptor: _Acceptor, room: Room, handlers: trio.Nursery) -> None:
    """The room is full: wait for a connection, leave it to the others for ``OVERFLOW_WAIT`` (the kernel gives
    it to whichever accepts), and refuse it if it is still waiting and the room still full -- every process
    on the socket is full, or the others are not accepting -- so the client learns at once."""
    await trio.lowlevel.wait_readable(acceptor.listener.socket)  # someone is waiting
    if not room.full():
        return  # room was made while we waited: take it at once, not after the others had their chance
    await trio.sleep(OVERFLOW_WAIT)  # one with room takes it meanwhile
    patience = trio.current_time() + OVERFLOW_PATIENCE
    while room.full() and room.elsewhere() and trio.current_time() < patience:
        if not _waiting(acceptor.listener.socket):
            return  # another took it
        await trio.sleep(OVERFLOW_WAIT)  # it has room but is slow to accept: leave it longer
    if not room.full():
        return
    stream = None
    # Gone to another meanwhile: wait no longer than this for it (one arriving meanwhile is refused in its
    # place: a loop cannot tell them apart).
    with trio.move_on_after(OVERFLOW_WAIT):
        stream = await acceptor.accept()
    if stream is not None:
        handlers.start_soon(room.overflow, stream)


def _waiting(sock: trio.socket.SocketType) -> bool:
    """Whether a connection waits in the listening socket's backlog (a poll that does not block)."""
    return bool(select.select([sock.fileno()], [], [], 0)[0])


class _Acceptor:
    """``listener.accept()``, meeting a shortage of descriptors as the module docstring says: the spare."""

    def __init__(self, listener: trio.SocketListener, refuse: Handler, shortage: Shortage) -> None:
        self.listener = listener
        self.refuse = refuse
        self.shortage = shortage
        self.spare = _open_spare()
        self.waited = False  # the last accept failed, and a connection has been waiting since

    async def accept(self) -> trio.SocketStream | None:
        """The next connection to serve; None if it could not be accepted (refused with busy, or retried)."""
        try:
            stream = await self.listener.accept()
        except OSError as exc:
            if exc.errno not in CAPACITY_ERRNOS:
                raise
            await self._short(exc)
            return None
        self.waited = False
        self.shortage.report(trio.current_time())
        return stream

    async def _short(self, exc: OSError) -> None:
        if not self.waited:
            # The kernel takes the new descriptor before it looks at the queue: EMFILE says nothing about a
            # connection waiting. Wait for one (or the spare would be spent on nobody), then try a plain
            # accept again: a descriptor may have been freed meanwhile.
            await trio.lowlevel.wait_readable(self.listener.socket)
            self.waited = True
            return
        self.waited = False
        refused = False
        if self.spare is None:
            self.spare = _open_spare()
        if self.spare is not None and exc.errno in (errno.EMFILE, errno.ENFILE):
            os.close(self.spare)
            self.spare = None
            refused = await _refuse_one(self.listener, self.refuse)
            self.spare = _open_spare()
        self.shortage.note(exc, refused=refused, now=trio.current_time())
        if not refused:
            await trio.sleep(SHORTAGE_PAUSE)

    def close(self) -> None:
        if self.spare is not None:
            os.close(self.spare)
            self.spare = None


async def _refuse_one(listener: trio.SocketListener, refuse: Handler) -> bool:
    """With the spare's descriptor free: accept the waiting connection and refuse it. True if one was."""
    stream: trio.SocketStream | None = None
    with trio.move_on_after(SPARE_ACCEPT_WAIT):
        try:
            stream = await listener.accept()
        except OSError:
            return False  # someone else took the descriptor first
    if stream is None:
        return False
    await refuse(stream)  # bounded: an error frame fits a fresh socket's send buffer, then it is closed
    return True

