"""Batching: caps on events and bytes, the filter, the body, the delivery id."""

from __future__ import annotations

import json

import pytest

from idled.hook.batch import Batcher, Filter, encode_event
from idled.protocol import Event


def event(seq: int, kind: str = "online", reason: str = "login", uid: str = "u") -> Event:
    return Event(seq, kind, uid, 1000.0 + seq, reason, 999.0, 1030.0, {"timeout": 30.0})  # type: ignore[arg-type]


def test_body_carries_every_field_and_the_seq_range() -> None:
    batcher = Batcher(10, 1 << 20)
    for seq in (3, 4):
        assert batcher.add(event(seq))
    batch = batcher.take()
    assert batch is not None and batcher.empty
    body = json.loads(batch.body())
    assert body["first_seq"] == 3 and body["last_seq"] == 4 and batch.delivery_id == "3-4"
    assert body["events"][0] == {"seq": 3, "kind": "online", "uid": "u", "ts": 1003.0, "reason": "login",
                                 "last_seen": 999.0, "deadline": 1030.0, "timeout": 30.0}


def test_the_event_cap_and_the_byte_cap_close_a_batch() -> None:
    batcher = Batcher(2, 1 << 20)
    assert batcher.add(event(1)) and batcher.add(event(2)) and batcher.full
    assert not batcher.add(event(3))
    size = len(encode_event(event(1)))
    small = Batcher(100, 100 + 2 * size)
    added = [small.add(event(seq)) for seq in range(1, 5)]
    assert added == [True, True, False, False]
    batch = small.take()
    assert batch is not None and len(batch.body()) <= 100 + 2 * size


def test_an_event_larger_than_the_byte_cap_goes_alone() -> None:
    batcher = Batcher(10, 10)
    assert batcher.add(event(1))
    assert not batcher.add(event(2))
    batch = batcher.take()
    assert batch is not None and [seq for seq, _, _ in batch.events] == [1]


def test_filtered_events_are_consumed_not_posted() -> None:
    batcher = Batcher(10, 1 << 20, Filter.parse(["kind=offline", "reason=idle", "reason=logout"]))
    batcher.add(event(1, "online", "login"))
    batcher.add(event(2, "offline", "idle"))
    batcher.add(event(3, "offline", "kicked"))
    batch = batcher.take()
    assert batch is not None and [s for s, _, _ in batch.events] == [2] and batch.through == 3
    assert batcher.filtered == 2
    batcher.add(event(4, "online", "login"))
    only_filtered = batcher.take()
    assert only_filtered is not None and only_filtered.events == () and only_filtered.through == 4
    assert batcher.take() is None


@pytest.mark.parametrize("spec", ["kind", "kind=away", "colour=red", "reason="])
def test_bad_filters_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="--filter"):
        Filter.parse([spec])
