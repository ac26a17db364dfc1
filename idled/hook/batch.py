"""Batches of presence events as webhook bodies: the filter, the JSON, the caps. Pure: no clock, no I/O.

Theory of operation
-------------------
The runner feeds events in seq order to a `Batcher`. Each event is first matched against the `Filter`
(``kind=`` and ``reason=`` values: OR within a key, AND between keys); a filtered-out event is *consumed* --
the batch's ``through`` moves past it, so the checkpoint does too -- but not posted. A matching event is
encoded once to compact JSON (every field the event has: the fixed ones, then its extras) and appended if
the batch stays within ``max_events`` and ``max_bytes`` of body; `add` returns False when it would not fit,
and the caller closes the batch and offers the event to the next one (an event alone larger than
``max_bytes`` still goes, alone: the cap bounds batching, it does not drop data). `take` closes the batch:

    {"first_seq": 7, "last_seq": 9, "events": [{"seq": 7, ...}, {"seq": 9, ...}]}

``first_seq``/``last_seq`` are the seqs of the first and last event in ``events`` (seq 8 was filtered out
here); the ``webhook-id`` ``"7-9"`` is derived from them, so every retry of a batch carries the same id.
A batch of only filtered-out events has no body: nothing is posted, the checkpoint just moves.

Timing (``--batch-wait`` after the first event) is the runner's: the batcher only counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from idled.protocol import Event

__all__ = ["Filter", "Batch", "Batcher", "encode_event", "FILTER_KEYS"]

FILTER_KEYS: Final = ("kind", "reason")
_KINDS: Final = ("online", "offline")
_ENVELOPE: Final = len(b'{"first_seq":,"last_seq":,"events":[]}') + 2 * 20  # two seqs of up to 20 digits


@dataclass(frozen=True, slots=True)
class Filter:
    """Which events are posted: ``kinds``/``reasons`` empty means any."""

    kinds: frozenset[str] = frozenset()
    reasons: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, specs: Iterable[str]) -> Filter:
        """From ``--filter KEY=VALUE`` strings; ValueError names a bad one."""
        values: dict[str, set[str]] = {key: set() for key in FILTER_KEYS}
        for spec in specs:
            key, sep, value = spec.partition("=")
            if not sep or key not in values or not value:
                raise ValueError(f"--filter {spec!r}: expected {' or '.join(k + '=VALUE' for k in FILTER_KEYS)}")
            if key == "kind" and value not in _KINDS:
                raise ValueError(f"--filter {spec!r}: kind is online or offline")
            values[key].add(value)
        return cls(frozenset(values["kind"]), frozenset(values["reason"]))

    def matches(self, event: Event) -> bool:
        return (not self.kinds or event.kind in self.kinds) and (not self.reasons or event.reason in self.reasons)

    def __str__(self) -> str:
        parts = [f"kind={'|'.join(sorted(self.kinds))}"] if self.kinds else []
        parts += [f"reason={'|'.join(sorted(self.reasons))}"] if self.reasons else []
        return " and ".join(parts) or "every event"


def encode_event(event: Event) -> bytes:
    """Compact JSON of `Event.record()` (UTF-8; a value JSON cannot carry is written as its repr)."""
    return json.dumps(event.record(), ensure_ascii=False, separators=(",", ":"), default=repr).encode()


@dataclass(frozen=True, slots=True)
class Batch:
    """A closed batch: ``events`` (seq, ts, JSON) in seq order, and ``through``, the last seq it consumed
    (>= the last event's: filtered-out events after it count too)."""

    events: tuple[tuple[int, float, bytes], ...]
    through: int

    @property
    def first_seq(self) -> int:
        return self.events[0][0]

    @property
    def last_seq(self) -> int:
        return self.events[-1][0]

    @property
    def delivery_id(self) -> str:
        return f"{self.first_seq}-{self.last_seq}"

    def body(self) -> bytes:
        head = b'{"first_seq":%d,"last_seq":%d,"events":[' % (self.first_seq, self.last_seq)
        return head + b",".join(encoded for _, _, encoded in self.events) + b"]}"


class Batcher:
    """Accumulates one batch (see the module docstring)."""

    def __init__(self, max_events: int, max_bytes: int, filter: Filter | None = None) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("max_events and max_bytes must be positive")
        self.max_events, self.max_bytes = max_events, max_bytes
        self.filter = filter or Filter()
        self._events: list[tuple[int, float, bytes]] = []
        self._bytes = _ENVELOPE
        self._through: int | None = None
        self.filtered = 0  # events consumed but not posted, since the start

    @property
    def empty(self) -> bool:
        """Nothing consumed since the last `take`."""
        return self._through is None

    @property
    def count(self) -> int:
        """Events to post in the current batch."""
        return len(self._events)

    @property
    def full(self) -> bool:
        return len(self._events) >= self.max_events or self._bytes >= self.max_bytes

    def add(self, event: Event) -> bool:
        """Consume ``event``; False if it matches but does not fit (close the batch, then add it again)."""
        if not self.filter.matches(event):
            self._through = event.seq
            self.filtered += 1
            return True
        encoded = encode_event(event)
        size = len(encoded) + 1
        if self._events and (len(self._events) >= self.max_events or self._bytes + size > self.max_bytes):
            return False
        self._events.append((event.seq, event.ts, encoded))
        self._bytes += size
        self._through = event.seq
        return True

    def take(self) -> Batch | None:
        """The batch so far (None if nothing was consumed); starts the next one."""
        if self._through is None:
            return None
        batch = Batch(tuple(self._events), self._through)
        self._events, self._bytes, self._through = [], _ENVELOPE, None
        return batch
