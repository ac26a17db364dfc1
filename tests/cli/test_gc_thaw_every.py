"""`gc_thaw_every`: one setting for the core and every edge of `idled serve --workers N`."""

from __future__ import annotations

import pytest

from idled.cli import edge as edge_cli
from idled.cli import main as cli
from idled.ops.config import Config, ConfigError
from idled.server.workers.children import edge_command


def test_serve_passes_it_to_every_edge_it_starts() -> None:
    argv = edge_command(Config(workers=2, gc_thaw_every=30.0).validate(), "worker-0", "unix:/run/core.sock", [3], "4,0")
    edge_args = argv[argv.index("edge"):]  # after `python -m idled.cli.main`
    args = cli.build_parser("edge").parse_args(edge_args)
    assert edge_cli.load(args).gc_thaw_every == 30.0


def test_the_edge_validates_it_like_the_core() -> None:
    args = cli.build_parser("edge").parse_args(["edge", "--core", "unix:/x", "--gc-thaw-every", "0"])
    with pytest.raises(ConfigError, match="gc_thaw_every"):
        edge_cli.load(args)
