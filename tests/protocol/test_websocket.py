"""The lean WebSocket decoder (idled.protocol.websocket), sans-IO: client frames fed whole and one byte at a time."""

from __future__ import annotations

import os
import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from idled.protocol import NEED_DATA, PING, ErrorCode, Msg, ProtocolError
from idled.protocol import encode, Error, PONG_FRAME
from idled.protocol.websocket import ACTIVITY, WsDecoder, close_code, close_frame, error_of, message, wrap


def client_frame(payload: bytes, opcode: int = 2, fin: bool = True, mask: bytes | None = None) -> bytes:
    """A client frame as RFC 6455 says a client sends it (masked)."""
    mask = os.urandom(4) if mask is None else mask
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 0x10000:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


PING_BODY = msgpack.packb({"op": "ping"})
MSG_BODY = msgpack.packb({"op": "msg", "data": "x" * 300})


def events(decoder: WsDecoder, data: bytes, bytewise: bool) -> list[object]:
    out: list[object] = []
    for piece in ([data[i:i + 1] for i in range(len(data))] if bytewise else [data]):
        decoder.receive_data(piece)
        while (event := decoder.next_event()) is not NEED_DATA:
            out.append(event)
    return out


@pytest.mark.parametrize("bytewise", [False, True])
def test_keepalives_messages_fragments_and_control_frames(bytewise: bool) -> None:
    decoder = WsDecoder(4096)
    decoder.report_pings = True
    data = (client_frame(PING_BODY) + client_frame(MSG_BODY)  # 16-bit length
            + client_frame(PING_BODY[:2], fin=False) + client_frame(b"hi", opcode=9)  # a ping inside a message
            + client_frame(PING_BODY[2:5], opcode=0, fin=False) + client_frame(PING_BODY[5:], opcode=0))
    got = events(decoder, data, bytewise)
    assert got[0] is PING and isinstance(got[1], Msg) and PING in got[2:] and ACTIVITY in got[2:]
    assert decoder.take_replies() == b"\x8a\x02hi"  # the pong carries the ping's payload
    assert decoder.buffered == 0 and not decoder.failed


def test_close_ends_the_input_with_an_echo() -> None:
    decoder = WsDecoder()
    decoder.receive_data(client_frame(struct.pack(">H", 1000) + b"bye", opcode=8) + client_frame(PING_BODY))
    assert decoder.next_event() is NEED_DATA and decoder.closed == 1000 and decoder.buffered == 0
    assert decoder.take_replies() == close_frame(1000)


@pytest.mark.parametrize(("payload", "answer"), [
    (b"", None),  # no status: answered with none
    (struct.pack(">H", 1001) + b"going", 1000),
    (struct.pack(">H", 4000), 1000),  # private use
    (struct.pack(">H", 1012), 1000),  # registered since RFC 6455 (service restart)
    (b"\x03", 1002),  # one byte: a status needs two (RFC 6455 5.5.1)
    (struct.pack(">H", 999), 1002),  # below the range
    (struct.pack(">H", 1005), 1002),  # reserved: never sent on the wire (7.4.1)
    (struct.pack(">H", 1006), 1002),
    (struct.pack(">H", 1015), 1002),
    (struct.pack(">H", 2000), 1002),  # reserved for the specification
    (struct.pack(">H", 5000), 1002),  # beyond any range
    (struct.pack(">H", 1000) + b"\xff\xfe", 1007),  # a reason that is not UTF-8 (8.1)
])
def test_a_close_is_answered_by_rfc_6455s_rules(payload: bytes, answer: int | None) -> None:
    decoder = WsDecoder()
    decoder.receive_data(client_frame(payload, opcode=8))
    assert decoder.next_event() is NEED_DATA and decoder.closed is not None
    assert decoder.take_replies() == close_frame(answer)


@pytest.mark.parametrize(("data", "code"), [
    (client_frame(b"x" * 5000), ErrorCode.TOO_LARGE),  # refused at its header
    (client_frame(b"x" * 3000, fin=False) + client_frame(b"x" * 3000, opcode=0), ErrorCode.TOO_LARGE),  # reassembled
    (client_frame(b'{"op":"ping"}', opcode=1), ErrorCode.BAD_FRAME),  # text
    (client_frame(PING_BODY)[:1] + bytes([len(PING_BODY)]) + PING_BODY, ErrorCode.BAD_FRAME),  # unmasked
    (bytes([0xC2]) + client_frame(PING_BODY)[1:], ErrorCode.BAD_FRAME),  # RSV1 (no deflate negotiated)
    (client_frame(b"", opcode=0), ErrorCode.BAD_FRAME),  # nothing to continue
    (client_frame(b"a", fin=False) + client_frame(b"b"), ErrorCode.BAD_FRAME),  # a new message inside one
    (client_frame(b"p" * 126, opcode=9), ErrorCode.BAD_FRAME),  # control frame too long
    (client_frame(b"", opcode=5), ErrorCode.BAD_FRAME),  # unknown opcode
    (client_frame(b"\xc1"), ErrorCode.BAD_FRAME),  # msgpack's own rule, as on TCP
])
@pytest.mark.parametrize("bytewise", [False, True])
def test_bad_input_is_one_error_then_the_decoder_stays_failed(data: bytes, code: ErrorCode, bytewise: bool) -> None:
    decoder = WsDecoder(4096)
    with pytest.raises(ProtocolError) as info:
        events(decoder, data, bytewise)
    assert info.value.code == code
    assert decoder.failed and decoder.buffered <= 4096 + 14
    with pytest.raises(ProtocolError):
        decoder.next_event()


def test_messages_before_an_error_are_delivered_first() -> None:
    decoder = WsDecoder()
    decoder.receive_data(client_frame(PING_BODY) + client_frame(b"x", opcode=1))
    assert decoder.next_event() is PING
    with pytest.raises(ProtocolError):
        decoder.next_event()


@given(st.binary(max_size=300), st.binary(min_size=4, max_size=4), st.integers(1, 50))
def test_any_payload_survives_masking_and_any_split(payload: bytes, mask: bytes, cut: int) -> None:
    decoder = WsDecoder(4096)
    data = client_frame(payload, mask=mask)
    decoder.receive_data(data[:cut])
    decoder.receive_data(data[cut:])
    assert decoder.unconsumed() == struct.pack(">I", len(payload)) + payload


def test_outbound_wrap_close_codes_and_the_error_frame() -> None:
    frames = PONG_FRAME + encode(Error("too_large", "x"))
    wrapped, rest = wrap(frames + b"\x00\x00")
    assert rest == b"\x00\x00" and wrapped == message(PONG_FRAME[4:]) + message(encode(Error("too_large", "x"))[4:])
    assert error_of(frames) == "too_large" and error_of(PONG_FRAME) is None
    assert (close_code("too_large"), close_code("bad_frame"), close_code("server_shutdown")) == (1009, 1002, 1001)
    assert (close_code("idle_timeout"), close_code(None)) == (4000, 1000)
    assert message(b"y" * 200)[:4] == b"\x82\x7e\x00\xc8"


def test_a_frame_arriving_in_pieces_is_appended_to_not_copied_whole_per_piece() -> None:
    # A gateway's frame may be 1 MiB (64 MiB at most): re-concatenating the partial frame on every read made
    # its reassembly quadratic in the pieces (measured: 1 MiB in 100-byte reads, 82 ms against TCP's 1.7;
    # review/ws_drip_cpu.py). The partial frame is one buffer, grown in place, until the frame is whole.
    body = msgpack.packb({"op": "msg", "data": "x" * 200_000})
    data = client_frame(body)
    decoder = WsDecoder(len(body))
    decoder.receive_data(data[:1000])
    decoder.receive_data(data[1000:2000])  # (the first read's rest is kept as it came; appended to from here)
    held = decoder._raw  # noqa: SLF001 -- the invariant is about this buffer's identity
    at = 2000
    while len(data) - at > 1000:
        decoder.receive_data(data[at:at + 1000])
        assert decoder._raw is held  # noqa: SLF001
        at += 1000
    decoder.receive_data(data[at:])
    assert decoder.next_event() == Msg("x" * 200_000) and decoder.buffered == 0
