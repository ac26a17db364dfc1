"""Python tasks without Spark: the paired path's tasks in a pool of local processes.

On the paired path Spark only schedules Python tasks (`paired`, `incpaired`): each reads its files by path,
writes its sessions with pyarrow and returns a small result. With a local master, a pool of this machine's
processes runs the same task functions without a JVM -- Spark's start (~4-7 s here) and its task plumbing
(results pickled through the JVM) are all it would add. `run_tasks` takes a task function in Spark's
``mapPartitions`` shape (an iterator of items in, results out), so both schedulers run the same code; each
item is one task, handed out in the given order (the callers put the largest first).

A forkserver, not fork: the driver may hold Spark's gateway threads (a test's session), and a forked
child of a threaded process can deadlock. Workers import the modules named in `preload` once.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

__all__ = ["local_cores", "run_tasks"]

T = TypeVar("T")
R = TypeVar("R")


def local_cores(master: str | None) -> int | None:
    """The cores a local master asks for (``local``: 1, ``local[4]``: 4, ``local[*]``: this machine's), or None
    if the master is not local."""
    if master is None or not master.startswith("local"):
        return None
    cores = os.cpu_count() or 1
    if master == "local":
        return 1
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else ""
    count = inside.split(",")[0].strip()
    if count.isdigit() and int(count) > 0:
        return int(count)
    return cores


def _one(func: Callable[[Iterator[T]], Iterator[R]], item: T) -> list[R]:
    return list(func(iter((item,))))


def run_tasks(func: Callable[[Iterator[T]], Iterator[R]], items: Sequence[T], processes: int,
              preload: Sequence[str] = ()) -> list[R]:
    """``func`` over each item in a pool of `processes` (one task per item, in order); the results in item
    order. `func` must pickle (a module-level function, or a `functools.partial` of one)."""
    if not items:
        return []
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    results: list[Any] = []
    with ProcessPoolExecutor(max_workers=max(1, min(len(items), processes)), mp_context=context) as pool:
        for chunk in pool.map(_one, [func] * len(items), items):
            results.extend(chunk)
    return results
