"""`idled serve`: run the daemon."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import trio

from idled.log.eventlog import EventLogError
from idled.ops import config as config_module
from idled.ops import systemd
from idled.ops.config import ConfigError
from idled.ops.gcpolicy import GcPolicy
from idled.ops.logs import setup_logging
from idled.ops.metrics import Metrics
from idled.protocol import tokens
from idled.server.app import Server

log = logging.getLogger("idled.server")

add_arguments = config_module.add_arguments

def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_module.load(args)
    except ConfigError as exc:
        print(f"idled serve: {exc}", file=sys.stderr)
        return 2
    setup_logging(cfg.log_level)
    soft, hard = systemd.raise_nofile_limit()
    log.info("open-file limit %d (hard %d)", soft, hard)
    try:
        server = Server(
            cfg, metrics=Metrics(_registry(), tick=cfg.tick), reload_config=lambda: config_module.load(args), gc_policy=GcPolicy()
        )
    except (ConfigError, tokens.SecretError) as exc:
        print(f"idled serve: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(server.serve)
    except KeyboardInterrupt:
        log.error("interrupted during shutdown")
        return 130
    except (OSError, EventLogError) as exc:
        # EventLogError includes FsyncFailed: fatal by design (never retried), so exit non-zero and let
        # the supervisor restart us onto a recovered log.
        log.error("fatal: %s", exc)
        return 1
    log.info("stopped; largest event-loop stall %.1f ms", 1000 * server.largest_stall)
    return 0


def _registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()
