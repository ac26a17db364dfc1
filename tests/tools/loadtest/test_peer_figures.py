"""`idled loadtest --peer mqtt` without a process: its windows, its figures and ratios (plain numbers), and the
command line that builds both halves of the comparison (the run itself: test_peer.py, slow)."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from idled.cli import loadtest
from idled.tools.loadtest import peer
from idled.tools.loadtest.rates import phase
from idled.tools.loadtest.target import Sample


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    return parser.parse_args(argv)


def _both(argv: list[str]) -> list[loadtest.Scenario]:
    args = _parse(["--peer", "mqtt", *argv])
    return loadtest._scenarios(args, loadtest.scenario_from_args(args))


# ------------------------------------------------------------------------------------------- windows


def test_the_windows_by_hand() -> None:
    # 19,000 logins at 1,000/s; keepalive 20 s: moments over 5 s, timeout 30 s, grace 10 s
    assert peer.silence_span(20) == 5.0 and peer.silence_span(2) == 1.0
    assert peer.steady_from(19.0, 5.0, 30.0, 10.0) == 64.0
    assert peer.min_duration(64.0, 1.0) == 66.5  # a sampler interval; and the silent window's 0.5 s + a tick


def test_both_halves_share_the_plan_and_the_steady_window() -> None:
    idled, broker = _both(["--connections", "19000", "--keepalive", "20"])
    assert (idled.wire, broker.wire) == ("idled", "mqtt")
    assert idled.steady_from == broker.steady_from == 64.0
    assert idled.duration == broker.duration == 124.0  # the steady window's start + 60 s by default
    assert idled.window() == broker.window() == (19.0, 24.0)  # the same silent moments (same seed)
    assert (idled.silent_fraction, idled.bye_fraction) == (0.01, 0.0)  # the 1 %
    assert idled.sample_interval == broker.sample_interval == 2.0
    assert idled.metrics_interval == math.inf  # no /metrics scrape in the steady window (the broker has none)
    assert "--workers" in idled.server_args and idled.server_args[-1] == "0"
    # idled is judged by its own bound (2 ticks), the broker by timeout + grace
    assert idled.bound_ticks * idled.tick == 2.0 and broker.bound_ticks * broker.tick == 10.0
    assert broker.expected_timeout == 30.0 and broker.server_args == ()


def test_the_servers_own_workers_flag_is_kept() -> None:
    idled, _ = _both(["--connections", "100", "--keepalive", "4", "--", "--workers", "2"])
    assert list(idled.server_args).count("--workers") == 1 and idled.server_args[-1] == "2"


@pytest.mark.parametrize(("argv", "says"), [
    (["--keepalive", "2.5"], "whole seconds"),
    (["--connections", "19000", "--keepalive", "20", "--duration", "60"], "at least 67 s"),
    (["--devices", "2", "--connections", "10"], "plain user connections"),
    (["--gateways", "2", "--sessions", "10"], "plain user connections"),
    (["--websocket"], "plain user connections"),
    (["--compare", "ring,scan"], "--compare"),
    (["--ping-every", "1"], "--ping-every"),
    (["--target", "127.0.0.1:7878"], "not both"),
])
def test_what_one_of_the_peers_could_not_do_is_refused(argv: list[str], says: str) -> None:
    with pytest.raises(loadtest.UsageError, match=says):
        _both(["--connections", "100", *argv] if "--connections" not in argv else argv)


def test_without_peer_the_fractions_keep_their_defaults() -> None:
    sc = loadtest.scenario_from_args(_parse(["--spawn", "--connections", "100", "--duration", "60"]))
    assert (sc.silent_fraction, sc.bye_fraction, sc.wire, sc.steady_from) == (0.05, 0.01, "idled", None)


# ------------------------------------------------------------------------------------------- figures


def _result(cpu_seconds: float, per_s: float, rss_base: int, rss_peak: int, peak: int, **extra: Any) -> dict[str, Any]:
    """A result document as `build_result` makes it, from a 100 s steady window (the sampler's two samples)."""
    steady = phase(Sample(1000.0, 10.0, 0, 0.0), Sample(1100.0, 10.0 + cpu_seconds, 0, 0.0), per_s=per_s)
    return {
        "ok": True, "aborted": None, "steady": steady,
        "verdict": {"false_offlines": 0, "missed_offlines": 0, "early_offlines": 0, "generator_late": 0},
        "lateness": {"generator": {"count": 190, "p50": 0.5, "p99": 0.98, "max": 1.01}},
        "server": {"rss_base_bytes": rss_base, "rss_total_per_session_bytes": rss_peak / peak,
                   "rss_per_session_bytes": (rss_peak - rss_base) / peak},
        "connections": {"peak_sessions": peak},
        "generator": {"steady": {"cpu_percent": 3.1}, "lag": {"p99": 0.0005, "max": 0.02}}, **extra,
    }


def test_a_row_by_hand() -> None:
    # 2.2 CPU-seconds over 100 s while 950 keepalives/s were sent: 2.2 % of a core, 23.2 us per keepalive
    row = peer.peer_row(_result(2.2, 950.0, 40 * 2**20, 40 * 2**20 + 19_000 * 1024, 19_000), "idled")
    assert row["steady_cpu_percent"] == pytest.approx(2.2)
    assert row["cpu_us_per_keepalive"] == pytest.approx(2.2 / 95_000 * 1e6)
    assert row["rss_over_idle_bytes"] == pytest.approx(1024.0)
    assert row["rss_whole_bytes"] == pytest.approx((40 * 2**20 + 19_000 * 1024) / 19_000)
    assert (row["false"], row["missed"], row["early"], row["lateness_p99"]) == (0, 0, 0, 0.98)
    assert row["generator_cpu_percent"] == 3.1


def test_ratios_are_idled_over_the_broker() -> None:
    idled = peer.peer_row(_result(2.2, 950.0, 40 << 20, (40 << 20) + 19_000 * 900, 19_000), "idled serve")
    broker = peer.peer_row(_result(1.3, 950.0, 8 << 20, (8 << 20) + 19_000 * 720, 19_000), "mosquitto 2.0.11")
    ratios = peer.peer_ratios(idled, broker)
    assert ratios["steady_cpu_percent"] == pytest.approx(2.2 / 1.3)
    assert ratios["cpu_us_per_keepalive"] == pytest.approx(2.2 / 1.3)  # the same keepalive rate
    assert ratios["rss_over_idle_bytes"] == pytest.approx(900 / 720)
    assert ratios["lateness_p99"] == pytest.approx(1.0)
    text = peer.peer_text([idled, broker], ratios, "title")
    assert "idled serve" in text and "mosquitto 2.0.11" in text and "idled / mosquitto" in text
    assert "1.69x" in text and "1.25x" in text


def test_a_run_that_measured_nothing_gives_dashes_not_a_crash() -> None:
    empty = peer.peer_row({"ok": False, "aborted": "mosquitto not found"}, "mosquitto ?")
    idled = peer.peer_row(_result(2.2, 950.0, 1, 2, 1), "idled")
    ratios = peer.peer_ratios(idled, empty)
    assert set(ratios.values()) == {None}
    assert "ABORTED" in peer.peer_text([idled, empty], ratios, "t")
    zero = peer.peer_row(_result(0.0, 950.0, 1, 2, 1), "broker")  # a broker too quiet for the sampler
    assert peer.peer_ratios(idled, zero)["steady_cpu_percent"] is None
