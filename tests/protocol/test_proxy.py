"""The PROXY v1/v2 header parser, fed bytes (whole, and one at a time)."""

from __future__ import annotations

import struct

import pytest

from idled.protocol import NEED_DATA, ErrorCode
from idled.protocol.proxy import (
    MAX_V1, SIGNATURE_V2, ProxyError, ProxyHeader, ProxyParser, encode_v1, encode_v2,
)


def feed_bytewise(data: bytes, honour_wanted: bool = True) -> tuple[ProxyHeader, ProxyParser, int]:
    """Feed ``data`` one byte at a time; returns the header, the parser and how many bytes were fed."""
    parser = ProxyParser()
    for i in range(len(data)):
        if honour_wanted:
            assert parser.wanted >= 1
        parser.receive_data(data[i:i + 1])
        event = parser.next_event()
        if event is not NEED_DATA:
            assert isinstance(event, ProxyHeader)
            return event, parser, i + 1
    raise AssertionError("no header")


@pytest.mark.parametrize("source,destination", [
    (("203.0.113.7", 56324), ("192.0.2.1", 7878)),
    (("2001:db8::7", 1), ("2001:db8::1", 65535)),
])
@pytest.mark.parametrize("encode", [encode_v1, encode_v2])
def test_round_trip_bytewise(encode, source, destination) -> None:
    data = encode(source, destination)
    header, parser, used = feed_bytewise(data + b"client bytes")
    assert used == len(data)  # the header ends exactly where it ends, whatever follows
    assert header.source == source and header.destination == destination
    assert header.version == (1 if encode is encode_v1 else 2)


def test_whole_chunk_keeps_trailing_bytes() -> None:
    parser = ProxyParser()
    parser.receive_data(encode_v1(("10.0.0.1", 1), ("10.0.0.2", 2)) + b"\x16\x03\x01rest")
    header = parser.next_event()
    assert isinstance(header, ProxyHeader) and header.source == ("10.0.0.1", 1)
    assert parser.trailing == b"\x16\x03\x01rest"


def test_v2_wanted_is_exact() -> None:
    data = encode_v2(("10.1.2.3", 4000), ("10.0.0.1", 7878)) + b"TLS"
    parser = ProxyParser()
    pos = 0
    while (event := parser.next_event()) is NEED_DATA:
        n = parser.wanted
        parser.receive_data(data[pos:pos + n])
        pos += n
    assert isinstance(event, ProxyHeader) and event.source == ("10.1.2.3", 4000)
    assert pos == len(data) - 3 and parser.trailing == b""  # never read past the header


def test_local_and_unknown_carry_no_address() -> None:
    header, _, _ = feed_bytewise(encode_v2(None))
    assert header == ProxyHeader(2, None, None)
    header, _, _ = feed_bytewise(b"PROXY UNKNOWN\r\n")
    assert header == ProxyHeader(1, None, None)
    header, _, _ = feed_bytewise(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n")
    assert header.source is None


def test_v2_tlvs_are_skipped() -> None:
    body = bytes([127, 0, 0, 2, 127, 0, 0, 1]) + struct.pack(">HH", 5000, 7878) + b"\x04\x00\x03abc"
    data = SIGNATURE_V2 + bytes([0x21, 0x11]) + struct.pack(">H", len(body)) + body
    header, _, used = feed_bytewise(data)
    assert header.source == ("127.0.0.2", 5000) and used == len(data)


@pytest.mark.parametrize("data,why", [
    (b"\x00\x00\x00\x05\x82\xa2op", "expected a PROXY header"),  # an idled frame where a header is required
    (b"GET / HTTP/1.1\r\n", "expected a PROXY header"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "not ended by CRLF"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n", "malformed"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 70000\r\n", "malformed"),
    (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", "malformed"),
    (b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", "malformed"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "malformed"),
    (b"PROXY TCP4 " + b"1" * MAX_V1, "longer than"),
    (SIGNATURE_V2 + bytes([0x31, 0x11, 0, 12]) + bytes(12), "unsupported v2 version"),
    (SIGNATURE_V2 + bytes([0x22, 0x11, 0, 12]) + bytes(12), "unknown v2 command"),
    (SIGNATURE_V2 + bytes([0x21, 0x12, 0, 12]) + bytes(12), "unsupported v2 family"),
    (SIGNATURE_V2 + bytes([0x21, 0x21, 0, 12]) + bytes(12), "address block"),
    (SIGNATURE_V2 + bytes([0x21, 0x11, 0xFF, 0xFF]), "over the limit"),
])
def test_bad_headers_are_typed_errors(data: bytes, why: str) -> None:
    for chunked in (False, True):
        parser = ProxyParser()
        with pytest.raises(ProxyError) as info:
            for piece in ([data[i:i + 1] for i in range(len(data))] if chunked else [data]):
                parser.receive_data(piece)
                parser.next_event()
        assert info.value.code == ErrorCode.BAD_FRAME and why in info.value.reason


def test_max_size_bounds_the_buffer() -> None:
    with pytest.raises(ValueError):
        ProxyParser(max_size=16)
    parser = ProxyParser(max_size=300)
    assert parser.wanted == 12
