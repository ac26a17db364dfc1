"""A core that can change role while it runs: leader (a `Server`) or hot standby (a `StandbyServer`).

Theory of operation
-------------------
``idled serve --election etcd://...`` and ``idled serve --standby-of HOST:PORT`` run a `Node`. Its one loop
asks the election (``idled.server.election``: `EtcdElection`, or `ManualElection` for a standby promoted by
hand) what this process is, and runs that role until the answer changes:

* **leader** (the election says so *and* its lease deadline has not passed): a `Server` on the data
  directory, which recovers the log as after any restart -- open sessions it finds end with reason
  ``restart``, then edges re-attach theirs -- and starts its seqs past the mark kept in etcd
  (``idled.server.engine.seqs``). It runs fenced (``idled.server.election.fence``): once the lease is lost it stops before its
  next write, and the loop goes on to follow the new leader.
* **follower** (another core's address is known): a `StandbyServer` following that address, which refuses
  user and gateway logins with ``not_leader`` naming it, and serves observers from its copy. When the leader
  changes -- or we win -- it is stopped (its link syncs what it wrote) and the loop goes round.
* **nobody known** (etcd unreachable, or a campaign between two leaders): nothing listens until it is.

The roles are built fresh each time (their own metrics registry, their own listeners), so a role change is
a restart of the serving part inside one process, and what each role recovers from disk is all it knows.
One thing is the node's, not a role's: how it reaches a leader (``idled.door.outbound.LinkPolicy``: TLS with
``link_tls``, its files loaded once at start). A configuration the two cores cannot speak is fatal at the
first follow if nothing has worked yet (no link logged in, the node never led), and only logged afterwards.
SIGTERM/SIGINT stop whichever role runs (a leader ends its sessions ``shutdown`` as always) and then the
node, which resigns: the lease is revoked and another core takes over at once. Signals that come between two
roles are held by the node's own receiver and stop it there. SIGUSR1 promotes a standby run without an
election (``idled promote``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import trio

from idled.door.door import Door, Listening
from idled.door.outbound import LinkPolicy
from idled.ops import systemd
from idled.ops.config import Config
from idled.server.election import Election, ManualElection
from idled.server.election.base import Status
from idled.server.election.fence import stepped_down
from idled.server.roles.doorway import auth_secret
from idled.server.runtime.signals import SIGNALS

__all__ = ["Node", "Role", "RoleFactory"]

log = logging.getLogger("idled.server.node")

RESIGN_TIMEOUT = 5.0  # seconds a resignation may take on the way out (the lease expires by itself anyway)



class Role(Protocol):
    """What a node runs at a time: a `Server` (the leader) or a `StandbyServer` (a follower)."""

    @property
    def largest_stall(self) -> float: ...

    async def serve(self, listeners: Listening, *, task_status: trio.TaskStatus[list[int]]) -> None: ...

    def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


class RoleFactory(Protocol):
    """``(config, election)`` -> a leader (`Server`, fenced by ``election``); ``(config with standby_of,
    None, link=the node's LinkPolicy)`` -> a follower (`StandbyServer`)."""

    def __call__(self, config: Config, election: Election | None, *, link: LinkPolicy | None = None) -> Role: ...


class Node:
    """One core under an election (see the module docstring). ``make_role(config, election, link=policy)``: a
    `Server` when ``election`` is given, a `StandbyServer` (``config.standby_of`` set) when it is None."""

    def __init__(self, config: Config, election: Election, make_role: RoleFactory,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.election = election
        self.make_role = make_role
        self.clock = clock
        self.address = config.advertised_address() if config.election else None
        self.role: Role | None = None
        self.links = LinkPolicy()  # replaced at start by the configuration's (idled.door.outbound)
        self.largest_stall = 0.0
        self.env = os.environ  # systemd's LISTEN_FDS are taken from here (and unset)
        self._sockets: dict[str, list[trio.socket.SocketType]] = {}  # by endpoint name (idled.door)
        self._stop = trio.Event()
        self._switching = False  # the loop itself is stopping the role (a role change, not a signal)

    async def _open_listeners(self) -> Listening:
        """The client port (systemd's sockets, else ours), opened through the door once for the process: the
        roles get copies, so connections wait in its backlog while the roles change. The rule is judged on
        every endpoint first; each role opens its metrics endpoint (and a leader its API) through its own door,
        so that between two roles they refuse at once rather than leave a probe hanging on a backlog."""
        door = Door.of(self.config, secret=auth_secret(self.config) is not None, env=self.env)
        door.check()
        return {"client": await door.open("client")}

    def stop(self) -> None:
        self._stop.set()
        if self.role is not None:
            self.role.stop()

    async def run(self) -> None:
        async with contextlib.AsyncExitStack() as resources:
            if isinstance(self.election, contextlib.AbstractAsyncContextManager):
                await resources.enter_async_context(self.election)  # EtcdElection's HTTP client
            await self._run()

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            # Held for the node's whole life: signals between two roles land here (a role holds its own).
            with trio.open_signal_receiver(*SIGNALS, signal.SIGUSR1) as signals:
                nursery.start_soon(self._on_signals, signals)
                self.links = LinkPolicy.of(self.config)  # a link file that does not load: one line, now
                self._sockets = {name: [listener.socket for listener in group]
                                 for name, group in (await self._open_listeners()).items()}
                await nursery.start(self.election.run)
                # READY=1 now (a core waiting for a leader, or for etcd, is up: the roles say it again) and the
                # watchdog from the node's own loop, whatever role runs or none (a standby has no monitor).
                systemd.notify(systemd.READY)
                nursery.start_soon(_watchdog, systemd.watchdog_interval())
                try:
                    await self._roles()
                finally:
                    systemd.notify(systemd.STOPPING)
                    for group in self._sockets.values():
                        for sock in group:
                            sock.close()
                    with trio.move_on_after(RESIGN_TIMEOUT) as scope:
                        scope.shield = True
                        await self.election.resign()
            nursery.cancel_scope.cancel()

    async def _roles(self) -> None:
        board = self.election.status
        while not self._stop.is_set():
            status = board.current
            if status.leader and self.election.is_leader(self.clock()):
                await self._lead(status)
            elif not status.leader and status.address is not None and status.address != self.address:
                await self._follow(status)
            else:
                log.info("no leader known (%s): waiting", status.reason)
                await self._until_changed(status)

    async def _lead(self, status: Status) -> None:
        log.warning("leading (%s): serving as the active core", status.reason)
        systemd.notify(systemd.status(f"leader ({status.reason})"))
        self.links.proven()  # a follow after leading is "later": its mismatches are logged, not fatal
        server = self.make_role(dataclasses.replace(self.config, standby_of=None), self.election)
        try:
            await self._run_role(server, status, watch=False)
        except BaseException as exc:
            down = stepped_down(exc)
            if down is None:
                raise
            log.warning("stepped down (%s): nothing more is written; following the new leader", down)
            return
        self._stopped_by_role()

    async def _follow(self, status: Status) -> None:
        assert status.address is not None
        log.warning("following the leader at %s (%s)", status.address, status.reason)
        systemd.notify(systemd.status(f"standby of {status.address}"))
        config = dataclasses.replace(self.config, standby_of=status.address, election=None, api_port=0)
        await self._run_role(self.make_role(config, None, link=self.links), status, watch=True)
        self._stopped_by_role()

    async def _run_role(self, role: Role, status: Status, *, watch: bool) -> None:
        """Serve ``role`` until it stops; with ``watch``, stop it as soon as the election's status changes."""
        self.role, self._switching = role, False
        try:
            async with trio.open_nursery() as nursery:

                async def serve(task_status: trio.TaskStatus[list[int]]) -> None:
                    # Each role accepts on copies of the node's sockets and closes them when it ends: the
                    # sockets stay bound, connections wait in their backlog while the roles change.
                    listeners = {name: [trio.SocketListener(sock.dup()) for sock in group]
                                 for name, group in self._sockets.items()}
                    await role.serve(listeners, task_status=task_status)
                    nursery.cancel_scope.cancel()  # the watcher too

                if watch:
                    nursery.start_soon(self._stop_on_change, role, status)
                await nursery.start(serve)
        finally:
            self.role = None
            self.largest_stall = max(self.largest_stall, role.largest_stall)

    async def _stop_on_change(self, role: Role, status: Status) -> None:
        await self.election.status.next(status.version)
        self._switching = True
        role.stop()

    def _stopped_by_role(self) -> None:
        if not self._switching:  # SIGTERM/SIGINT reached the role: the node stops with it
            self._stop.set()

    async def _until_changed(self, status: Status) -> None:
        async with trio.open_nursery() as nursery:
            async def changed() -> None:
                await self.election.status.next(status.version)
                nursery.cancel_scope.cancel()

            nursery.start_soon(changed)
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _on_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGUSR1:
                self._promote()
            elif signum != signal.SIGHUP:
                log.info("%s: stopping", signal.Signals(signum).name)
                self.stop()

    def _promote(self) -> None:
        if not isinstance(self.election, ManualElection):
            log.warning("SIGUSR1 (promote) ignored: under --election the leader is chosen in etcd; stop the "
                        "leader (SIGTERM) to hand over")
        elif self.election.promote():
            log.warning("SIGUSR1: promoted by hand; stopping the standby link and taking over")
        else:
            log.info("SIGUSR1: already promoted")


async def _watchdog(interval: float | None) -> None:
    """WATCHDOG=1 every ``interval`` seconds (as systemd asks: half its WatchdogSec) from this event loop."""
    if interval is None:
        return
    while True:
        systemd.notify(systemd.WATCHDOG)
        await trio.sleep(interval)
