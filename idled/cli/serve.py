"""`idled serve`: run the daemon."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import trio

from idled.ops import config as config_module
from idled.ops import systemd
from idled.ops.config import ConfigError
from idled.ops.fatal import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, describe
from idled.ops.gcpolicy import GcPolicy
from idled.ops.logs import config_summary, setup_logging
from idled.ops.metrics import Metrics
from idled.protocol import tokens
from idled.server.app import Server
from idled.server.standbyserver import StandbyServer

log = logging.getLogger("idled.server")

add_arguments = config_module.add_arguments


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_module.load(args)
    except ConfigError as exc:
        return _fatal(f"configuration: {exc}", EXIT_USAGE)
    setup_logging(cfg.log_level)
    inherited = "inherited sockets (LISTEN_FDS)" if "LISTEN_FDS" in os.environ else None
    log.info("%s", config_summary(cfg, listen=inherited))
    soft, hard = systemd.raise_nofile_limit()
    log.info("open-file limit %d (hard %d)", soft, hard)
    server: Server | StandbyServer
    try:
        if cfg.standby_of is not None:  # the role is chosen here, once (docs/ha.md)
            server = StandbyServer(cfg, metrics=Metrics(_registry(), tick=cfg.tick))
        else:
            server = Server(
                cfg, metrics=Metrics(_registry(), tick=cfg.tick), reload_config=lambda: config_module.load(args),
                gc_policy=GcPolicy(thaw_every=cfg.gc_thaw_every),
            )
    except (ConfigError, tokens.SecretError) as exc:
        return _fatal(f"configuration: {exc}", EXIT_USAGE)
    if isinstance(server, Server) and server.workers is not None:
        server.workers.config_file = args.config or os.environ.get("IDLED_CONFIG")
    try:
        trio.run(server.serve)
    except KeyboardInterrupt:
        log.error("interrupted during shutdown")
        return EXIT_INTERRUPTED
    except Exception as exc:
        # Fatal by design, e.g. a failed fsync (never retried): exit non-zero with one line and let the
        # supervisor restart us onto a recovered log. The traceback is for --log-level debug.
        line, status = describe(exc)
        log.debug("fatal error", exc_info=exc)
        return _fatal(line, status)
    log.info("stopped; largest event-loop stall %.1f ms", 1000 * server.largest_stall)
    return EXIT_OK


def _fatal(line: str, status: int) -> int:
    print(f"idled: fatal: {line}", file=sys.stderr, flush=True)
    return status


def _registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()
