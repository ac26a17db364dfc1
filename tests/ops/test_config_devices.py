"""The devices and grace settings: max_devices, offline_grace (TOML < environment < flags, validated)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from idled.ops import config
from idled.ops.config import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_are_todays_behaviour() -> None:
    cfg = config.load(parse(), env={})
    assert (cfg.max_devices, cfg.offline_grace) == (8, 0.0)


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "idled.toml"
    toml.write_text("max_devices = 3\noffline_grace = 5\n")
    assert config.load(parse("--config", str(toml)), env={}).offline_grace == 5.0
    cfg = config.load(parse("--config", str(toml), "--offline-grace", "7.5"), env={"IDLED_MAX_DEVICES": "4",
                                                                                    "IDLED_OFFLINE_GRACE": "6"})
    assert (cfg.max_devices, cfg.offline_grace) == (4, 7.5)


@pytest.mark.parametrize("text, message", [
    ("max_devices = 0\n", "max_devices must be 1..1024, got 0"),
    ("max_devices = 1025\n", "max_devices must be 1..1024, got 1025"),
    ("max_devices = 2.5\n", "max_devices must be int"),
    ("offline_grace = -1\n", "offline_grace must be 0..3600 seconds, got -1"),
    ("offline_grace = 3601\n", "offline_grace must be 0..3600 seconds, got 3601"),
    ("offline_grace = nan\n", "offline_grace must be 0..3600 seconds, got nan"),
])
def test_out_of_range_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    toml = tmp_path / "idled.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError, match=message):
        config.load(parse("--config", str(toml)), env={})


def test_serve_refuses_a_bad_value_with_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "idled.cli.main", "serve", "--offline-grace", "-1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["idled: fatal: configuration: offline_grace must be 0..3600 seconds, got -1"]
