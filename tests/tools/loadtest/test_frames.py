"""Inbound frames of the user engine: bytes fed in any split, frame bodies and messages out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.protocol import PONG, PONG_FRAME, Error, ErrorCode, ProtocolError, Welcome, encode
from idled.tools.loadtest.frames import PONG_BODY, cut_frames, server_message

STREAM = [PONG_FRAME, encode(Welcome("uid", 42, timeout=45.0, max_frame=4096)), PONG_FRAME, PONG_FRAME,
          encode(Error(ErrorCode.IDLE_TIMEOUT, "no keepalive for 45 s"))]


def _feed(chunks: list[bytes], max_frame: int = 4096) -> tuple[list[object], bytes]:
    """What the engine does per read: pending + data -> bodies (decoded) + the new pending tail."""
    pending = b""
    out: list[object] = []
    for chunk in chunks:
        bodies, pending = cut_frames(pending + chunk, max_frame)
        out.extend(server_message(b) for b in bodies)
    return out, pending


def _expected() -> list[object]:
    return [PONG, Welcome("uid", 42, timeout=45.0, max_frame=4096), PONG, PONG,
            Error(ErrorCode.IDLE_TIMEOUT, "no keepalive for 45 s")]


def test_one_byte_at_a_time() -> None:
    data = b"".join(STREAM)
    messages, pending = _feed([data[k : k + 1] for k in range(len(data))])
    assert messages == _expected() and pending == b""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=20))
def test_any_split_gives_the_same_messages(cuts: list[int]) -> None:
    data = b"".join(STREAM)
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]
    messages, pending = _feed(chunks)
    assert messages == _expected() and pending == b""


def test_a_partial_frame_is_the_only_thing_kept() -> None:
    welcome = encode(Welcome("uid", 1, timeout=1.5))
    bodies, tail = cut_frames(PONG_FRAME + welcome[:6], 4096)
    assert bodies == [PONG_BODY] and tail == welcome[:6]
    assert cut_frames(b"\x00\x00", 4096) == ([], b"\x00\x00")  # not even a whole header
    assert cut_frames(b"", 4096) == ([], b"")


def test_an_oversized_length_fails_before_its_body_arrives() -> None:
    with pytest.raises(ProtocolError) as info:
        cut_frames(b"\x00\x01\x00\x01", 4096)  # 65537 bytes announced, none sent
    assert info.value.code == ErrorCode.TOO_LARGE


def test_the_pong_is_recognised_without_msgpack_and_garbage_is_a_protocol_error() -> None:
    assert server_message(PONG_BODY) is PONG
    with pytest.raises(ProtocolError) as info:
        server_message(b"\xc1")  # msgpack's reserved byte
    assert info.value.code == ErrorCode.BAD_FRAME
    with pytest.raises(ProtocolError):
        server_message(b"")
