"""idled.tools.loadtest.scenario: the timeout a run expects is the one the server it spawns gives."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import trio
import trio.testing

from idled.cli import loadtest
from idled.ops import config as config_module
from idled.protocol import Login, Welcome
from tests import peers


def _scenario(argv: list[str]) -> loadtest.Scenario:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    return loadtest.scenario_from_args(parser.parse_args(
        ["--spawn", "--connections", "10", "--silent-fraction", "0", "--bye-fraction", "0", *argv]))


def _server_config(sc: loadtest.Scenario) -> config_module.Config:
    """The configuration the spawned server would run with: its own flags, parsed as `idled serve` does."""
    parser = argparse.ArgumentParser()
    config_module.add_arguments(parser)
    return config_module.load(parser.parse_args(list(sc.server_args)), env={})


@pytest.mark.parametrize(("argv", "expected"), [
    (["--keepalive", "30"], 45.0),  # the plain rule
    (["--keepalive", "1", "--", "--tick", "2", "--timeout", "30"], 2.0),  # never below a tick (was 1.5)
    (["--keepalive", "100", "--", "--max-timeout", "60"], 60.0),  # never above the cap (was 150)
    (["--keepalive", "100", "--", "--max-timeout=120"], 120.0),
])
async def test_expected_timeout_is_the_servers(
    argv: list[str], expected: float, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sc = _scenario(argv)
    assert sc.expected_timeout == expected
    cfg = _server_config(sc)
    settings = {"tick": cfg.tick, "timeout": cfg.timeout, "max_timeout": cfg.max_timeout}
    async with peers.running(tmp_path, **settings) as h:
        user = await h.connect()
        await user.send(Login("uid", "u1", None, sc.keepalive))
        assert (await user.expect(Welcome)).timeout == sc.expected_timeout


def test_a_target_servers_cap_is_taken_as_the_default() -> None:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    sc = loadtest.scenario_from_args(parser.parse_args(
        ["--target", "127.0.0.1:7878", "--connections", "10", "--keepalive", "3000", "--silent-fraction", "0",
         "--bye-fraction", "0"]))
    assert sc.max_timeout == config_module.Config().max_timeout
    assert sc.expected_timeout == 3600.0  # not 4500: the default cap
