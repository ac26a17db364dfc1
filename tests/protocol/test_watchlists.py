"""Watchlist messages on the wire: `subscribe` with `uids`, `watch`, `unwatch` (bytes in, messages out)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from idled.protocol import FrameDecoder, ProtocolError, Query, Subscribe, Unwatch, Watch, encode

from tests.peers import frame


def decode(obj: Any) -> Any:
    decoder = FrameDecoder(1 << 20)
    decoder.receive_data(frame(obj))
    return decoder.next_event()


def bad(obj: Any) -> str:
    with pytest.raises(ProtocolError) as error:
        decode(obj)
    assert error.value.code == "bad_message"
    return error.value.reason


def test_wire_format() -> None:
    assert msgpack.unpackb(encode(Subscribe(uids=("a", 42)))[4:]) == {"op": "subscribe", "uids": ["a", 42]}
    assert msgpack.unpackb(encode(Subscribe(3, True, ()))[4:]) == {"op": "subscribe", "from": 3, "durable": True,
                                                                  "uids": []}
    assert msgpack.unpackb(encode(Watch(("a", 1)))[4:]) == {"op": "watch", "uids": ["a", 1]}
    assert msgpack.unpackb(encode(Unwatch(("a",)))[4:]) == {"op": "unwatch", "uids": ["a"]}


def test_no_uids_is_byte_for_byte_the_old_subscribe() -> None:
    assert encode(Subscribe()) == frame({"op": "subscribe"})
    assert encode(Subscribe(5, True)) == frame({"op": "subscribe", "from": 5, "durable": True})


def test_decoding_keeps_uids_as_given() -> None:
    assert decode({"op": "subscribe", "uids": ["a", 42, "42", 42]}) == Subscribe(None, False, ("a", 42, "42", 42))
    assert decode({"op": "subscribe", "uids": []}) == Subscribe(None, False, ())  # empty: still a watchlist
    assert decode({"op": "subscribe", "uids": None}) == Subscribe()  # nil: absent
    assert decode({"op": "subscribe", "from": 9, "durable": False, "uids": [1]}) == Subscribe(9, False, (1,))
    assert decode({"op": "watch", "uids": [7, "b"]}) == Watch((7, "b"))
    assert decode({"op": "unwatch", "uids": []}) == Unwatch(())
    for message in (Subscribe(1, True, ("x",)), Watch(("é" * 128, 2**63 - 1)), Unwatch((0,))):
        decoder = FrameDecoder(4096)
        for byte in encode(message):  # byte by byte
            decoder.receive_data(bytes([byte]))
        assert decoder.next_event() == message


@pytest.mark.parametrize("obj", [
    {"op": "subscribe", "uids": "a"},
    {"op": "subscribe", "uids": {"a": 1}},
    {"op": "subscribe", "uids": [1, -1]},
    {"op": "subscribe", "uids": [True]},
    {"op": "subscribe", "uids": ["a" * 257]},
    {"op": "watch"},
    {"op": "watch", "uids": None},
    {"op": "watch", "uids": [1.5]},
    {"op": "watch", "uids": [["alice", "phone"]]},  # plain uids only: no session keys (uid, device)
    {"op": "watch", "uids": [], "from": 1},
    {"op": "unwatch"},
    {"op": "unwatch", "uids": [""]},
    {"op": "unwatch", "uids": [], "durable": True},
])
def test_invalid(obj: dict[str, Any]) -> None:
    assert bad(obj)


def test_reasons_name_the_field() -> None:
    assert "uids[1]" in bad({"op": "watch", "uids": ["a", 2**63]})
    assert "watch needs uids" in bad({"op": "watch"})
    assert "unknown field" in bad({"op": "unwatch", "uids": [], "x": 1})
    assert decode({"op": "query", "uids": ["a"]}) == Query(("a",))  # the neighbour is unchanged
