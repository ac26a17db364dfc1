"""Python tasks without Spark: the paired path's tasks in a pool of local processes.

On the paired path Spark only schedules Python tasks (`paired`, `incpaired`): each reads its files by path,
writes its sessions with pyarrow and returns a small result. With a local master, a pool of this machine's
processes runs the same task functions without a JVM -- Spark's start (~4-7 s here) and its task plumbing
(results pickled through the JVM) are all it would add. `TaskPool.run` takes a task function in Spark's
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

__all__ = ["local_cores", "TaskPool", "run_tasks"]

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


class TaskPool:
    """A pool of `processes` local processes for the tasks of one run (both passes of a full run share it:
    its workers start once). A context manager: the workers end with it."""

    def __init__(self, processes: int, preload: Sequence[str] = ()) -> None:
        self.processes = max(1, processes)
        self._preload = list(preload)
        self._pool: ProcessPoolExecutor | None = None

    def run(self, func: Callable[[Iterator[T]], Iterator[R]], items: Sequence[T]) -> list[R]:
        """``func`` over each item (one task per item, handed out in order); the results in item order.
        `func` must pickle (a module-level function, or a `functools.partial` of one)."""
        if not items:
            return []
        if self._pool is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(self._preload)
            self._pool = ProcessPoolExecutor(max_workers=self.processes, mp_context=context)
        results: list[Any] = []
        for chunk in self._pool.map(_one, [func] * len(items), items):
            results.extend(chunk)
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> TaskPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_tasks(func: Callable[[Iterator[T]], Iterator[R]], items: Sequence[T], processes: int,
              preload: Sequence[str] = ()) -> list[R]:
    """``func`` over each item in a pool of its own (`TaskPool.run`), at most one process per item."""
    with TaskPool(min(len(items), processes), preload) as pool:
        return pool.run(func, items)
