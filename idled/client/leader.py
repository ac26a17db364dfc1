"""Finding the leader among several cores: address lists, and which core to try next (sans-IO).

Theory of operation
-------------------
A client or edge may be given several cores (``"10.0.0.1:7878,10.0.0.2:7878"``): an active one and its
standbys, or the members of an elected group. Only the leader accepts user and gateway logins; the others
refuse with ``not_leader`` and, when they know it, name the leader in the error frame's ``leader``. The link
(``idled.client.link``) connects, logs in and reports each outcome to a `LeaderSearch`, which says where
to go next. Nothing here reads a clock or a socket.

* *Rounds.* Attempts come in rounds. A round tries each listed core at most once, in list order from where
  it started (wrapping). A failure with another core left in the round is retried *at once*; the link
  sleeps its backoff only when a round is over, so a dead member costs one refused connect, not a backoff.
  With a single core every failure ends a round: exactly the one-address behaviour.
* *Hints.* A refusal's ``leader`` is tried next, unless it was tried in this round already (two stale
  cores naming each other must not ping-pong). A hint outside the list is followed too (the leader moved
  to a core the list does not know), at most ``len(members)`` times per round, so no peer can keep a
  client hopping for ever.
* *Where a round starts.* With the hint of the last failure, else the core last logged in to (the leader
  before the connection was lost: after a plain restart it is the likeliest one), else the first listed.
  ``connected()`` records the leader; ``lost(hint)`` is a connection that was up and ended: a new round
  begins at the hint, or at that same core.

By hand, cores ``[S, A]`` (S a standby of A)::

    start              target S
    failed("A")        S refused with leader A: A untried  -> target A, True (at once)
    connected()        leader A
    lost(None)         A killed                             -> target A (new round, after the link's backoff)
    failed(None)       refused                              -> target S, True (at once)
    failed("A")        S not promoted yet, names A: tried   -> round over: target A, False (back off)
    failed(None)       refused                              -> target S, True
    connected()        S was promoted: leader S

Addresses are read by the one address grammar (``idled.protocol.address``): ``HOST:PORT``, ``[IPv6]:PORT``,
or a bare ``HOST`` (``[IPv6]``) taking the default port; a list is comma-separated or a sequence of such
strings. The search itself compares members only, whatever they are.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeAlias, TypeVar

__all__ = ["Hosts", "LeaderSearch"]

A = TypeVar("A", bound=Hashable)
# Where the client API takes a host: one (``"10.0.0.1"``, ``"10.0.0.1:7878"``), a comma-separated list of
# cores (``"a:7878,b:7878"``), or a sequence of them; a member without a port takes the call's `port`.
Hosts: TypeAlias = str | Sequence[str]


class LeaderSearch(Generic[A]):
    """Which core to try next (see the module docstring). `target` is the address of the next attempt."""

    __slots__ = ("members", "target", "leader", "_tried", "_extra")

    def __init__(self, members: Sequence[A]) -> None:
        if not members:
            raise ValueError("at least one core is needed")
        self.members: tuple[A, ...] = tuple(dict.fromkeys(members))
        self.target: A = self.members[0]
        self.leader: A | None = None  # the core of the last successful login
        self._tried: set[A] = set()
        self._extra = 0  # hints outside the list followed in this round

    def failed(self, hint: A | None = None) -> bool:
        """The attempt at `target` failed (`hint`: the leader its refusal named). True: try the new `target` at
        once; False: the round is over, back off before trying the new `target`."""
        self._tried.add(self.target)
        if hint is not None and hint not in self._tried:
            if hint in self.members or self._extra < len(self.members):
                self._extra += hint not in self.members
                self.target = hint
                return True
        members = self.members
        start = members.index(self.target) + 1 if self.target in members else 0
        for offset in range(len(members)):
            member = members[(start + offset) % len(members)]
            if member not in self._tried:
                self.target = member
                return True
        self._new_round(hint)
        return False

    def connected(self) -> None:
        """Logged in at `target`: it is the leader."""
        self.leader = self.target
        self._tried.clear()
        self._extra = 0

    def lost(self, hint: A | None = None) -> None:
        """The connection to the leader ended (`hint`: the leader it named, if it refused on the way out)."""
        self._new_round(hint)

    def _new_round(self, hint: A | None) -> None:
        self._tried.clear()
        self._extra = 0
        self.target = hint if hint is not None else self.leader if self.leader is not None else self.members[0]
