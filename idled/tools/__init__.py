"""Benchmarks and the load generator (`idled bench`, `idled loadtest`); their commands live in `idled.cli`.

The exit statuses are the daemon's table (`idled.ops.fatal`); both commands use these four of them.
"""

from __future__ import annotations

from typing import Final

from idled.ops.fatal import EXIT_FAILURE as EXIT_ERROR  # could not run, or the run broke off
from idled.ops.fatal import EXIT_OK  # ran, and every target passed
from idled.ops.fatal import EXIT_TARGET_FAILED as EXIT_FAILED  # ran to the end, but a target FAILED
from idled.ops.fatal import EXIT_USAGE  # bad flags or configuration; nothing was run

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_FAILED", "EXIT_STATUS_EPILOG"]

EXIT_STATUS_EPILOG: Final = """exit status:
  0  ran, and every target passed (verdict OK)
  1  runtime failure: could not run or the run broke off (e.g. target not reachable)
  2  usage or configuration error: nothing was run
  3  ran to the end, but a target FAILED (the output says which)
  130 interrupted"""
