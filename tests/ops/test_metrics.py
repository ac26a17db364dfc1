"""idled.ops.metrics: collectors on a fresh registry, and the real HTTP endpoint over loopback."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from idled import __version__
from idled.door.gate import Gate, Limits
from idled.ops.http import HEAD_TIMEOUT
from idled.ops.metrics import CONTENT_TYPE, SNAPSHOT_KEYS, Metrics, lateness_buckets
from tests.peers import start_metrics


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(registry, tick=1.0)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a text exposition, keyed by (sample name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


# --- counters, gauges, histograms --------------------------------------------------------------


def test_counters_move(registry: CollectorRegistry, metrics: Metrics) -> None:
    metrics.presence_events.labels(kind="offline", reason="timeout").inc()
    metrics.presence_events.labels(kind="offline", reason="timeout").inc()
    metrics.presence_events.labels(kind="online", reason="login").inc()
    metrics.frames_rejected.labels(reason="frame-too-large").inc()
    metrics.logins.labels(role="user", result="ok").inc(3)
    metrics.detector_ticks.inc(7)
    metrics.eventlog_records.inc(10)
    metrics.eventlog_bytes.inc(1234)
    assert value(registry, "idled_presence_events_total", kind="offline", reason="timeout") == 2
    assert value(registry, "idled_presence_events_total", kind="online", reason="login") == 1
    assert value(registry, "idled_frames_rejected_total", reason="frame-too-large") == 1
    assert value(registry, "idled_logins_total", role="user", result="ok") == 3
    assert value(registry, "idled_detector_ticks_total") == 7
    assert value(registry, "idled_eventlog_records_total") == 10
    assert value(registry, "idled_eventlog_bytes_total") == 1234


def test_lateness_buckets_are_fractions_of_a_tick() -> None:
    assert lateness_buckets(1.0) == (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0, 3.0, 5.0, 10.0)
    tenth = lateness_buckets(0.1)
    assert 0.1 in tenth  # exactly one tick is a bound: the "at most one tick late" line
    assert tenth[:4] == (0.001, 0.005, 0.01, 0.025)  # rounded, no 0.030000000000000002
    assert max(tenth) == 1.0
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError):
            lateness_buckets(bad)


def test_offline_lateness_histogram_buckets(registry: CollectorRegistry) -> None:
    metrics = Metrics(registry, tick=0.5, process_collectors=False)
    for lateness in (0.0, 0.1, 0.25, 0.5, 0.6):  # the last one is more than a tick late
        metrics.offline_lateness.observe(lateness)

    def bucket(le: str) -> float | None:
        return value(registry, "idled_offline_lateness_seconds_bucket", le=le)

    assert bucket("0.005") == 1  # the on-time one
    assert bucket("0.125") == 2
    assert bucket("0.25") == 3
    assert bucket("0.5") == 4  # within one tick
    assert bucket("0.55") == 4
    assert bucket("0.75") == 5
    assert bucket("+Inf") == 5
    assert value(registry, "idled_offline_lateness_seconds_count") == 5
    assert value(registry, "idled_offline_lateness_seconds_sum") == pytest.approx(1.45)


def test_duration_histograms(registry: CollectorRegistry, metrics: Metrics) -> None:
    metrics.tick_duration.observe(0.0003)
    metrics.eventlog_fsync_duration.observe(0.002)
    metrics.eventlog_fsync_duration.observe(0.3)
    assert value(registry, "idled_tick_duration_seconds_bucket", le="0.00025") == 0
    assert value(registry, "idled_tick_duration_seconds_bucket", le="0.0005") == 1
    assert value(registry, "idled_eventlog_fsync_duration_seconds_bucket", le="0.0025") == 1
    assert value(registry, "idled_eventlog_fsync_duration_seconds_bucket", le="0.25") == 1
    assert value(registry, "idled_eventlog_fsync_duration_seconds_bucket", le="0.5") == 2


def test_loop_lag_keeps_the_largest_stall(registry: CollectorRegistry, metrics: Metrics) -> None:
    assert value(registry, "idled_event_loop_stall_max_seconds") == 0
    for lag in (0.002, 0.3, 0.01):
        metrics.observe_loop_lag(lag)
    assert value(registry, "idled_event_loop_stall_max_seconds") == 0.3
    assert value(registry, "idled_event_loop_lag_seconds_count") == 3
    assert value(registry, "idled_event_loop_lag_seconds_bucket", le="0.25") == 2


def test_info_and_tick(registry: CollectorRegistry) -> None:
    Metrics(registry, tick=0.25, version="9.9.9", process_collectors=False)
    info = [s for f in registry.collect() if f.name == "idled_info" for s in f.samples]
    assert len(info) == 1 and info[0].value == 1 and info[0].labels["version"] == "9.9.9"
    assert value(registry, "idled_tick_seconds") == 0.25


def test_default_version_is_the_package_version(registry: CollectorRegistry, metrics: Metrics) -> None:
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert families["idled_info"].samples[0].labels["version"] == __version__


def test_process_collector_is_on_the_injected_registry(registry: CollectorRegistry, metrics: Metrics) -> None:
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "process_max_fds"):
        assert (value(registry, name) or 0) > 0, name
    assert value(registry, "python_gc_collections_total", generation="0") is not None


def test_registries_are_independent() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    m1, m2 = Metrics(first, tick=1.0), Metrics(second, tick=1.0)
    m1.detector_ticks.inc()
    assert value(first, "idled_detector_ticks_total") == 1
    assert value(second, "idled_detector_ticks_total") == 0
    with pytest.raises(ValueError, match="Duplicated"):
        Metrics(first, tick=1.0)  # one Metrics per registry
    del m2


# --- scrape-time snapshot ----------------------------------------------------------------------


def test_snapshot_gauges_are_read_at_scrape_time(registry: CollectorRegistry, metrics: Metrics) -> None:
    state: dict[str, Any] = {
        "connections": {"user": 10, "pending": 2},
        "sessions_online": 9,
        "users_online": 7,
        "detector_keys": 9,
        "detector_overflow_keys": 1,
        "observer_queued_bytes": 512,
        "eventlog_damaged_bytes": 536,
        "eventlog_damaged_records": 1,
        "eventlog_rolls_deferred": 2,
        "eventlog_degraded": 1,
        "eventlog_held_events": 42,
        "sessions_held": 3,
        "gateway_watermark_lag": {"worker-0": 0.25, "worker-1": 12.5},
        "wall_clock_ahead": 3599.5,
    }
    assert set(state) == set(SNAPSHOT_KEYS) | {"connections", "gateway_watermark_lag"}
    calls = []

    def snapshot() -> Mapping[str, Any]:
        calls.append(1)
        return state

    metrics.register_snapshot(snapshot)
    assert calls == []  # registration reads nothing
    assert value(registry, "idled_connections", role="user") == 10
    assert value(registry, "idled_connections", role="gateway") == 0  # every role is exported
    assert value(registry, "idled_connections", role="observer") == 0
    assert value(registry, "idled_connections", role="pending") == 2
    assert value(registry, "idled_sessions_online") == 9
    assert value(registry, "idled_users_online") == 7
    assert value(registry, "idled_sessions_held") == 3
    assert value(registry, "idled_gateway_watermark_lag_seconds", gateway="worker-1") == 12.5
    assert value(registry, "idled_detector_keys") == 9
    assert value(registry, "idled_detector_overflow_keys") == 1
    assert value(registry, "idled_observer_queued_bytes") == 512
    assert value(registry, "idled_eventlog_damaged_bytes") == 536
    assert value(registry, "idled_eventlog_damaged_records") == 1
    assert value(registry, "idled_eventlog_rolls_deferred") == 2
    assert value(registry, "idled_wall_clock_ahead_seconds") == 3599.5
    assert value(registry, "idled_eventlog_degraded") == 1
    assert value(registry, "idled_eventlog_held_events") == 42

    state["connections"] = {"user": 11, "gateway": 1}
    state["sessions_online"] = 10
    got = samples(metrics.render().decode())
    assert got[("idled_connections", frozenset({("role", "user")}))] == 11
    assert got[("idled_connections", frozenset({("role", "gateway")}))] == 1
    assert got[("idled_connections", frozenset({("role", "pending")}))] == 0
    assert got[("idled_sessions_online", frozenset())] == 10


def test_snapshot_missing_keys_are_omitted(registry: CollectorRegistry, metrics: Metrics) -> None:
    assert value(registry, "idled_sessions_online") is None  # no snapshot registered: nothing invented
    metrics.register_snapshot(lambda: {"sessions_online": 3})
    assert value(registry, "idled_sessions_online") == 3
    assert value(registry, "idled_connections", role="user") is None
    assert value(registry, "idled_detector_keys") is None


def test_broken_snapshot_costs_only_its_own_metrics(
    registry: CollectorRegistry, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Mapping[str, Any]:
        raise KeyError("table is gone")

    metrics.register_snapshot(broken)
    metrics.detector_ticks.inc()
    with caplog.at_level(logging.ERROR, logger="idled.ops.metrics"):
        text = metrics.render().decode()
    got = samples(text)
    assert got[("idled_detector_ticks_total", frozenset())] == 1
    assert not any(name == "idled_sessions_online" for name, _ in got)
    assert "metrics snapshot failed" in caplog.text


# --- HTTP endpoint -----------------------------------------------------------------------------


class _ThreadProbe(Collector):
    """Records which thread renders the scrape."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterable[Metric]:
        self.threads.append(threading.get_ident())
        return []


async def _exchange(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        response = bytearray()
        while chunk := await stream.receive_some(65536):
            response += chunk
    return bytes(response)


def _parse(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("ascii").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, val = line.partition(":")
        headers[name.strip().lower()] = val.strip()
    return int(status_line.split(" ")[1]), headers, body


async def _get(port: int, target: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n".encode()
    with trio.fail_after(30):  # a safety net against hangs, not a timing assertion
        return _parse(await _exchange(port, request))


async def test_scrape_real_endpoint(registry: CollectorRegistry, metrics: Metrics) -> None:
    loop_thread = threading.get_ident()
    snapshot_threads: list[int] = []
    state: dict[str, Any] = {
        "connections": {"user": 5, "gateway": 1, "observer": 2, "pending": 3},
        "sessions_online": 4,
        "detector_keys": 4,
        "detector_overflow_keys": 1,
    }

    def snapshot() -> Mapping[str, Any]:
        snapshot_threads.append(threading.get_ident())
        return dict(state)

    metrics.register_snapshot(snapshot)  # inside trio: scrapes will run it on this loop
    probe = _ThreadProbe()
    registry.register(probe)
    metrics.logins.labels(role="user", result="ok").inc(3)
    metrics.offline_lateness.observe(0.4)

    async with trio.open_nursery() as nursery:
        port = await start_metrics(nursery, registry)
        assert port > 0
        status, headers, body = await _get(port, "/metrics")
        assert status == 200
        assert headers["content-type"] == CONTENT_TYPE
        assert int(headers["content-length"]) == len(body)
        got = samples(body.decode())
        assert got[("idled_connections", frozenset({("role", "user")}))] == 5
        assert got[("idled_connections", frozenset({("role", "pending")}))] == 3
        assert got[("idled_sessions_online", frozenset())] == 4
        assert got[("idled_detector_overflow_keys", frozenset())] == 1
        assert got[("idled_logins_total", frozenset({("role", "user"), ("result", "ok")}))] == 3
        assert got[("idled_offline_lateness_seconds_bucket", frozenset({("le", "0.5")}))] == 1
        assert got[("idled_offline_lateness_seconds_bucket", frozenset({("le", "0.25")}))] == 0
        assert got[("process_open_fds", frozenset())] > 0

        state["sessions_online"] = 5
        metrics.logins.labels(role="user", result="ok").inc()
        status, _, body = await _get(port, "/metrics?name[]=ignored")
        assert status == 200
        got = samples(body.decode())
        assert got[("idled_sessions_online", frozenset())] == 5
        assert got[("idled_logins_total", frozenset({("role", "user"), ("result", "ok")}))] == 4
        nursery.cancel_scope.cancel()

    # Rendering (with its /proc/self/fd listing) ran off the loop; the snapshot ran on it.
    assert len(probe.threads) == 2 and loop_thread not in probe.threads
    assert snapshot_threads == [loop_thread, loop_thread]


async def test_other_paths_methods_and_garbage(registry: CollectorRegistry, metrics: Metrics) -> None:
    async with trio.open_nursery() as nursery:
        port = await start_metrics(nursery, registry)
        assert (await _get(port, "/nothing-here"))[0] == 404  # (/ is the status page: tests/ops/test_status_page.py)
        assert (await _get(port, "/metrics/extra"))[0] == 404
        assert (await _get(port, "/metrics", method="POST"))[0] == 405
        status, headers, body = await _get(port, "/metrics", method="HEAD")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 0
        with trio.fail_after(30):
            assert _parse(await _exchange(port, b"NONSENSE\r\n\r\n"))[0] == 400
            # An endless header: answered 431 once past the cap, and the answer is not lost to a reset.
            assert _parse(await _exchange(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000))[0] == 431
            # Client that connects and leaves at once.
            (await trio.open_tcp_stream("127.0.0.1", port)).socket.close()
        assert (await _get(port, "/metrics"))[0] == 200  # still serving
        nursery.cancel_scope.cancel()


async def test_silent_client_is_dropped_at_the_deadline(
    registry: CollectorRegistry, autojump_clock: trio.testing.MockClock
) -> None:
    Metrics(registry, tick=1.0, process_collectors=False)
    async with trio.open_nursery() as nursery:
        port = await start_metrics(nursery, registry)
        start = trio.current_time()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            assert await stream.receive_some(100) == b""  # the server gave up on us
        assert trio.current_time() - start == HEAD_TIMEOUT  # virtual time: the head's deadline, not more
        assert (await _get(port, "/elsewhere"))[0] == 404  # and it still serves others
        nursery.cancel_scope.cancel()


async def test_a_full_endpoint_evicts_its_oldest_idle_client_for_the_newest(
        registry: CollectorRegistry, metrics: Metrics) -> None:
    """At the limit, the oldest connection that has not sent its request makes room (idled.door.gate): a flood
    of idle connections cannot keep a prober out, and a connection over its address's share is closed."""
    gate = Gate(Limits(per_address=3, max_pending=2, evict=True))
    async with trio.open_nursery() as nursery:
        port = await start_metrics(nursery, registry, gate=gate)
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)  # both handlers hold a slot
        with trio.fail_after(30):
            assert (await _get(port, "/metrics"))[0] == 200  # the newest gets in...
            assert await idle[0].receive_some(100) == b""  # ...the oldest idle one made room
        for stream in idle:
            await stream.aclose()
        nursery.cancel_scope.cancel()
    assert gate.refused["evicted"] == 1
