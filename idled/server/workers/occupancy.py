"""How full every edge of one ``--workers`` daemon is: one shared page of counters, one slot per edge.

Theory of operation
-------------------
Under ``--workers N`` the edges share one listening socket and the kernel gives each connection to whichever
edge accepts first, so the edges fill unevenly: a busy edge accepts less. An edge that reaches its limit
pauses; a connection still waiting ``OVERFLOW_WAIT`` later used to be refused ``busy`` by it -- although
another edge had room and was only slower to accept (a GC walk, a burst of logins). At 100,000 connections
through 6 edges that refused hundreds of logins while the daemon had room for 19,000 more.

So the supervisor creates one anonymous shared memory file (``memfd``) of N 64-bit counters and passes it to
every edge with its slot index (``--occupancy FD,INDEX``). Each edge writes its open connections into its
slot (``publish``, from the accept loop and the monitor: never more than a quarter tick stale) and reads
the others' when it must decide:

* ``max_connections`` is the daemon's limit, as without workers: an edge is full when the whole daemon holds
  that many (``total``), or when its own descriptor budget is used up;
* a full edge refuses a waiting connection only when no other edge has room (``elsewhere``) -- otherwise it
  leaves it in the backlog for them, for up to ``OVERFLOW_PATIENCE``.

Counters are plain aligned 64-bit stores and loads (atomic on the machines Linux runs on); a reader may see
a slot a moment old, which only moves a decision by one connection. No locks, no system call per connection.
"""

from __future__ import annotations

import mmap
import os

__all__ = ["Occupancy", "parse_occupancy"]

SLOT = 8  # bytes per edge


class Occupancy:
    """One edge's view of the shared counters (``index``: its own slot; ``limits``: each edge's budget)."""

    def __init__(self, fd: int, index: int) -> None:
        size = os.fstat(fd).st_size
        if size < SLOT or size % SLOT or not 0 <= index < size // SLOT:
            raise ValueError(f"occupancy: slot {index} is not in a {size}-byte shared file")
        self._map = mmap.mmap(fd, size)
        self._slots = memoryview(self._map).cast("q")
        self.index = index
        self.edges = size // SLOT

    @classmethod
    def create(cls, edges: int) -> tuple[int, list[Occupancy]]:
        """A new shared file for ``edges`` edges (its descriptor, inheritable by children) and a view per slot."""
        fd = os.memfd_create("idled-occupancy", 0)  # no MFD_CLOEXEC: the edges inherit it (pass_fds)
        os.ftruncate(fd, edges * SLOT)
        return fd, [cls(fd, i) for i in range(edges)]

    def publish(self, connections: int) -> None:
        self._slots[self.index] = connections

    def total(self) -> int:
        return sum(self._slots)

    def elsewhere(self, budget: int) -> bool:
        """Whether another edge holds fewer than ``budget`` connections (every edge has the same budget)."""
        return any(count < budget for i, count in enumerate(self._slots) if i != self.index)

    def counts(self) -> list[int]:
        return list(self._slots)

    def close(self) -> None:
        self._slots.release()
        self._map.close()


def parse_occupancy(value: str) -> tuple[int, int]:
    """``FD,INDEX`` -> (fd, index); ValueError otherwise."""
    fd, sep, index = value.partition(",")
    if not sep or not fd.isdigit() or not index.isdigit():
        raise ValueError(f"--occupancy takes FD,INDEX, got {value!r}")
    return int(fd), int(index)
