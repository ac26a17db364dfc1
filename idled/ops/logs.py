"""Logging setup: lines to stderr; under journald, sd-daemon priority prefixes and no timestamps."""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["setup_logging"]


def setup_logging(level: str, env: dict[str, str] | None = None) -> None:
    """Log lines to stderr; under journald (JOURNAL_STREAM set) with sd-daemon priority prefixes, no timestamps."""
    env = dict(os.environ) if env is None else env
    if env.get("JOURNAL_STREAM"):
        formatter: logging.Formatter = _JournalFormatter("%(name)s: %(message)s")
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class _JournalFormatter(logging.Formatter):
    _PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record: logging.LogRecord) -> str:
        return f"<{self._PRIORITY.get(record.levelno, 6)}>{super().format(record)}"
