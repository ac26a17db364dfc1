"""`idled bench --last-seen`: what the event log's last-seen map costs per offline user.

For each size N (default 1,000,000) and each uid kind (str ``user-0000042``, int), N offline records are
noted into a `LastSeen` (as the log writer does on append), then:

* memory: RSS growth of the process while the map is filled (a first pass, untraced), and tracemalloc's count
  of what the map holds (a second pass): the dict, the uid objects and the floats -- after an offline the
  presence table no longer holds the uid, so it is the map's to pay for;
* the snapshot: the map written by `write_snapshot` beside no open sessions (bytes on disk, seconds to write it
  durably: temporary file, fsync, rename, directory fsync), then read back (`read_snapshot_state`, seconds) and
  pruned (`LastSeen.prune` at the horizon, seconds).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from idled.log.lastseen import DEFAULT_LAST_SEEN_HORIZON, LastSeen
from idled.log.snapshot import read_snapshot_state, write_snapshot

__all__ = ["report_lines", "fill", "measure"]

BASE = 1_790_000_000.0  # a wall time in 2026


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fill(size: int, kind: str) -> LastSeen:
    """A map of ``size`` offline users, each noted from an offline record as the writer does."""
    seen = LastSeen(DEFAULT_LAST_SEEN_HORIZON)
    event: dict[str, Any] = {"kind": "offline"}
    note = seen.note
    as_str = kind == "str"
    for i in range(size):
        event["uid"] = f"user-{i:07d}" if as_str else 10**12 + i
        event["last_seen"] = BASE + i * 0.001  # a fresh float, as in a decoded record
        note(event)
    return seen


def measure(size: int, kind: str, directory: str | None) -> tuple[float, ...]:
    """One row's figures (run in a fresh process, so that RSS growth is not memory a previous row freed)."""
    gc.collect()
    before = _rss()
    seen = fill(size, kind)
    rss = _rss() - before
    del seen
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        seen = fill(size, kind)
        traced = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    work = tempfile.mkdtemp(prefix="idled-bench-lastseen-", dir=directory)
    try:
        started = time.perf_counter()
        path = write_snapshot(work, 1, {}, last_seen=seen.seen)
        written = time.perf_counter() - started
        on_disk = os.path.getsize(path)
        started = time.perf_counter()
        _seq, _sessions, loaded = read_snapshot_state(path)
        load = time.perf_counter() - started
        if len(loaded) != size:
            raise OSError(f"snapshot read back {len(loaded)} users of {size}")
        restored = LastSeen(DEFAULT_LAST_SEEN_HORIZON, loaded)
        started = time.perf_counter()
        restored.prune(BASE)  # nothing is stale: the full scan every snapshot pays
        prune = time.perf_counter() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rss, traced, on_disk, written, load, prune


def report_lines(sizes: list[int], directory: str | None) -> Iterator[str]:
    yield ("idled bench --last-seen: the event log's last-seen map (uid -> last_seen of offline users), "
           "per uid kind; memory by RSS growth and by tracemalloc, the snapshot on disk and its write/load time")
    yield (f"{'users':>10} {'uid':>4} {'rss MB':>8} {'rss B/user':>10} {'traced MB':>9} {'traced B/user':>13} "
           f"{'snapshot MB':>11} {'B/user':>6} {'write s':>7} {'load s':>7} {'prune s':>7}")
    fork = multiprocessing.get_context("fork")
    for size in sizes:
        for kind in ("str", "int"):
            with ProcessPoolExecutor(max_workers=1, mp_context=fork) as pool:
                rss, traced, on_disk, written, load, prune = pool.submit(measure, size, kind, directory).result()
            yield (f"{size:>10,} {kind:>4} {rss / 1e6:>8.1f} {rss / size:>10.1f} {traced / 1e6:>9.1f} "
                   f"{traced / size:>13.1f} {on_disk / 1e6:>11.1f} {on_disk / size:>6.1f} {written:>7.3f} "
                   f"{load:>7.3f} {prune:>7.3f}")
