"""The core's view of the edges of ``idled serve --workers N``: whom to trust, and what to show.

Theory of operation
-------------------
Under ``--workers`` the core does not start its edges: the root does (``idled.server.workers.root``), and restarts
the core itself when it dies while the edges keep their users. The root hands every core it starts the
internal unix socket (already listening), the public sockets (for their addresses only), the edges' shared
connection counts (``idled.server.workers.occupancy``) and the roster (``idled.server.workers.roster``: each edge's pid
and restarts). ``Workers`` is built from those descriptors (``from_fds``) and answers three questions:

* **Trust** (``trusts``): the rule of ``idled.server.workers.internal`` -- a token-less gateway login is the edge's own
  link only when its peer process (``SO_PEERCRED``) is the pid the roster gives for that very name and no
  gateway of that name is connected; everything else shows a token.
* **Links** (``is_link``): which peers are the edges' own links (shutdown closes relayed peers first).
* **View** (``view``): per edge, name, pid (None while down), restarts, sessions held through its link and
  connections it holds -- for ``/status``, the status page's workers table and ``idled_worker_*``
  (``idled.server.workers.metrics``), together with ``core_restarts``.

``beat`` is a monitor hook: it writes the core's heartbeat into the roster, which the root watches for the
systemd watchdog.
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Sequence

import trio

from idled.protocol import Login
from idled.server.roles.gateways import GatewayConnection
from idled.server.workers.internal import peer_pid
from idled.server.workers.occupancy import Occupancy
from idled.server.workers.roster import Roster

__all__ = ["View", "Workers"]

View = list[tuple[str, int | None, int, int, int]]  # name, pid, restarts, sessions, connections


class Workers:
    """See the module docstring. ``peers``: the core's live gateways and observers."""

    def __init__(self, roster: Roster, occupancy: Occupancy, internal: trio.SocketListener,
                 public: Sequence[trio.SocketListener], *, peers: Collection[object]) -> None:
        self.roster = roster
        self.occupancy = occupancy
        self.internal = internal
        self.public = list(public)
        self.peers = peers
        self.names = [f"worker-{i}" for i in range(roster.workers)]
        self._names = frozenset(self.names)

    @classmethod
    def from_fds(cls, internal: int, roster: int, occupancy: int, public: Sequence[int], *,
                 peers: Collection[object]) -> Workers:
        """Adopt what the root passed (see ``idled.server.workers.root.core_command``)."""
        shared = Roster(roster)
        listeners = [_listener(fd) for fd in public]
        return cls(shared, Occupancy(occupancy, 0), _listener(internal), listeners, peers=peers)

    def trusts(self, stream: trio.abc.Stream, login: Login) -> bool:
        """A login that needs no token: see ``idled.server.workers.internal`` for the rule and why."""
        if login.role != "gateway" or login.token or login.name not in self._names:
            return False
        pid = peer_pid(stream)
        if pid is None or self.roster.worker(self.names.index(str(login.name)))[0] != pid:
            return False
        # Its own link is already up: a second token-less "worker-i" from that edge is a relayed client.
        return not any(getattr(peer, "name", None) == login.name for peer in self.peers)

    def is_link(self, peer: object) -> bool:
        """Whether a peer of the core is one of its edges' own links (a gateway named after a worker)."""
        return isinstance(peer, GatewayConnection) and peer.name in self._names

    def view(self) -> View:
        """Per worker: name, pid (None: down), restarts, sessions the core holds through its link, connections
        it holds (its slot of the shared occupancy). Read on the event loop (``peers`` changes there)."""
        sessions = {getattr(p, "name", None): len(getattr(p, "uids", ())) for p in self.peers}
        counts = self.occupancy.counts()
        view: View = []
        for index, name in enumerate(self.names):
            pid, restarts = self.roster.worker(index)
            view.append((name, pid, restarts, sessions.get(name, 0), counts[index]))
        return view

    def core_restarts(self) -> int:
        return self.roster.core_restarts()

    def beat(self) -> None:
        self.roster.beat()


def _listener(fd: int) -> trio.SocketListener:
    return trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))
