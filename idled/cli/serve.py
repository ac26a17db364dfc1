"""`idled serve`: run the daemon (with ``--workers N``: its root, which runs the core and the edges)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from idled.ops import config as config_module
from idled.ops import systemd
from idled.ops.config import Config, ConfigError
from idled.ops.fatal import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, describe
from idled.ops.fdbudget import open_file_limit
from idled.ops.gcpolicy import GcPolicy
from idled.ops.logs import setup_logging, summary_line
from idled.protocol import tokens

if TYPE_CHECKING:
    from idled.door.outbound import LinkPolicy
    from idled.server.election import Election

log = logging.getLogger("idled.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_module.add_arguments(parser)
    # Set by the root of `idled serve --workers N` on the core it starts (idled.server.workers.root): not for people.
    parser.add_argument("--core-of-workers", metavar="FDS", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_module.load(args)
    except ConfigError as exc:
        return fatal(f"configuration: {exc}", EXIT_USAGE)
    setup_logging(cfg.log_level)
    if cfg.workers and not args.core_of_workers:
        return _run_root(cfg, args)
    soft, hard = systemd.raise_nofile_limit()  # first: the summary's connection limit depends on it
    if not args.core_of_workers:  # the root said it already
        log.info("%s", startup_summary(cfg))
    log.info("open-file limit %d (hard %d)", soft, hard)
    from idled.ops.metrics import Metrics
    from idled.server.app import Server  # not in the root: it runs no presence machinery
    from idled.server.node import Node
    from idled.server.standby import StandbyServer

    node = cfg.election is not None or cfg.standby_of is not None  # a role that may change (docs/ha.md)
    # Under a node, the roles do not talk to systemd: the node says READY/STATUS/STOPPING, pings the watchdog
    # and holds the listening sockets, once for the process (a role change must not look like a stop).
    role_env = {k: v for k, v in os.environ.items() if k not in systemd.MANAGER_VARS} if node else None

    def make_role(config: Config, election: Election | None, *, link: LinkPolicy | None = None) -> Server | StandbyServer:
        if config.standby_of is not None:  # link: the node's LinkPolicy (idled.door.outbound), one per process
            return StandbyServer(config, metrics=Metrics(_registry(), tick=config.tick), env=role_env, link=link)
        return Server(
            config, metrics=Metrics(_registry(), tick=config.tick), reload_config=lambda: config_module.load(args),
            gc_policy=GcPolicy(thaw_every=config.gc_thaw_every), workers=_workers(args.core_of_workers),
            election=election, env=role_env,
        )

    server: Server | StandbyServer | Node
    try:
        if node:
            server = Node(cfg, _election(cfg), make_role)
            tokens.load_secret(cfg.secret_file) if cfg.secret_file else None  # fail now, not at the first role
        else:
            server = make_role(cfg, None)
    except (ConfigError, tokens.SecretError, ValueError, OSError) as exc:
        return fatal(f"configuration: {exc}", EXIT_USAGE)
    status = run_until_stopped(server.run if isinstance(server, Node) else server.serve)
    if status == EXIT_OK:
        log.info("stopped; largest event-loop stall %.1f ms", 1000 * server.largest_stall)
    return status


def _election(cfg: Config) -> Any:
    """The election of a core whose role may change: etcd (``--election``), or a promotion by hand."""
    from idled.server.election import ManualElection, Timings, parse_election_url
    from idled.server.election.etcd import EtcdElection

    if cfg.election is None:
        assert cfg.standby_of is not None
        return ManualElection(cfg.standby_of)
    return EtcdElection(parse_election_url(cfg.election), cfg.advertised_address(), timings=Timings.of(cfg.election_ttl))


def _workers(spec: str | None) -> Any:
    """The core of ``--workers``: a factory of its view of the edges, from the descriptors the root passed."""
    if not spec:
        return None
    from idled.server.workers.root import parse_core_fds
    from idled.server.workers.edges import Workers

    internal, roster, occupancy, public = parse_core_fds(spec)
    return lambda peers: Workers.from_fds(internal, roster, occupancy, public, peers=peers)


def _run_root(cfg: Config, args: argparse.Namespace) -> int:
    """``--workers N``: this process is the root (``idled.server.workers.root``); the core is its child."""
    from idled.server.workers.root import Root

    soft, hard = systemd.raise_nofile_limit()  # the children inherit it
    log.info("%s", startup_summary(cfg))
    log.info("open-file limit %d (hard %d)", soft, hard)
    try:
        secret = tokens.load_secret(cfg.secret_file) if cfg.secret_file else None
    except tokens.SecretError as exc:
        return fatal(f"configuration: {exc}", EXIT_USAGE)
    root = Root(cfg, _given_flags(args), secret=secret, config_file=args.config or os.environ.get("IDLED_CONFIG"),
                reload_config=lambda: config_module.load(args))
    status = run_until_stopped(root.run)
    if status == EXIT_OK:
        log.info("stopped")
    return status


def startup_summary(cfg: Config, env: Mapping[str, str] | None = None) -> str:
    """The one line `idled serve` logs at start and `idled check-config` prints (the same function, so the two
    cannot disagree): the effective configuration, with the connection limit the open-file limit allows
    (``idled.door.door.expected_limit``; call it after raising the limit, as `serve` does). Inherited sockets
    (systemd's ``LISTEN_FDS``) are named as such: their addresses are logged once adopted."""
    from idled.door.door import expected_limit

    env = os.environ if env is None else env
    inherited = "inherited sockets (LISTEN_FDS)" if "LISTEN_FDS" in env else None
    return summary_line(cfg, limit=expected_limit(cfg, open_file_limit(), env), listen=inherited,
                        data_dir=str(cfg.resolved_data_dir(env)))


def run_until_stopped(main: Callable[[], Awaitable[object]]) -> int:
    """Run ``main`` under trio: EXIT_OK, or the exit status of what ended it (one fatal line on stderr; the
    daemon's processes share it: ``idled serve`` and ``idled edge``)."""
    try:
        trio.run(main)
    except KeyboardInterrupt:
        log.error("interrupted during shutdown")
        return EXIT_INTERRUPTED
    except Exception as exc:
        # Fatal by design, e.g. a failed fsync (never retried): exit non-zero with one line and let the
        # supervisor restart us onto a recovered log. The traceback is for --log-level debug.
        line, status = describe(exc)
        log.debug("fatal error", exc_info=exc)
        return fatal(line, status)
    return EXIT_OK


def _given_flags(args: argparse.Namespace) -> list[str]:
    """The serve flags given on this command line, to start the core with (the file and the environment
    it reads itself, so a SIGHUP re-reads them as in one process)."""
    flags = ["--config", args.config] if args.config else []
    for field in dataclasses.fields(Config):
        value = getattr(args, field.name, None)
        flag = "--" + field.name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags += [flag, str(value)]
    return flags


def fatal(line: str, status: int) -> int:
    """Print the one fatal line and return ``status``."""
    print(f"idled: fatal: {line}", file=sys.stderr, flush=True)
    return status


def _registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()
