"""SIGHUP: re-read the configuration and apply what can change without a restart -- the core, an edge and a
standby alike.

Theory of operation
-------------------
A configuration that does not load changes nothing. Otherwise every setting in ``reloadable`` that changed
takes its new value, every other changed setting keeps its running one (named in the log line: it needs a
restart), and the result goes to the process's ``apply`` -- which hands the door's part on to its doorway
(``idled.server.roles.table.reload_door``). The log level is set here, for every process alike. Logs go to
stderr (journald), so there is no log file to reopen.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from idled.ops import systemd
from idled.ops.config import Config, ConfigError

__all__ = ["reload"]


def reload(
    current: Config,
    source: Callable[[], Config] | None,
    reloadable: Sequence[str],
    apply: Callable[[Config], None],
    log: logging.Logger,
    *,
    env: Mapping[str, str] | None = None,
) -> None:
    """SIGHUP (see the module docstring). ``env``: tell systemd we are reloading (the core; an edge's
    supervisor speaks for it). Logs go to stderr (journald), so there is no log file to reopen."""
    if source is None:
        log.info("SIGHUP: no configuration source to reload")
        return
    if env is not None:
        systemd.notify(systemd.RELOADING, env=env)
    try:
        new = source()
    except ConfigError as exc:
        log.error("SIGHUP: configuration not reloaded: %s", exc)
        return
    finally:
        if env is not None:
            systemd.notify(systemd.READY, env=env)
    applied = {name: getattr(new, name) for name in reloadable if getattr(new, name) != getattr(current, name)}
    ignored = [field.name for field in dataclasses.fields(new)
               if field.name not in reloadable and getattr(new, field.name) != getattr(current, field.name)]
    apply(dataclasses.replace(current, **applied))
    if "log_level" in applied:
        logging.getLogger().setLevel(str(applied["log_level"]).upper())
    log.info(
        "SIGHUP: reloaded %s%s",
        ", ".join(f"{k}={v}" for k, v in applied.items()) or "nothing changed",
        f"; needs a restart: {', '.join(ignored)}" if ignored else "",
    )
