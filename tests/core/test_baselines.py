"""Baseline-specific behaviour (the shared contract is in test_detectors.py)."""

from __future__ import annotations

from idled.core.baselines import HEAP_MIN_PRUNE, DeadlineHeap, FullScan


def test_heap_prunes_stale_entries_like_trio() -> None:
    heap = DeadlineHeap(timeout=30)
    for i in range(100):
        heap.add(i, 0)
    for now in range(1, 2 * HEAP_MIN_PRUNE // 100 + 30):
        for i in range(100):
            heap.touch(i, now)  # each keepalive leaves one stale entry behind
        heap.advance(now)
    # Stale entries never outnumber live ones by more than trio's threshold: the heap was pruned.
    assert len(heap._heap) <= 2 * len(heap) + HEAP_MIN_PRUNE + 100
    assert len(heap) == 100


def test_heap_same_deadline_touch_adds_no_entry() -> None:
    heap = DeadlineHeap(timeout=30)
    heap.add("k", 5)
    heap.touch("k", 5)
    assert len(heap._heap) == 1


def test_scan_chunks_rechecks_keys_touched_between_chunks() -> None:
    scan = FullScan(timeout=5)
    for i in range(10):
        scan.add(i, 0)
    first = scan.advance(5, limit=4)
    scan.touch(9, 5)  # found by the scan, touched before its chunk was returned
    rest = []
    while (due := scan.next_due()) is not None and due <= 5:
        rest += scan.advance(5, limit=4)
    assert sorted(first + rest) == list(range(9))
    assert 9 in scan and scan.advance(10) == [9]
