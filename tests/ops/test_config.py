"""Config precedence (TOML file < environment < command line) and validation."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from idled.ops import config
from idled.ops.config import Config, ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_match_the_documented_command_line() -> None:
    cfg = config.load(parse(), env={})
    assert (cfg.host, cfg.port, cfg.timeout, cfg.tick, cfg.slots) == ("127.0.0.1", 7878, 30.0, 1.0, 30)
    assert (cfg.max_timeout, cfg.detector, cfg.max_frame, cfg.login_timeout) == (3600.0, "ring", 4096, 5.0)
    assert cfg.max_connections == 100_000 and cfg.secret_file is None and cfg.detector_kind == "ring-lazy"


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "idled.toml"
    toml.write_text('port = 1000\ntimeout = 10\ndetector = "scan"\ninsecure = true\n')
    env = {"IDLED_TIMEOUT": "20", "IDLED_SLOTS": "64"}
    cfg = config.load(parse("--config", str(toml), "--timeout", "40"), env=env)
    assert cfg.port == 1000  # file only
    assert cfg.slots == 64  # environment over default
    assert cfg.timeout == 40.0  # flag over environment over file
    assert cfg.detector == "scan" and cfg.insecure is True


def test_flags_not_given_do_not_override_the_file(tmp_path: Path) -> None:
    toml = tmp_path / "idled.toml"
    toml.write_text("tick = 0.5\n")
    assert config.load(parse("--config", str(toml)), env={}).tick == 0.5


@pytest.mark.parametrize(
    "text, message",
    [
        ("nosuch = 1\n", "unknown setting"),
        ('port = "x"\n', "port must be a number 0..65535, got 'x'"),
        ("timeout = 0.1\ntick = 1\n", "tick <= timeout"),
        ('detector = "wheel"\n', "detector must be one of"),
        ("port = 70000\n", "port must be 0..65535, got 70000"),
        ("metrics_port = -1\n", "metrics_port must be 0..65535, got -1"),
        ("port = [\n", "cannot read"),
        ("gc_thaw_every = 0.5\n", "gc_thaw_every must be 1..604800"),
    ],
)
def test_bad_files_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    toml = tmp_path / "idled.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError, match=message):
        config.load(parse("--config", str(toml)), env={})


def test_bad_environment_is_named() -> None:
    with pytest.raises(ConfigError, match="IDLED_PORT"):
        config.load(parse(), env={"IDLED_PORT": "seven"})


@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
def test_an_out_of_range_port_flag_names_itself_and_its_value(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(flag, "99999")
    name = flag.removeprefix("--").replace("-", "_")
    assert f"argument {flag}: {name} must be 0..65535, got 99999" in capsys.readouterr().err


def test_an_out_of_range_port_variable_names_itself_and_its_value() -> None:
    with pytest.raises(ConfigError, match=r"IDLED_METRICS_PORT: metrics_port must be 0\.\.65535, got 70000"):
        config.load(parse(), env={"IDLED_METRICS_PORT": "70000"})


def test_data_dir_follows_systemd_state_directory() -> None:
    assert str(Config().resolved_data_dir({"STATE_DIRECTORY": "/var/lib/idled:/other"})) == "/var/lib/idled"
    assert str(Config().resolved_data_dir({})) == "idled-data"
    assert str(Config(data_dir="/x").resolved_data_dir({"STATE_DIRECTORY": "/y"})) == "/x"


def test_example_config_in_deploy_states_the_defaults() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "idled.toml"
    assert config.load(parse("--config", str(example)), env={}) == Config().validate()
