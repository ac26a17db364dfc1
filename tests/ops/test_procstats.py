"""idled.ops.procstats: the standard process_* families, with the descriptor count read by one stat."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector

from idled.ops.metrics import Metrics
from idled.ops.procstats import ProcessStats, counts_by_size, open_descriptors


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


def test_the_same_families_as_the_library_collector() -> None:
    ours, theirs = _values(ProcessStats()), _values(ProcessCollector(registry=None))
    assert ours.keys() == theirs.keys()
    assert ours["process_max_fds"] == theirs["process_max_fds"]
    assert ours["process_start_time_seconds"] == pytest.approx(theirs["process_start_time_seconds"])
    # (the library's listing counts the descriptor it lists through)
    assert theirs["process_open_fds"] - 1 <= ours["process_open_fds"] <= theirs["process_open_fds"]
    assert ours["process_resident_memory_bytes"] > 1 << 20
    assert ours["process_cpu_seconds_total"] > 0


NEW_KERNEL = os.stat("/proc/self/fd").st_size > 0  # Linux 6.2+: the count is the directory's size
needs_new_kernel = pytest.mark.skipif(not NEW_KERNEL, reason="Linux before 6.2: the count needs a listing")


@needs_new_kernel
def test_open_descriptors_follow_what_is_open(many_descriptors: int) -> None:
    assert counts_by_size()
    with_them = open_descriptors()
    assert with_them == len(os.listdir("/proc/self/fd")) - 1
    r, w = os.pipe()
    try:
        assert open_descriptors() == with_them + 2
    finally:
        os.close(r)
        os.close(w)


@needs_new_kernel
def test_a_scrape_does_not_list_the_descriptor_table(many_descriptors: int, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    Metrics(registry, tick=1.0)  # (made once: it checks the kernel's count against one listing then)

    def listdir(path: object = ".") -> list[str]:
        raise AssertionError(f"listed {path}")  # what a scrape must not do: ~0.1 ms per 100 descriptors
    monkeypatch.setattr(os, "listdir", listdir)
    assert (registry.get_sample_value("process_open_fds") or 0) > many_descriptors


def test_a_kernel_whose_size_is_not_the_count_gets_the_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Linux 6.2 a /proc/PID/fd directory's size is 0; some other procfs may report a fixed size. Either
    way the count comes from listing it (which counts the descriptor it lists through)."""
    real_stat = os.stat
    for size in (0, 4096):
        def other_stat(path: str, size: int = size) -> os.stat_result:
            result = real_stat(path)
            if path.endswith("/fd"):
                return os.stat_result((*result[:6], size, *result[7:]))
            return result
        monkeypatch.setattr(os, "stat", other_stat)
        assert not counts_by_size()
        listed = len(os.listdir("/proc/self/fd"))
        assert abs(_values(ProcessStats())["process_open_fds"] - listed) <= 1
        monkeypatch.undo()


def test_no_proc_no_process_metrics(tmp_path: os.PathLike[str]) -> None:
    assert _values(ProcessStats(proc_root=str(tmp_path))) == {}
