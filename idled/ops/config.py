"""One frozen configuration object for `idled serve`: TOML file < environment < command line.

Every setting is declared once, as a field of ``Config`` (type, default) with its line in ``HELP``; the
argparse flags (``--max-timeout``), the TOML keys (``max_timeout``, flat, top level) and the environment variables
(``IDLED_MAX_TIMEOUT``) are all derived from it, so the three can never drift apart. Flags default to
``None`` so that only flags actually given override the file and the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from idled.core.detector import MAX_TIMEOUT_TICKS
from idled.core.timeouts import DEFAULT_MAX_TIMEOUT, DEFAULT_TICK, DEFAULT_TIMEOUT
from idled.log.eventlog import FSYNC_POLICIES
from idled.protocol import DEFAULT_MAX_FRAME
from idled.protocol.address import AddressError, HostPort, format_address, parse_address
from idled.protocol.address import parse_port as parse_port_number

DETECTORS = ("ring", "scan", "heap")
POLICIES = ("lazy", "eager")
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_WORKERS = 256  # edge processes; more than the cores of any machine idled runs on


def parse_workers(value: str) -> int:
    """``--workers``: a count, or ``auto`` = one edge per core (``os.cpu_count()``)."""
    if value.strip().lower() == "auto":
        return os.cpu_count() or 1
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"workers must be a number or auto, got {value!r}") from None


def parse_port(value: str, name: str = "port") -> int:
    """``--port``, ``--metrics-port`` and their variables: a TCP port number to listen on, 0..65535 (the one
    grammar's, ``idled.protocol.address``). The error names the setting and the value; argparse or the loader
    prefixes where it came from (``argument --port: ...``)."""
    try:
        return parse_port_number(value, listen=True)
    except AddressError as exc:
        if exc.problem == "out of range":
            raise ConfigError(f"{name} must be 0..65535, got {int(value)}") from None
        raise ConfigError(f"{name} must be a number 0..65535, got {value!r}") from None


def address_setting(value: str, name: str = "address") -> HostPort:
    """A core's address setting (``standby_of``, ``advertise``): ``HOST:PORT`` or ``[IPV6]:PORT`` as the one
    grammar reads it (``idled.protocol.address``: no default port, no unix socket); ConfigError naming the
    setting otherwise."""
    try:
        return parse_address(value)
    except AddressError as exc:
        raise ConfigError(f"{name}: {exc}") from None


class ConfigError(ValueError):
    """A setting is missing, unknown or out of range: reported before anything starts."""


@dataclass(frozen=True, slots=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 7878
    timeout: float = DEFAULT_TIMEOUT
    tick: float = DEFAULT_TICK
    slots: int = 30
    max_timeout: float = DEFAULT_MAX_TIMEOUT
    detector: str = "ring"
    policy: str = "lazy"
    max_frame: int = DEFAULT_MAX_FRAME
    max_gateway_frame: int = 1 << 20
    login_timeout: float = 5.0
    max_connections: int = 100_000
    # Connections from one source (an IPv6 /64) not logged in yet, on the client port and the HTTP API
    # (idled.door.gate): one address cannot take the room everyone else needs to log in.
    max_pending_per_address: int = 100
    secret_file: str | None = None
    insecure: bool = False
    data_dir: str | None = None  # None: $STATE_DIRECTORY under systemd, else ./idled-data
    fsync: str = "interval"
    fsync_interval: float = 1.0
    # Durable observers wait for a standby's acknowledgement too, while one is attached (docs/ha.md).
    sync_standby: bool = False
    segment_bytes: int = 64 << 20
    retention_bytes: int = 1 << 30
    retention_seconds: float = 7 * 86400.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9878
    log_level: str = "info"
    # Stall guard: a loop that could not run for this many ticks was paused; see Server.now.
    stall_ticks: float = 2.0
    # Seconds an edge (a gateway that reports watermarks) keeps its sessions after losing its connection
    # without bye, so a reconnect resumes them with no event (idled.server.roles.gateways); 0 = lost at once.
    gateway_grace: float = 15.0
    # Seconds a query with last_seen still answers when an offline user was last seen (the event log keeps
    # uid -> last_seen, snapshotted beside the open sessions: idled.log.lastseen); 0 disables the store.
    last_seen_horizon: float = 30 * 86400.0
    # Devices (idled.core.presence): session keys one user may hold at once; a login of one more ends the
    # oldest (kicked, no event).
    max_devices: int = 8
    # Seconds a user whose last session closed without bye stays online before its offline (with the
    # original ts) is emitted; a login within it continues the user with no event. 0 = offline at once.
    offline_grace: float = 0.0
    # GC policy (idled.ops.gcpolicy): seconds between two full walks of every object, in each process.
    gc_thaw_every: float = 3600.0
    # Edge processes in front of the core (`idled serve --workers N`); 0 = one process. "auto" (flag, TOML
    # or environment) is resolved to os.cpu_count() when the configuration is read.
    workers: int = 0
    # TLS on the client port (idled.door.tls): both PEM files, or neither.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # PROXY protocol v1/v2 from the balancers in proxy_allow (comma-separated CIDRs).
    proxy_protocol: bool = False
    proxy_allow: str = "127.0.0.0/8,::1"
    # WebSocket on the client port (idled.door.websocket): browser origins allowed besides the same origin
    # (comma-separated scheme://host[:port], "*" any; empty: same-origin pages and non-browser clients only).
    ws_origins: str = ""
    # Uids in one observer's watchlist (subscribe uids / watch); beyond it: not_allowed (idled.server.roles.watchlists).
    max_watch: int = 100_000
    # The HTTP presence API (idled.server.api, docs/api.md), on its own listener; api_port 0 = off.
    api_host: str = "127.0.0.1"
    api_port: int = 0
    api_max_batch: int = 10_000
    api_max_body: int = 1 << 20
    api_max_clients: int = 256
    api_rate: float = 1000.0
    api_burst: int = 2000
    api_request_timeout: float = 10.0
    api_heartbeat: float = 15.0
    # Run as a hot standby of the active core at HOST:PORT (idled.server.ha.follow, docs/ha.md); None: active.
    standby_of: str | None = None
    # Leader election in etcd (idled.server.node, docs/ha.md): etcd://HOST:PORT[,...]/prefix; None: no election.
    election: str | None = None
    # HOST:PORT other cores and clients are told to reach this core at (default: host:port when both are usable).
    advertise: str | None = None
    # Seconds of the leader's etcd lease: a dead leader is replaced within about this.
    election_ttl: int = 5
    # Links to another core over TLS (idled.door.outbound, docs/tls.md#links-between-processes): a standby's to
    # its active, a follower's to its leader, an edge's to its core and every connection it relays.
    link_tls: bool = False
    link_ca: str | None = None  # None: the system's trust store
    link_server_name: str | None = None  # None: the host of the address the link connects to
    link_cert: str | None = None  # a client certificate the link presents (its login still carries a token)
    link_key: str | None = None

    def validate(self) -> Config:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        need(0 <= self.port <= 65535, f"port must be 0..65535, got {self.port}")
        need(0 <= self.metrics_port <= 65535, f"metrics_port must be 0..65535, got {self.metrics_port}")
        need(0.001 <= self.tick <= 60, "tick must be between 0.001 and 60 seconds")
        need(self.tick <= self.timeout <= self.max_timeout, "need tick <= timeout <= max_timeout")
        need(self.max_timeout <= 10 * 86400, "max_timeout is at most ten days")
        need(
            self.max_timeout / self.tick <= MAX_TIMEOUT_TICKS,
            f"max_timeout / tick must be at most {MAX_TIMEOUT_TICKS} ticks (the detectors' limit)",
        )
        need(1 <= self.slots <= 1_000_000, "slots must be 1..1000000")
        need(self.detector in DETECTORS, f"detector must be one of {', '.join(DETECTORS)}")
        need(self.policy in POLICIES, f"policy must be one of {', '.join(POLICIES)}")
        need(self.fsync in FSYNC_POLICIES, f"fsync must be one of {', '.join(FSYNC_POLICIES)}")
        need(self.log_level in LOG_LEVELS, f"log_level must be one of {', '.join(LOG_LEVELS)}")
        need(16 <= self.max_frame <= self.max_gateway_frame <= 64 << 20, "need 16 <= max_frame <= max_gateway_frame <= 64 MiB")
        need(0 < self.login_timeout <= 3600, "login_timeout must be in (0, 3600]")
        need(1 <= self.max_connections <= 10_000_000, "max_connections must be 1..10000000")
        need(1 <= self.max_pending_per_address <= 10_000_000, "max_pending_per_address must be 1..10000000")
        need(self.fsync_interval > 0, "fsync_interval must be positive")
        need(self.segment_bytes >= 4096, "segment_bytes must be at least 4096")
        need(self.retention_bytes >= self.segment_bytes, "retention_bytes must be at least segment_bytes")
        need(self.retention_seconds > 0, "retention_seconds must be positive")
        need(self.stall_ticks >= 1, "stall_ticks must be at least 1")
        need(0 <= self.gateway_grace <= 3600, "gateway_grace must be 0..3600 seconds")
        need(0 <= self.last_seen_horizon <= 100 * 365 * 86400, "last_seen_horizon must be 0..3153600000 seconds (100 years)")
        need(1 <= self.max_devices <= 1024, f"max_devices must be 1..1024, got {self.max_devices}")
        need(0 <= self.offline_grace <= 3600, f"offline_grace must be 0..3600 seconds, got {self.offline_grace:g}")
        need(1 <= self.gc_thaw_every <= 7 * 86400, "gc_thaw_every must be 1..604800 seconds")
        need(0 <= self.workers <= MAX_WORKERS, f"workers must be 0..{MAX_WORKERS} or auto")
        need(self.workers <= self.max_connections, "need workers <= max_connections (each edge gets a share)")
        need(bool(self.tls_cert) == bool(self.tls_key), "tls_cert and tls_key go together (both PEM files, or neither)")
        need(not self.tls_client_ca or bool(self.tls_cert), "tls_client_ca needs tls_cert and tls_key")
        for part in (p.strip() for p in self.proxy_allow.split(",")):
            try:
                if part:
                    ipaddress.ip_network(part, strict=False)
            except ValueError:
                raise ConfigError(f"proxy_allow: {part!r} is not an address or CIDR") from None
        need(not self.proxy_protocol or bool(self.proxy_allow.strip()), "proxy_protocol needs proxy_allow (the balancers' addresses)")
        need(1 <= self.max_watch <= 10_000_000, "max_watch must be 1..10000000")
        need(0 <= self.api_port <= 65535, f"api_port must be 0..65535, got {self.api_port}")
        need(1 <= self.api_max_batch <= 1_000_000, "api_max_batch must be 1..1000000")
        need(1024 <= self.api_max_body <= 256 << 20, "api_max_body must be 1024..268435456 bytes")
        need(1 <= self.api_max_clients <= 100_000, "api_max_clients must be 1..100000")
        need(0 < self.api_rate <= 10_000_000 and 1 <= self.api_burst <= 100_000_000,
             "api_rate must be in (0, 10000000] requests/s and api_burst 1..100000000")
        need(0 < self.api_request_timeout <= 3600, "api_request_timeout must be in (0, 3600]")
        need(0 < self.api_heartbeat <= 3600, "api_heartbeat must be in (0, 3600] seconds")
        if self.election is not None:
            need(self.standby_of is None, "election and standby_of exclude each other: with an election the "
                 "leader is found in etcd")
            need(not self.workers, "an elected core (election) runs without workers: run idled edge --core A,B "
                 "in front of the cores")
            need(2 <= self.election_ttl <= 600, "election_ttl must be 2..600 seconds")
            address_setting(self.advertised_address(), "advertise")
        self._validate_links(need)
        if self.standby_of is not None:
            address_setting(self.standby_of, "standby_of")
            need(not self.workers and not self.api_port, "a standby (standby_of) runs without workers and api_port")
        return self

    def _validate_links(self, need: Callable[[bool, str], None]) -> None:
        need(bool(self.link_cert) == bool(self.link_key), "link_cert and link_key go together (both PEM files, or neither)")
        for name in ("link_ca", "link_server_name", "link_cert"):
            need(self.link_tls or not getattr(self, name), f"{name} needs link_tls (the link is plaintext without it)")
        # Both cores of an election run this configuration: one that serves TLS is a leader its peer must
        # reach over TLS (refused here, by serve and check-config alike, rather than by a follower that
        # loops on tls_required).
        need(self.election is None or not self.tls_cert or self.link_tls,
             "an elected core that serves TLS (tls_cert) follows its leader over TLS: give link_tls (and link_ca, "
             "the CA of the cores' certificates)")

    def advertised_address(self) -> str:
        """What other cores and clients are told to reach this core at: ``advertise``, else host:port."""
        if self.advertise is not None:
            return self.advertise
        if self.port == 0 or self.host in ("", "0.0.0.0", "::"):
            raise ConfigError("advertise is needed (HOST:PORT) when host is a wildcard or port is 0")
        return format_address((self.host, self.port))

    @property
    def detector_kind(self) -> str:
        """The name `idled.core.factory.make_detector` takes."""
        return f"ring-{self.policy}" if self.detector == "ring" else self.detector

    def resolved_data_dir(self, env: Mapping[str, str] = os.environ) -> Path:
        if self.data_dir:
            return Path(self.data_dir)
        state = env.get("STATE_DIRECTORY", "").split(":")[0]  # systemd may list several
        return Path(state) if state else Path("idled-data")


HELP: dict[str, str] = {
    "host": "address to listen on; any non-loopback listener (systemd's too, the API's and the metrics endpoint's) "
            "needs --secret-file or --insecure",
    "port": "TCP port for clients; 0 picks a free one (logged)",
    "timeout": "seconds of silence before a user is offline, for clients that send no keepalive",
    "tick": "detector resolution in seconds: offline fires at most one tick after the deadline",
    "slots": "ring size of the timing wheel in ticks; longer timeouts go to the overflow wheel",
    "max_timeout": "upper bound of any timeout; a client asking for keepalive k gets min(1.5k, this)",
    "detector": "expiry detector: ring (timing wheel), scan or heap (baselines for comparison)",
    "policy": "ring refile policy: lazy (keepalive = one dict store) or eager (move on every keepalive)",
    "max_frame": "largest frame in bytes a user, observer or unauthenticated peer may send",
    "max_gateway_frame": "largest frame in bytes a logged-in gateway may send",
    "login_timeout": "seconds a new connection has to log in",
    "max_connections": "connections beyond this are refused with a busy error; capped to what the open-file limit allows",
    "max_pending_per_address": "connections from one address (an IPv6 /64) that have not logged in yet, on the client "
                               "port and the HTTP API (not yet authenticated); beyond it a new one is refused",
    "secret_file": "HMAC secret for login tokens (default unset: auth is off, loopback only)",
    "insecure": "allow listening on a non-loopback address without auth: anyone who can connect may log in as "
                "anyone and read the status (default off)",
    "data_dir": "event-log directory (default $STATE_DIRECTORY under systemd, else ./idled-data)",
    "fsync": "event-log durability: always, interval or never",
    "fsync_interval": "seconds between fsyncs with --fsync interval",
    "sync_standby": "synchronous replication: while a standby is attached and caught up, durable observers get an "
                    "event only once that standby has synced it too; with none, this core's own fsync alone "
                    "(docs/ha.md; default off)",
    "segment_bytes": "event-log segment size before rotation",
    "retention_bytes": "event-log total size kept",
    "retention_seconds": "event-log age kept",
    "metrics_host": "address of the metrics endpoint (/metrics, probes, status); a non-loopback one needs "
                    "--secret-file or --insecure",
    "metrics_port": "port of the Prometheus endpoint; 0 disables it",
    "log_level": "debug, info, warning or error",
    "stall_ticks": "a pause of the event loop this many ticks long moves every deadline by the pause",
    "gateway_grace": "seconds an edge that lost its connection (without bye) keeps its sessions online, so that its "
                     "reconnect resumes them without an offline/online pair; 0 ends them at once (gateway_lost)",
    "last_seen_horizon": "seconds a query with last_seen still says when an offline user was last seen (kept in "
                         "the event log's snapshots, across restarts and retention); 0 disables it",
    "max_devices": "sessions (devices) one user may hold at once; a login of one more device ends the user's oldest "
                   "session (kicked, no event)",
    "offline_grace": "seconds a user whose last connection closed without bye stays online; a login within them "
                     "continues it with no event, else its offline carries the original time; 0 = offline at once",
    "gc_thaw_every": "seconds between two full garbage-collector walks of every object, in the core and in each edge "
                     "(each pauses the event loop: 200-800 ms at 19k connections); in between, survivors are frozen",
    "tls_cert": "PEM certificate (chain allowed) for TLS on the client port; reloaded on SIGHUP (default unset: no TLS)",
    "tls_key": "PEM private key of --tls-cert (default unset)",
    "tls_client_ca": "CA file for optional client certificates: a verified certificate naming a gateway, observer or standby logs it in without a token, see docs/tls.md (default unset)",
    "proxy_protocol": "expect a PROXY v1/v2 header (HAProxy, nginx, AWS NLB) from the balancers in --proxy-allow on every connection",
    "proxy_allow": "comma-separated addresses/CIDRs allowed to send PROXY headers",
    "ws_origins": "browser origins (scheme://host[:port], comma-separated; * for any) whose pages may open a WebSocket "
                  "session on the client port, besides a page of the same origin; clients that send no Origin are "
                  "not browsers and are served (default empty: cross-site pages refused, 403)",
    "workers": "edge processes sharing the public port in front of the core; 0 = one process, auto = one per core",
    "max_watch": "uids one observer may watch (subscribe uids, watch); beyond it the observer is refused with not_allowed",
    "api_host": "address of the HTTP presence API (docs/api.md); a non-loopback one needs --secret-file or --insecure",
    "api_port": "port of the HTTP presence API; 0 disables it",
    "api_max_batch": "uids one presence request may ask about; beyond it: 413",
    "api_max_body": "largest HTTP API request body in bytes; beyond it: 413",
    "api_max_clients": "HTTP API connections at once; beyond it a new one is answered 503 and closed",
    "api_rate": "HTTP API requests per second per client address (a token bucket); beyond it: 429",
    "api_burst": "HTTP API requests a client address may make at once before --api-rate applies",
    "api_heartbeat": "seconds an HTTP event stream (GET /v1/events) may stay silent before a heartbeat comment",
    "api_request_timeout": "seconds an HTTP API request may take to arrive and be answered (and an idle keep-alive "
                           "connection may wait)",
    "standby_of": "HOST:PORT of an active core to follow as its hot standby, copying its event log; see docs/ha.md "
                  "(default unset: this core is the active one)",
    "election": "etcd://HOST:PORT[,HOST:PORT...]/prefix: campaign for leadership in etcd; the leader serves, the "
                "others follow it as hot standbys; see docs/ha.md (default unset: no election)",
    "advertise": "HOST:PORT other cores and clients are told to reach this core at (default unset: --host:--port)",
    "election_ttl": "seconds of the leader's etcd lease: a dead leader is replaced within about this (2..600)",
    "link_tls": "reach other cores over TLS, verifying their certificate: a standby's link to its active, an elected "
                "follower's to its leader, an edge's to its core (and the connections it relays); see docs/tls.md "
                "(default off: plaintext; a unix:PATH core is always plain)",
    "link_ca": "CA file the cores' certificates are verified against, with link_tls (default unset: the system's "
               "trust store)",
    "link_server_name": "name the cores' certificates must carry, with link_tls (default unset: the host of the "
                        "address connected to; give one when cores are reached by IP and certified by name)",
    "link_cert": "PEM client certificate the links present, with link_tls, for a core whose tls_client_ca admits "
                 "it; the login still carries a token when a secret is set (default unset: none)",
    "link_key": "PEM private key of --link-cert (default unset)",
}

# Fields whose text form is not just their type (flag, TOML string, environment variable).
_PARSERS: dict[str, Callable[[str], Any]] = {
    "workers": parse_workers,
    "port": parse_port,
    "metrics_port": functools.partial(parse_port, name="metrics_port"),
    "api_port": functools.partial(parse_port, name="api_port"),
}
_CHOICES = {"detector": DETECTORS, "policy": POLICIES, "fsync": FSYNC_POLICIES, "log_level": LOG_LEVELS}


def _field_type(field: dataclasses.Field[Any]) -> type:
    text = str(field.type)
    return bool if text == "bool" else int if text == "int" else float if text == "float" else str


def flag_help(field: dataclasses.Field[Any]) -> str:
    """A setting's help line with its default, shown once (a HELP line that names its own default keeps it)."""
    text = HELP[field.name]
    if "(default" in text or _field_type(field) is bool:
        return text
    return f"{text} (default {field.default})"


def environment_help() -> str:
    """The epilog of ``idled serve --help`` and ``idled check-config --help``: where settings come from."""
    names = [f"IDLED_{field.name.upper()}" for field in dataclasses.fields(Config)]
    lines, line = [], " "
    for name in names:
        if len(line) + len(name) + 2 > 100:
            lines.append(line.rstrip())
            line = " "
        line += f" {name}"
    lines.append(line.rstrip())
    return (
        "Settings come from a TOML file (--config FILE, or the IDLED_CONFIG variable; flat keys named like the\n"
        "flags with underscores: max_timeout = 600), then IDLED_* environment variables, then flags; each\n"
        "overrides the one before, and a flag only when given. The variables:\n" + "\n".join(lines) + "\n"
        "Booleans accept 1/0, true/false, yes/no, on/off. Check a configuration without starting: idled check-config."
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE",
        help="TOML file with flat keys named like the flags (default $IDLED_CONFIG, else none)",
    )
    for field in dataclasses.fields(Config):
        flag = "--" + field.name.replace("_", "-")
        kind = _field_type(field)
        if kind is bool:
            parser.add_argument(flag, action="store_true", default=None, help=flag_help(field))
        else:
            parser.add_argument(
                flag, type=_argparse_type(field.name, kind), default=None, choices=_CHOICES.get(field.name),
                help=flag_help(field),
            )
    parser.epilog = environment_help() + ("\n\n" + parser.epilog if parser.epilog else "")


def _argparse_type(name: str, kind: type) -> Callable[[str], Any]:
    parse = _PARSERS.get(name)
    if parse is None:
        return kind

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name  # argparse names the type in its error message
    return convert


def _coerce(name: str, value: Any, kind: type, source: str) -> Any:
    if name in _PARSERS and isinstance(value, str):
        try:
            return _PARSERS[name](value)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
    elif kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif kind is str and isinstance(value, str):
        return value
    if isinstance(value, str) and kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    raise ConfigError(f"{source}: {name} must be {kind.__name__}, got {value!r}")


def load(args: argparse.Namespace | None = None, env: Mapping[str, str] = os.environ) -> Config:
    """Merge the TOML file (``--config``), ``IDLED_*`` variables and given flags, then validate."""
    fields = {field.name: field for field in dataclasses.fields(Config)}
    values: dict[str, Any] = {}
    path = getattr(args, "config", None) or env.get("IDLED_CONFIG")
    if path:
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        for name, value in table.items():
            if name not in fields:
                raise ConfigError(f"{path}: unknown setting {name!r}")
            values[name] = _coerce(name, value, _field_type(fields[name]), path)
    for name, field in fields.items():
        variable = "IDLED_" + name.upper()
        if variable in env:
            values[name] = _coerce(name, env[variable], _field_type(field), variable)
    for name in fields:
        given = getattr(args, name, None) if args is not None else None
        if given is not None:
            values[name] = given
    return Config(**values).validate()
