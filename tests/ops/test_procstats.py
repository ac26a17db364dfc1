"""idled.ops.procstats: the standard process_* families, with the descriptor count read by one stat."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector

from idled.ops.metrics import Metrics
from idled.ops.procstats import ProcessStats, open_descriptors


def _values(collector: ProcessCollector | ProcessStats) -> dict[str, float]:
    return {sample.name: sample.value for family in collector.collect() for sample in family.samples}


@pytest.fixture
def many_descriptors() -> Iterator[int]:
    """1,000 more descriptors open (500 pipes) for the test's duration."""
    pipes = [os.pipe() for _ in range(500)]
    yield 1000
    for r, w in pipes:
        os.close(r)
        os.close(w)


@pytest.fixture
def no_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing a directory is what a scrape must not do (it costs ~0.1 ms per 100 descriptors)."""
    def listdir(path: object = ".") -> list[str]:
        raise AssertionError(f"listed {path}")
    monkeypatch.setattr(os, "listdir", listdir)


def test_the_same_families_as_the_library_collector() -> None:
    ours, theirs = _values(ProcessStats()), _values(ProcessCollector(registry=None))
    assert ours.keys() == theirs.keys()
    assert ours["process_max_fds"] == theirs["process_max_fds"]
    assert ours["process_start_time_seconds"] == pytest.approx(theirs["process_start_time_seconds"])
    # (the library's listing counts the descriptor it lists through)
    assert theirs["process_open_fds"] - 1 <= ours["process_open_fds"] <= theirs["process_open_fds"]
    assert ours["process_resident_memory_bytes"] > 1 << 20
    assert ours["process_cpu_seconds_total"] > 0


def test_open_descriptors_follow_what_is_open(many_descriptors: int) -> None:
    with_them = open_descriptors()
    assert with_them == len(os.listdir("/proc/self/fd")) - 1
    r, w = os.pipe()
    try:
        assert open_descriptors() == with_them + 2
    finally:
        os.close(r)
        os.close(w)


def test_a_scrape_does_not_list_the_descriptor_table(many_descriptors: int, no_listing: None) -> None:
    registry = CollectorRegistry()
    Metrics(registry, tick=1.0)
    assert (registry.get_sample_value("process_open_fds") or 0) > many_descriptors


def test_an_older_kernel_gets_the_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Linux 6.2 a /proc/PID/fd directory's size is 0: the count comes from listing it."""
    real_stat, counted = os.stat, open_descriptors()

    def old_kernel_stat(path: str) -> os.stat_result:
        result = real_stat(path)
        if path.endswith("/fd"):
            return os.stat_result((*result[:6], 0, *result[7:]))
        return result
    monkeypatch.setattr(os, "stat", old_kernel_stat)
    # (the listing counts the descriptor it lists through)
    assert open_descriptors() == counted + 1


def test_no_proc_no_process_metrics(tmp_path: os.PathLike[str]) -> None:
    assert _values(ProcessStats(proc_root=str(tmp_path))) == {}
