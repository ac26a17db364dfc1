"""Following the leader after a connection is lost: the one policy of every tool given several cores.

Theory of operation
-------------------
A `Link` (`idled.client.link`) already finds the leader among several cores (`idled.client.leader`) and, with
``reconnect=True``, logs in again after any retryable failure, for ever and without a word. That suits an
application, not a program an operator watches: `idled watch`, `idled user`, `idled query` ran with
``reconnect=False`` so that a lost daemon is said, not retried silently -- and so exited at the first failover
although they were given the other core. `Follow` is what they (and `idled hook`) use instead, through the
`Following` mixin of their link class:

* *What is followed.* A retryable failure (the leader killed or stepping down, ``not_leader``,
  ``server_shutdown``, ``busy``...). Not ``idle_timeout``: that is this client's own silence (a paused
  process, ``idled user --silent``), not the leader's loss, and hiding it would hide the fault. Not the first
  login unless ``from_start``: a command line's first login tries one round of the cores and fails at once
  (a typo, nothing running); a service (`idled hook`) waits for the daemon from the start.
* *For how long.* From the loss of a connection that was up (or, with ``from_start``, from the first failure),
  while no core takes the login, the link keeps its rounds and backoff; ``give_up_after`` seconds later (None:
  never) the next round end is final, and the link's final error becomes one `ConnectionLost` saying so:
  ``no core took the login within 60 s (of A, B; last: ...)``. A login resets the clock.
* *What is said.* One line per step, through ``say``: the loss (``lost the core at A (...): looking for
  the leader among A, B``), each round that ended without a login (``no core took the login (...); next round
  in 0.4 s``) and the login that ended the search (``now on B``). Hops inside a round are not said: they
  are immediate, a line each would be noise.

By hand, cores ``[A, B]``, A killed at t=10, B elected at t=13, ``give_up_after`` 60::

    keep_trying(lost, settled=1, now=10)           a connection that was up: the clock starts, True
    retrying(A, was_up)                            "lost the core at A (...): looking for the leader among A, B"
    (A refused, B not_leader naming A: round over)
    keep_trying(not_leader, settled=1, 10.1)       0.1 s of 60: True; "no core took the login (...); next round in 0.2 s"
    logged_in(B, settled=2) at t=13.2               "now on B"; the next loss starts a new clock

Pure but for ``say``: the times are arguments, the link passes its runtime's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from idled.client.errors import ClientError, ConnectionLost
from idled.client.link import Link
from idled.protocol import ErrorCode
from idled.protocol.address import format_address

__all__ = ["Follow", "Following"]


class Follow:
    """The follow policy of one link (see the module docstring)."""

    __slots__ = ("say", "give_up_after", "from_start", "lost_at", "gave_up", "_settled", "_round")

    def __init__(self, say: Callable[[str], None], *, give_up_after: float | None = 60.0,
                 from_start: bool = False) -> None:
        if give_up_after is not None and not give_up_after > 0:
            raise ValueError("give_up_after must be positive (None: never give up)")
        self.say = say
        self.give_up_after = give_up_after
        self.from_start = from_start
        self.lost_at: float | None = None  # when the search began (None: logged in)
        self.gave_up: str | None = None  # why the search ended without a login
        self._settled = 0  # the link's count of connections set up, at the last look
        self._round: dict[str, str] = {}  # this round's failures: core -> what it said

    def keep_trying(self, exc: ClientError, settled: int, now: float, cores: str) -> bool:
        """Whether the link goes on after ``exc`` (``settled``: its connections set up so far, `Link._settle`;
        ``cores``: their list)."""
        if not exc.retryable or exc.code == ErrorCode.IDLE_TIMEOUT:
            return False
        if settled == 0 and not self.from_start:
            return False  # the first login: one round, then the command says what failed
        if settled != self._settled or self.lost_at is None:
            self._settled, self.lost_at = settled, now  # a connection that was up just ended
        if self.give_up_after is None or now - self.lost_at < self.give_up_after:
            return True
        self.gave_up = f"no core took the login within {self.give_up_after:g} s (of {cores}; last: {exc})"
        return False

    def retrying(self, where: str, cores: Sequence[str], exc: ClientError, was_up: bool, delay: float) -> None:
        """The connection at ``where`` ended (``was_up``) or a round ended; the next try is in ``delay`` s."""
        if was_up:
            self._round.clear()
            self.say(f"lost the core at {where} ({exc}): looking for the leader among {', '.join(cores)}"
                     if len(cores) > 1 else f"lost the daemon at {where} ({exc}); logging in again")
            return
        self._round[where] = str(exc)
        if delay > 0:  # the round is over: what each core said, once
            said = "; ".join(f"{core}: {text}" for core, text in self._round.items())
            self._round.clear()
            self.say(f"no core took the login ({said}); next round in {delay:.1f} s" if len(cores) > 1
                     else f"cannot log in at {where} ({exc}); retrying in {delay:.1f} s")

    def logged_in(self, where: str, settled: int) -> None:
        """Logged in (and set up) at ``where`` (``settled``: connections set up so far, this one included)."""
        self.lost_at = None
        self._round.clear()
        if settled > 1:
            self.say(f"now on {where}")


class Following(Link):
    """A link that follows the leader by `Follow` when its ``follow`` is set (None: the plain link). A mixin:
    ``class WatchObserver(Following, Observer)``, then set its ``follow`` to a ``Follow(...)`` before it runs."""

    follow: Follow | None = None

    @property
    def where(self) -> str:
        """The core being tried or connected to, as ``HOST:PORT``."""
        return format_address((self.host, self.port))

    @property
    def core_list(self) -> tuple[str, ...]:
        """The cores given, as ``HOST:PORT``."""
        return tuple(format_address(member) for member in self.cores.members)

    def _retryable(self, exc: ClientError) -> bool:
        follow = self.follow
        if follow is None:
            return super()._retryable(exc)
        return follow.keep_trying(exc, self.settled, self.runtime.now(), ", ".join(self.core_list))

    def _on_retry(self, exc: ClientError, was_up: bool, delay: float) -> None:
        super()._on_retry(exc, was_up, delay)
        if self.follow is not None:
            self.follow.retrying(self.where, self.core_list, exc, was_up, delay)

    def _on_settled(self) -> None:
        super()._on_settled()
        if self.follow is not None:
            self.follow.logged_in(self.where, self.settled)

    def _on_done(self) -> None:
        follow = self.follow
        if follow is not None and follow.gave_up is not None and self.error is not None:
            self.error = ConnectionLost(follow.gave_up)  # before the role fails its waiters with it
        super()._on_done()
