"""deploy/: Prometheus config and alerts (checked and unit-tested by promtool), the Grafana dashboard,
the example config, and the sysctl file -- each held against what idled actually exports or reads."""

from __future__ import annotations

import dataclasses
import json
import re
import runpy
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from idled.ops.config import Config
from idled.ops.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "idled-dashboard.json"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found on PATH (Debian: apt-get install prometheus; see .ci/system-deps)"
)

# Names of series idled exports start with these; everything else in an expression is PromQL
# (functions, `up`, label names) or Grafana variables.
_EXPORTED = re.compile(r"\b((?:idled|process|python)_[a-z0-9_]+)\b")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def exported_sample_names() -> set[str]:
    """Every sample name a live idled exposes (each labelled metric touched once so it has samples)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, tick=1.0)
    metrics.register_snapshot(
        lambda: {"connections": {"user": 1}, "sessions_online": 1, "detector_keys": 1, "detector_overflow_keys": 0,
                 "eventlog_degraded": 0, "eventlog_held_events": 0, "wall_clock_ahead": 0.0}
    )
    metrics.presence_events.labels(kind="offline", reason="timeout").inc()
    metrics.frames_rejected.labels(reason="frame-too-large").inc()
    metrics.logins.labels(role="user", result="ok").inc()
    text = metrics.render().decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in dashboard["panels"]:
        for nested in [panel, *panel.get("panels", [])]:
            exprs += [target["expr"] for target in nested.get("targets", [])]
    return exprs


def alert_exprs() -> list[str]:
    # Deliberately no YAML library (not a dependency): pull `expr:` values, including `|` blocks.
    exprs, lines = [], (PROMETHEUS / "alerts.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not match:
            continue
        if match.group(2).strip() != "|":
            exprs.append(match.group(2))
            continue
        indent, block = len(match.group(1)), []
        for following in lines[i + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            block.append(following.strip())
        exprs.append(" ".join(block))
    return exprs


# --- promtool ----------------------------------------------------------------------------------


@needs_promtool
def test_prometheus_config_is_valid() -> None:
    result = promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout  # alerts.yml was found and checked with it


@needs_promtool
def test_alert_rules_are_valid() -> None:
    result = promtool("check", "rules", str(PROMETHEUS / "alerts.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_alert_rules_fire_when_they_should() -> None:
    result = promtool("test", "rules", str(PROMETHEUS / "alerts_test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_alerts_cover_what_operations_needs() -> None:
    names = set(re.findall(r"^\s*- alert:\s*(\S+)", (PROMETHEUS / "alerts.yml").read_text(), re.M))
    assert {
        "IdledDown",
        "IdledOfflineLate",
        "IdledFileDescriptorsNearLimit",
        "IdledEventLogFsyncSlow",
        "IdledEventLoopStall",
    } <= names
    tested = set(re.findall(r"alertname:\s*(\S+)", (PROMETHEUS / "alerts_test.yml").read_text()))
    assert names <= tested, f"alerts without a promtool test: {names - tested}"


@needs_promtool
def test_dashboard_queries_parse_as_promql(tmp_path: Path) -> None:
    # Grafana's variables substituted by plausible values, then each query checked as a recording rule.
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for i, expr in enumerate(dashboard_exprs()):
        concrete = (
            expr.replace("$__rate_interval", "5m").replace('"$job"', '"idled"').replace('"$instance"', '".*"')
        )
        assert "$" not in concrete, concrete
        rules += [f"      - record: dashboard:query_{i}", f"        expr: {json.dumps(concrete)}"]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text("\n".join(rules) + "\n")
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


# --- metric names --------------------------------------------------------------------------------


def test_dashboard_is_valid_json_with_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "idled" and dashboard["uid"]
    assert len(dashboard_exprs()) >= 20


def test_dashboard_json_is_the_generators_output() -> None:
    generator = runpy.run_path(str(DASHBOARD.with_name("generate_dashboard.py")), run_name="idled_dashboard")
    assert DASHBOARD.read_text() == generator["render"](), "run: python deploy/grafana/generate_dashboard.py"


def test_dashboard_references_only_exported_metrics() -> None:
    exported = exported_sample_names()
    referenced = {name for expr in dashboard_exprs() for name in _EXPORTED.findall(expr)}
    assert referenced, "no metric names found in the dashboard"
    assert referenced - exported == set()


def test_dashboard_shows_every_idled_metric() -> None:
    exported = {name for name in exported_sample_names() if name.startswith("idled_") and not name.endswith("_created")}
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported}
    shown = {re.sub(r"_(bucket|count|sum)$", "", name) for expr in dashboard_exprs() for name in _EXPORTED.findall(expr)}
    assert families - shown == set(), "idled metrics missing from the dashboard"


def test_alerts_reference_only_exported_metrics() -> None:
    exported = exported_sample_names()
    referenced = {name for expr in alert_exprs() for name in _EXPORTED.findall(expr)}
    assert {"idled_offline_lateness_seconds_bucket", "process_open_fds", "process_max_fds"} <= referenced
    assert referenced - exported == set()


def test_stall_alert_bucket_bound_exists() -> None:
    # The stall alert counts lag samples above le="1.0"; that bound must be one of the histogram's.
    exported = exported_sample_names()
    assert "idled_event_loop_lag_seconds_bucket" in exported
    registry = CollectorRegistry()
    Metrics(registry, tick=1.0, process_collectors=False)
    assert registry.get_sample_value("idled_event_loop_lag_seconds_bucket", {"le": "1.0"}) == 0


# --- idled.toml ----------------------------------------------------------------------------------

SETTINGS = {field.name for field in dataclasses.fields(Config)}  # every setting the daemon reads


def test_example_config_is_flat_toml_with_every_setting_documented() -> None:
    text = (DEPLOY / "idled.toml").read_text()
    config = tomllib.loads(text)
    assert not any(isinstance(v, dict) for v in config.values()), "settings are flat top-level keys"
    commented = set(re.findall(r"^#(\w+) = ", text, re.M))  # settings whose default is "unset"
    assert set(config) | commented == SETTINGS
    assert not set(config) & commented
    lines = text.splitlines()
    for key in SETTINGS:
        index = next(i for i, line in enumerate(lines) if re.match(rf"^#?{key} = ", line))
        while re.match(r"^#?\w+ = ", lines[index - 1]):  # a group of settings shares one comment
            index -= 1
        assert lines[index - 1].startswith("# "), f"{key} has no comment above it"
    assert config["host"] == "127.0.0.1" and config["port"] == 7878
    assert config["metrics_host"] == "127.0.0.1"


# The timeout rule as the example config and operations.md state it; the test below holds the core to it.
TIMEOUT_RULE = "min(max(1.5 x k, tick), max_timeout)"


def test_the_stated_timeout_rule_is_the_one_the_core_applies() -> None:
    from idled.core.factory import make_detector
    from idled.core.presence import PresenceTable, ticks_for

    assert TIMEOUT_RULE in (DEPLOY / "idled.toml").read_text()
    assert TIMEOUT_RULE.replace(" x ", " ") in (ROOT / "docs" / "operations.md").read_text()
    tick, timeout, max_timeout = 1.0, 30.0, 3600.0
    table = PresenceTable(make_detector("ring-lazy", timeout=ticks_for(timeout, tick), slots=30), tick=tick,
                          timeout=timeout, max_timeout=max_timeout, detector_name="ring-lazy")
    for k in (0.1, 0.5, 2.0, 20.0, 5000.0):
        assert table.timeout_for(k) == min(max(1.5 * k, tick), max_timeout), k
    assert table.timeout_for(0.1) == tick  # the floor: never under one tick
    assert table.timeout_for(None) == timeout  # no keepalive asked: the configured timeout


def test_scrape_target_matches_the_example_config() -> None:
    config = tomllib.loads((DEPLOY / "idled.toml").read_text())
    target = f'"{config["metrics_host"]}:{config["metrics_port"]}"'
    assert target in (PROMETHEUS / "prometheus.yml").read_text()


# --- sysctl --------------------------------------------------------------------------------------


def sysctl_settings() -> dict[str, str]:
    settings = {}
    for line in (DEPLOY / "sysctl.d" / "90-idled.conf").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith(("#", ";")):
            key, _, val = line.partition("=")
            settings[key.strip()] = " ".join(val.split())
    return settings


def test_sysctl_keys_exist_on_this_kernel() -> None:
    settings = sysctl_settings()
    assert {"net.core.somaxconn", "fs.file-max", "fs.nr_open", "net.ipv4.ip_local_port_range"} <= set(settings)
    for key, val in settings.items():
        assert all(part.isdigit() for part in val.split()), (key, val)
        path = Path("/proc/sys") / key.replace(".", "/")
        if not Path("/proc/sys").is_dir():
            pytest.skip("no /proc/sys")
        assert path.exists(), f"{key}: no {path} on this kernel"


@pytest.mark.parametrize(
    "key", ["fs.file-max", "fs.nr_open", "net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog", "net.core.netdev_max_backlog"]
)
def test_sysctl_ceilings_never_lower_this_host(key: str) -> None:
    path = Path("/proc/sys") / key.replace(".", "/")
    try:
        current = int(path.read_text())
    except OSError as exc:
        pytest.skip(f"cannot read {path}: {exc}")
    assert int(sysctl_settings()[key]) >= current
