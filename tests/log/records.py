"""What the snapshot and last-seen tests share: minimal presence records, a burst of short sessions, and the
memory a map of the log takes."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from idled.log.eventlog import EventLog

NOW = 1_700_000_000.0  # the wall time of seq 0; record n is at NOW + n


def ev(seq: int, kind: str, uid: Any, last_seen: float | None = None, timeout: float = 45.0) -> dict[str, Any]:
    """A record as the server writes it (the fields the log's maps read), at ``NOW + seq``."""
    ts = NOW + seq
    return {"seq": seq, "kind": kind, "uid": uid, "ts": ts, "reason": "login" if kind == "online" else "bye",
            "last_seen": ts if last_seen is None else last_seen, "timeout": timeout}


def churn(log: EventLog, first: int, pairs: int) -> int:
    """`pairs` short sessions (online then offline) of other users; returns the next seq."""
    seq = first
    for n in range(pairs):
        log.append([ev(seq, "online", f"c{n}"), ev(seq + 1, "offline", f"c{n}")])
        seq += 2
    return seq



class _LogMap(Protocol):
    def note(self, event: Mapping[str, Any]) -> None: ...


M = TypeVar("M", bound=_LogMap)


def filled(make: Callable[[], M], events: Iterable[Mapping[str, Any]]) -> tuple[M, int]:
    """A map of the log (``make()``: `LastSeen`, `OpenSessions`) that noted ``events``, and the bytes it took
    (tracemalloc: everything allocated from its making to its last event that is still held)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        log_map = make()
        for event in events:
            log_map.note(event)
        return log_map, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
