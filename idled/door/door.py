"""The door: every listener of every idled process is opened here, under one rule, with its gate.

Theory of operation
-------------------
A process names what it listens on as ``Endpoint``s -- the client port, the HTTP API, the metrics endpoint
(``daemon_endpoints(config)`` reads them off the daemon's configuration; ``idled edge`` and ``idled hook``
name their own) -- and builds one ``Door`` over them. Nothing else in idled makes a socket listen
(``tests/door/test_one_door.py`` holds every module to that), so a new process kind or protocol cannot forget the rule, the limits or TLS:

* **The rule** (``check``): no listener that is not local (``idled.door.addresses.is_local``) without a secret,
  unless ``insecure`` says the operator accepts that anyone who can connect is trusted (Redis's protected
  mode, made explicit). It holds for every listener alike: the metrics endpoint too, which without a secret
  would hand out the daemon's status to anyone. ``check()`` judges the endpoints as configured, before anything
  is bound or touched: an IP literal as it is, a name as it resolves (every address it resolves to), unless
  systemd passes the client port's sockets (then those are judged, once adopted). ``idled check-config`` runs
  exactly this, and every process runs it first, before it reads the event log, reserves a seq or binds.
* **Opening** (``open(name)``): binds the endpoint (the client port adopts systemd's sockets, ``LISTEN_FDS``,
  when passed), and judges the rule again on what each socket is really bound to: a socket systemd bound to
  0.0.0.0 serves the world exactly like ``--host 0.0.0.0``. A failure is one ``Fatal`` line naming the
  endpoint and the address: exit 4 for a bind that fails, 2 for the rule; sockets already opened are closed.
* **Gates** (``client_gate``, ``api_gate``, ``metrics_gate``): what each listener's handler runs every
  connection through (``idled.door.gate``): the per-address share of connections not yet authenticated, at
  the listener's limit the eviction of the oldest of them, and for the client port PROXY and TLS as configured.
  The core's internal unix socket behind ``--workers`` is opened here too (``open_unix_listener``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import socket
from collections.abc import Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio

from idled.door.addresses import bound_address, display, is_local
from idled.door.gate import Gate, Limits
from idled.door.tls import Front
from idled.ops import systemd
from idled.ops.config import Config
from idled.ops.fatal import EXIT_LISTEN, EXIT_USAGE, Fatal, fatal_on_oserror
from idled.ops.fdbudget import Budget, ConnectionLimit, edge_budget

__all__ = [
    "METRICS_MAX_CLIENTS", "METRICS_PER_ADDRESS", "WHAT", "Door", "Endpoint", "api_gate", "client_gate",
    "Listening", "close_all", "expected_limit", "http_connections", "open_unix_listener", "daemon_endpoints", "metrics_gate", "reload_gate",
]

log = logging.getLogger("idled.door")

WHAT: Final = {"client": "client port", "api": "HTTP API", "metrics": "metrics endpoint"}
Listening = dict[str, list[trio.SocketListener]]  # what a process listens on, by endpoint name

METRICS_PER_ADDRESS: Final = 4  # a prober or a scraper holds one or two at a time
METRICS_MAX_CLIENTS: Final = 64  # connections the metrics endpoint serves at once; the oldest idle one makes room


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One listener a process opens: ``name`` is client, api or metrics."""

    name: str
    host: str
    port: int

    @property
    def what(self) -> str:
        return WHAT.get(self.name, self.name)

    def where(self) -> str:
        """``client port 127.0.0.1:7878``: the endpoint as an error line names it."""
        return f"{self.what} {display(self.host, self.port)}"


def daemon_endpoints(config: Config) -> list[Endpoint]:
    """The daemon's endpoints as configured: the client port, and the metrics endpoint and the HTTP API when
    their ports are not 0."""
    endpoints = [Endpoint("client", config.host, config.port)]
    if config.metrics_port:
        endpoints.append(Endpoint("metrics", config.metrics_host, config.metrics_port))
    if config.api_port:
        endpoints.append(Endpoint("api", config.api_host, config.api_port))
    return endpoints


class Door:
    """The listeners of one process (see the module docstring). ``secret``: whether logins and tokens are
    checked (a secret is configured); ``env``: where systemd's ``LISTEN_FDS`` are read (and unset)."""

    def __init__(self, endpoints: Sequence[Endpoint], *, secret: bool, insecure: bool,
                 env: MutableMapping[str, str]) -> None:
        self.endpoints = {endpoint.name: endpoint for endpoint in endpoints}
        self.secret = secret
        self.insecure = insecure
        self.env = env

    @classmethod
    def of(cls, config: Config, *, secret: bool, env: MutableMapping[str, str], api: bool = True) -> Door:
        """The door of a daemon process: its configured endpoints (``daemon_endpoints``; without the HTTP API when
        ``api`` is False: an edge's configuration may share a file that names one)."""
        endpoints = daemon_endpoints(config if api else dataclasses.replace(config, api_port=0))
        return cls(endpoints, secret=secret, insecure=config.insecure, env=env)

    def check(self) -> None:
        """The rule on every endpoint as configured (``Fatal``, exit 2, naming the first that breaks it)."""
        if self.secret or self.insecure:
            return
        for endpoint in self.endpoints.values():
            if endpoint.name == "client" and self.env.get("LISTEN_FDS"):
                continue  # systemd's sockets are what will be served: judged once adopted
            for host in _resolve(endpoint.host):
                self._judge(endpoint, host, endpoint.port)

    async def open(self, name: str) -> list[trio.SocketListener]:
        """Bind (or, for the client port, adopt systemd's) and judge the bound addresses; Fatal otherwise."""
        endpoint = self.endpoints[name]
        inherited = systemd.listen_fds(self.env) if name == "client" else []
        if inherited:
            log.info("socket activation: adopting %d listening socket(s)", len(inherited))
            listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in inherited]
        else:
            with fatal_on_oserror("cannot listen", endpoint.where(), EXIT_LISTEN):
                listeners = await trio.open_tcp_listeners(endpoint.port, host=endpoint.host)
        try:
            self.judge(endpoint, listeners)
        except BaseException:
            close_all({name: listeners})
            raise
        return listeners

    async def open_all(self, given: Sequence[trio.SocketListener] | Listening | None = None) -> Listening:
        """Every endpoint's listeners, by name, the rule judged on each: ``given`` may hold some already -- a
        mapping by name (an elected node's, held for its roles), or a sequence for the client port (sockets
        passed by a parent; ``[]``: none) -- and the door opens the rest. On failure nothing stays open."""
        opened: Listening = {name: list(group) for name, group in given.items()} if isinstance(given, Mapping) else {}
        if given is not None and not isinstance(given, Mapping):
            opened["client"] = list(given)
        try:
            for name, endpoint in self.endpoints.items():
                if name in opened:
                    self.judge(endpoint, opened[name])
                else:
                    opened[name] = await self.open(name)
        except BaseException:
            close_all(opened)
            raise
        return opened

    def judge(self, endpoint: Endpoint, listeners: Sequence[trio.SocketListener]) -> None:
        """The rule on what ``listeners`` are really bound to (sockets opened elsewhere: the root's, passed on)."""
        if self.secret or self.insecure:
            return
        for listener in listeners:
            self._judge(endpoint, *bound_address(listener))

    def _judge(self, endpoint: Endpoint, host: str, port: int | None) -> None:
        if not is_local(host, port):
            raise Fatal("refusing to listen with auth off", f"{endpoint.what} {display(host, port)}",
                        "give --secret-file, or --insecure to let anyone who can connect in", EXIT_USAGE)


def expected_limit(config: Config, nofile: int, env: Mapping[str, str]) -> ConnectionLimit:
    """The connection limit `idled serve` will enforce with ``config`` under an open-file limit of ``nofile``:
    its descriptor budget (``idled.ops.fdbudget``) from the listeners it will open -- one per address an endpoint
    resolves to, or systemd's ``LISTEN_FDS`` -- and the HTTP connections they may hold; with ``--workers``, the
    edges' budgets together. What the start-up line and `idled check-config` show before anything is bound."""
    counts = {endpoint.name: max(1, len(_resolve(endpoint.host))) for endpoint in daemon_endpoints(config)}
    if env.get("LISTEN_FDS", "").isdigit():
        counts["client"] = max(1, int(env["LISTEN_FDS"]))
    if config.workers:
        return ConnectionLimit.shared(config.max_connections, config.workers, edge_budget(nofile, counts["client"]))
    http = http_connections(config, counts.keys())
    return ConnectionLimit.of(config.max_connections, Budget.of(nofile, listeners=sum(counts.values()), http=http))


def http_connections(config: Config, listening: Listening | Collection[str]) -> int:
    """Descriptors the HTTP endpoints in ``listening`` (opened: by name; or the names of those to be) may hold
    at once (the descriptor budget keeps them out of the client port's reach): the metrics endpoint's
    clients, the API's and as many being refused."""
    names = {name for name, group in listening.items() if group} if isinstance(listening, Mapping) else set(listening)
    held = METRICS_MAX_CLIENTS if "metrics" in names else 0
    return held + (2 * config.api_max_clients if "api" in names else 0)


async def open_unix_listener(path: Path, backlog: int) -> trio.SocketListener:
    """A unix stream socket listening at ``path``, mode 0600 from the start (the umask is narrowed around
    ``bind``, so it is never more open than that): local by construction, for this machine's own processes
    (the core's internal socket behind ``--workers``)."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        await sock.bind(os.fspath(path))
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    return trio.SocketListener(sock)


def close_all(listening: Listening) -> None:
    """Close every listener in ``listening`` (a start that failed after opening them)."""
    for listeners in listening.values():
        for listener in listeners:
            listener.socket.close()


def _resolve(host: str) -> list[str]:
    """``host`` as the rule judges it before binding: an IP literal or a wildcard as it is, a name as every
    address it resolves to (a name that does not resolve is left to the bind, which then fails)."""
    if host in ("", "localhost"):
        return [host or "0.0.0.0"]
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return [host]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return []
    return [str(info[4][0]) for info in infos]


def client_gate(config: Config, *, public: bool = True) -> Gate:
    """The client port's gate: ``max_pending_per_address``, and PROXY/TLS as configured (``public`` False:
    the core's internal unix socket behind ``--workers``, whose edges terminate those)."""
    front = Front(config) if public else None
    limits = Limits(config.max_pending_per_address, evict_after=config.login_timeout / 2)
    return Gate(limits, front if front is not None and front.active else None)


def api_gate(config: Config) -> Gate:
    """The HTTP API's gate: connections that have not made an authenticated request, per address."""
    return Gate(Limits(config.max_pending_per_address, evict_after=config.api_request_timeout / 2))


def metrics_gate() -> Gate:
    """The metrics endpoint's gate: every connection is one short unauthenticated request, so a few per
    address and, when full, the oldest makes room for the newest (a prober always gets in)."""
    return Gate(Limits(METRICS_PER_ADDRESS, METRICS_MAX_CLIENTS, evict=True))


def reload_gate(gate: Gate, config: Config, *, deadline: float | None = None) -> None:
    """SIGHUP: the new per-address share for new connections (those in progress keep their counts); with
    ``deadline`` (a reloaded login deadline), the wait before a connection may be evicted: half of it."""
    evict_after = gate.limits.evict_after if deadline is None else deadline / 2
    gate.limits = dataclasses.replace(gate.limits, per_address=config.max_pending_per_address, evict_after=evict_after)

