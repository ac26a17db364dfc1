"""Benchmarks and the load generator (`idled bench`, `idled loadtest`); their commands live in `idled.cli`.

The exit statuses both commands share are defined here, next to the machinery whose verdicts they report.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_FAILED", "EXIT_STATUS_EPILOG"]

EXIT_OK: Final = 0  # ran, and every target passed
EXIT_ERROR: Final = 1  # could not run, or the run broke off (target unreachable, server died, ...)
EXIT_USAGE: Final = 2  # bad flags or configuration; nothing was run
EXIT_FAILED: Final = 3  # ran to the end, but a target FAILED

EXIT_STATUS_EPILOG: Final = """exit status:
  0  ran, and every target passed (verdict OK)
  1  runtime failure: could not run or the run broke off (e.g. target not reachable)
  2  usage or configuration error: nothing was run
  3  ran to the end, but a target FAILED (the output says which)
  130 interrupted"""
