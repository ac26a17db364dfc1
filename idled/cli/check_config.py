"""`idled check-config`: validate the daemon's configuration and print it, without starting (like `nginx -t`).

Takes exactly `idled serve`'s flags and reads the same sources (TOML file < ``IDLED_*`` environment <
flags), then checks what `idled serve` would refuse before listening: every value's range, the secret file,
the door's rule on every listener (client port, metrics endpoint, HTTP API: none beyond loopback with auth
off; ``idled.door``), the TLS files (the client port's and the links' to other cores), an elected core that
serves TLS without ``link_tls`` (``Config.validate``), and a data directory `serve` could not create or write (tried for real:
a probe file created, locked, written, synced and removed, as /readyz does).
Prints the one-line summary `idled serve` logs at start (``idled.cli.serve.startup_summary``, the same
function: the connection limit in force, capped to the descriptor budget as `serve` will cap it), then every
effective setting as TOML (usable as a config file; an unset data directory says which one `serve` would
use), and exits 0; or one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from idled.ops import config as config_module
from idled.ops import systemd
from idled.ops.config import Config, ConfigError
from idled.ops.fatal import EXIT_OK, EXIT_USAGE, Fatal
from idled.ops.health import probe_directory
from idled.protocol import tokens

__all__ = ["add_arguments", "run", "as_toml"]

PROG = "idled check-config"

add_arguments = config_module.add_arguments


def as_toml(cfg: Config, env: Mapping[str, str] | None = None) -> str:
    """Every setting as a flat TOML table; an unset optional setting is a comment -- saying what `serve` would
    use instead where it resolves one at start (the data directory: the summary names it)."""
    env = os.environ if env is None else env
    lines = []
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if value is None and field.name == "data_dir":
            lines.append(f"# data_dir is unset: serve would use {json.dumps(str(cfg.resolved_data_dir(env)))} "
                         "($STATE_DIRECTORY, else ./idled-data)")
        elif value is None:
            lines.append(f"# {field.name} is unset")
        elif isinstance(value, bool):
            lines.append(f"{field.name} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{field.name} = {value!r}")
        else:
            lines.append(f"{field.name} = {json.dumps(str(value))}")
    return "\n".join(lines)


def _check_data_dir(path: Path) -> None:
    """What `idled serve` does to the directory, for real: create it if missing, then create, lock, write,
    sync and remove a probe file in it (as /readyz does). ``os.access`` would answer for permission bits only:
    as root it says yes to /proc, a read-only mount or an immutable directory, where `serve` then exits 5.
    Directories made for the probe are removed again; the daemon's own lock file is not touched (a running
    daemon holds it while its next configuration is checked)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"data_dir {path} exists and is not a directory")
    missing = [p for p in (path.absolute(), *path.absolute().parents) if not p.exists()]
    try:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"data_dir {path} cannot be created: {exc.strerror or exc}") from None
        problem = probe_directory(path)
        if problem is not None:
            raise ConfigError(f"data_dir {path} is not writable: {problem}")
    finally:
        for made in missing:  # deepest first
            try:
                made.rmdir()
            except OSError:
                pass  # never made, or not ours to remove any more


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_module.load(args)
        # The daemon's own checks, the very ones `serve` runs first: the secret file, then the door's rule on
        # every endpoint (client port, metrics, API: none beyond loopback with auth off), TLS files.
        from idled.door.door import Door, client_gate
        from idled.door.outbound import LinkPolicy
        from idled.server.roles.doorway import auth_secret

        secret = auth_secret(cfg)
        Door.of(cfg, secret=secret is not None, env=dict(os.environ)).check()
        client_gate(cfg)  # the TLS certificate, key and client CA load
        LinkPolicy.of(cfg)  # ... and the links' CA and certificate (idled.door.outbound)
        _check_data_dir(cfg.resolved_data_dir())
    except (ConfigError, tokens.SecretError) as exc:
        print(f"{PROG}: configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Fatal as exc:
        print(f"{PROG}: configuration: {exc}", file=sys.stderr)
        return exc.status
    from idled.cli.serve import startup_summary

    systemd.raise_nofile_limit()  # as serve does first: the limit the summary's connection limit is judged by
    print(f"# {startup_summary(cfg)}")
    print(as_toml(cfg))
    print(f"{PROG}: configuration OK", file=sys.stderr)
    return EXIT_OK
