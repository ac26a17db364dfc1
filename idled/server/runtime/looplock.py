"""The loop lock: a ``threading.Lock`` the trio loop holds whenever it runs, and lets go of while it waits for I/O.

Theory of operation
-------------------
A thread that takes this lock runs only while the trio loop is parked in its I/O wait, and the loop cannot
take it back (after the wait) until the thread lets go. So the thread's Python code and every task's never
interleave, and the thread may read and change what tasks do with no lock of their own -- on one condition:
it never calls trio itself. trio's run state is per thread (``trio.current_time``, ``Event.set``, a channel's
``send_nowait`` all fail or corrupt from another thread); ``trio.lowlevel.current_trio_token().run_sync_soon``
is how such a thread asks the loop to do something.

Why a thread at all: on this kind of machine a loop turn costs far more than the work a keepalive needs
(trio's own ``epoll_wait`` with a timer armed, an ``epoll_ctl`` to re-arm a one-shot registration, the
task's step). The user plane (``idled.server.roles.plane``) waits on its own epoll in a thread that holds
neither the GIL nor this lock while it waits, serves a batch of keepalives under the lock, and wakes the
loop only when a connection ends (docs/peer.md, "A thread for the plane").

The lock is the loop's from the moment it is installed (``loop_lock``, called from a task: the loop is
running, so it holds it) until the run ends; two instrument hooks release it before each I/O wait and take
it back after. A run that never installs it pays nothing; one that does pays two calls per loop turn.
"""

from __future__ import annotations

import threading

import trio

__all__ = ["loop_lock"]

_LOCK: trio.lowlevel.RunVar[threading.Lock] = trio.lowlevel.RunVar("idled_loop_lock")


class _IoWait(trio.abc.Instrument):
    """Lets go of the lock while the loop waits for I/O, takes it back before any task runs again."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def before_io_wait(self, timeout: float) -> None:
        self.lock.release()

    def after_io_wait(self, timeout: float) -> None:
        self.lock.acquire()


def loop_lock() -> threading.Lock:
    """This run's loop lock, installed on first use. Call it from a task (the loop then holds it)."""
    try:
        return _LOCK.get()
    except LookupError:
        lock = threading.Lock()
        lock.acquire()  # the loop is running this task now: it holds the lock until its next I/O wait
        trio.lowlevel.add_instrument(_IoWait(lock))
        _LOCK.set(lock)
        return lock
