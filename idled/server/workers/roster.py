"""What the root of ``idled serve --workers N`` tells its core about the processes it runs: one shared page.

Theory of operation
-------------------
Under ``--workers`` the root (``idled.server.workers.root``) starts the core and the edges, restarts whichever dies,
and outlives them all; the core serves ``/status``, the status page's workers table and the
``idled_worker_*`` metrics, and trusts an edge's token-less link only from the process the root started
under that name (``idled.server.workers.edges``). So the core must know, at any moment, each edge's pid and
restarts -- across its own restarts, since a new core starts knowing nothing. The root keeps them in one
anonymous shared memory file (``memfd``) of 64-bit slots, passed to every core it starts:

    slot 0           restarts of the core (the root counts them)
    slot 1           the core's heartbeat: CLOCK_MONOTONIC in ns, written by the core's monitor each beat
    slot 2 + 2 i     worker i's pid while its process runs, 0 while it is down (being restarted)
    slot 3 + 2 i     worker i's restarts

The root writes the core's restarts and the workers' slots, the core writes only its heartbeat (which the
root reads for the systemd watchdog: a wedged core is restarted, and the edges keep their users meanwhile).
Slots are plain aligned 64-bit stores and loads, atomic on every machine Linux runs on; a reader may see a
value a moment old. The root writes a worker's pid right after ``fork`` returns, long before the new edge can
connect to the core (it has an interpreter to start first); a login seen earlier would be refused once and
retried by the edge's link.
"""

from __future__ import annotations

import mmap
import os
import time

__all__ = ["Roster"]

SLOT = 8  # bytes
_HEADER = 2  # slots before the workers'


class Roster:
    """A view of the shared page (see the module docstring); ``workers``: how many edge slots it holds."""

    def __init__(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if size < _HEADER * SLOT or size % (2 * SLOT):
            raise ValueError(f"roster: a {size}-byte shared file is not a roster")
        self.fd = fd
        self._map = mmap.mmap(fd, size)
        self._slots = memoryview(self._map).cast("q")
        self.workers = size // SLOT // 2 - 1

    @classmethod
    def create(cls, workers: int) -> Roster:
        """A new, zeroed page for ``workers`` edges; its descriptor is passed to the core (``pass_fds``)."""
        fd = os.memfd_create("idled-roster", 0)
        os.ftruncate(fd, (_HEADER + 2 * workers) * SLOT)
        return cls(fd)

    # -- the root's side -------------------------------------------------------------------------------------

    def set_worker(self, index: int, pid: int | None, restarts: int) -> None:
        self._slots[_HEADER + 2 * index] = pid or 0
        self._slots[_HEADER + 2 * index + 1] = restarts

    def set_core_restarts(self, restarts: int) -> None:
        self._slots[0] = restarts

    def heartbeat_age(self) -> float | None:
        """Seconds since the core's last heartbeat (None: no heartbeat since the last ``clear_heartbeat``)."""
        beat = self._slots[1]
        return None if beat == 0 else max(0.0, (time.monotonic_ns() - beat) / 1e9)

    def clear_heartbeat(self) -> None:
        """A new core starts: no heartbeat until its monitor runs."""
        self._slots[1] = 0

    # -- the core's side -------------------------------------------------------------------------------------

    def worker(self, index: int) -> tuple[int | None, int]:
        """(pid or None while down, restarts) of worker ``index``."""
        pid = self._slots[_HEADER + 2 * index]
        return (pid or None), self._slots[_HEADER + 2 * index + 1]

    def core_restarts(self) -> int:
        return self._slots[0]

    def beat(self) -> None:
        self._slots[1] = time.monotonic_ns()

    def close(self) -> None:
        self._slots.release()
        self._map.close()
