"""`idled edge`: run an edge process in front of a core (see idled.server.edge and docs/edge.md)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
from typing import TYPE_CHECKING


from idled.cli.serve import fatal, run_until_stopped
from idled.door.outbound import LinkPolicy
from idled.ops import config as config_module
from idled.ops import systemd
from idled.ops.config import Config, ConfigError
from idled.ops.fatal import EXIT_OK, EXIT_USAGE, Fatal
from idled.ops.gcpolicy import GcPolicy
from idled.ops.logs import setup_logging
from idled.protocol import tokens
from idled.protocol.address import AddressError, HostPort
from idled.server.edge import Edge
from idled.server.edge.link import parse_cores
from idled.server.workers.occupancy import Occupancy, parse_occupancy

if TYPE_CHECKING:
    from idled.ops.metrics import Metrics

log = logging.getLogger("idled.server.edge")

# The daemon's settings an edge uses (the rest -- detector, log, timeouts -- are the core's).
EDGE_SETTINGS = ("host", "port", "secret_file", "insecure", "max_frame", "login_timeout", "max_connections",
                 "max_pending_per_address",
                 "metrics_host", "metrics_port", "log_level", "gc_thaw_every",
                 "tls_cert", "tls_key", "tls_client_ca", "proxy_protocol", "proxy_allow", "ws_origins",
                 "link_tls", "link_ca", "link_server_name", "link_cert", "link_key")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--core", required=True, metavar="ADDRESS[,ADDRESS...]",
                        help="the core to relay to: HOST:PORT, or unix:PATH (a trusted internal socket: no token); "
                             "several, comma-separated: the edge finds the leader among them (docs/edge.md)")
    parser.add_argument("--listen-fd", type=int, action="append", default=[], metavar="FD",
                        help="adopt this inherited listening socket instead of binding --host/--port (repeatable)")
    parser.add_argument("--name", help="gateway name at the core (default edge-<hostname>-<pid>)")
    parser.add_argument("--occupancy", metavar="FD,INDEX",
                        help="(set by `idled serve --workers`) the shared connection counters of the daemon's edges "
                             "and this edge's slot: max-connections is then the whole daemon's")
    parser.add_argument("--config", metavar="FILE", help="TOML file with flat keys named like the flags")
    fields = {field.name: field for field in dataclasses.fields(Config)}
    for name in EDGE_SETTINGS:
        flag = "--" + name.replace("_", "-")
        kind = config_module._field_type(fields[name])
        help_text = config_module.flag_help(fields[name])
        if name == "metrics_port":
            help_text = "port of the Prometheus endpoint; 0 (the default) disables it"
        if kind is bool:
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=None, help=help_text)


def load(args: argparse.Namespace) -> Config:
    cfg = config_module.load(args)
    if args.metrics_port is None:  # unlike the daemon's, an edge's endpoint is off unless asked for
        cfg = dataclasses.replace(cfg, metrics_port=0)
    return cfg


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load(args)
        cores = parse_cores(args.core)
        occupancy = Occupancy(*parse_occupancy(args.occupancy)) if args.occupancy else None
    except AddressError as exc:
        return fatal(f"configuration: --core: {exc}", EXIT_USAGE)
    except (ConfigError, ValueError, OSError) as exc:
        return fatal(f"configuration: {exc}", EXIT_USAGE)
    setup_logging(cfg.log_level)
    soft, hard = systemd.raise_nofile_limit()
    log.info("open-file limit %d (hard %d)", soft, hard)
    name = args.name or f"edge-{socket.gethostname()}-{os.getpid()}"
    try:
        # The link to a TCP core logs in with a token from the same secret; a unix-socket core trusts its socket.
        tcp = any(isinstance(core, HostPort) for core in cores)
        link_secret = tokens.load_secret(cfg.secret_file) if cfg.secret_file and tcp else None
        edge = Edge(cfg, core=args.core, name=name, listen_fds=args.listen_fd,
                    metrics=_metrics() if cfg.metrics_port else None,
                    reload_config=lambda: load(args), link_secret=link_secret, gc_policy=GcPolicy(thaw_every=cfg.gc_thaw_every),
                    occupancy=occupancy, links=LinkPolicy.of(cfg))  # TLS to a TCP core (idled.door.outbound)
    except (ConfigError, tokens.SecretError, ValueError, OSError) as exc:
        return fatal(f"configuration: {exc}", EXIT_USAGE)
    except Fatal as exc:  # a TLS file that does not load
        return fatal(str(exc), exc.status)
    status = run_until_stopped(edge.serve)
    if status == EXIT_OK:
        log.info("stopped")
    return status


def _metrics() -> Metrics:
    """The edge's own metrics, imported only by an edge that exports them (``idled.ops.nullmetrics``)."""
    from prometheus_client import CollectorRegistry

    from idled.ops.metrics import Metrics

    return Metrics(CollectorRegistry(), tick=1.0)
