"""What the snapshot and last-seen tests share: minimal presence records and a burst of short sessions."""

from __future__ import annotations

from typing import Any

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
