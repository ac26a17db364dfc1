"""The MQTT 3.1.1 codec of `idled loadtest --peer mqtt`, and the wire that plugs it into the user engine:
bytes in any split, the standard's own examples, and malformed input refused before anything is buffered."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idled.protocol import PONG, Error, ProtocolError, Welcome
from idled.tools.loadtest import mqtt
from idled.tools.loadtest.wire import cut_mqtt, mqtt_client_id, mqtt_message

# MQTT 3.1.1, table 2.4: the boundaries of one to four bytes of remaining length
STANDARD = [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"), (16_384, b"\x80\x80\x01"),
            (2_097_151, b"\xff\xff\x7f"), (2_097_152, b"\x80\x80\x80\x01"), (268_435_455, b"\xff\xff\xff\x7f")]


@pytest.mark.parametrize(("n", "encoded"), STANDARD)
def test_remaining_length_as_the_standard_tabulates_it(n: int, encoded: bytes) -> None:
    assert mqtt.encode_remaining_length(n) == encoded
    assert mqtt.decode_remaining_length(b"\x30" + encoded) == (n, 1 + len(encoded))


@given(st.integers(0, mqtt.MAX_REMAINING_LENGTH))
def test_remaining_length_round_trips(n: int) -> None:
    encoded = mqtt.encode_remaining_length(n)
    assert mqtt.decode_remaining_length(b"\x30" + encoded) == (n, 1 + len(encoded))
    for cut in range(1, len(encoded)):  # every proper prefix: not yet known
        assert mqtt.decode_remaining_length(b"\x30" + encoded[:cut]) is None


def test_remaining_length_out_of_range_or_malformed() -> None:
    for n in (-1, mqtt.MAX_REMAINING_LENGTH + 1):
        with pytest.raises(ValueError):
            mqtt.encode_remaining_length(n)
    with pytest.raises(mqtt.MqttError, match="four bytes"):
        mqtt.decode_remaining_length(b"\x30\xff\xff\xff\xff\x01")


def test_connect_is_the_standards_layout() -> None:
    packet = mqtt.connect("lt42", 20)
    # fixed header 0x10, remaining length 16; "MQTT" level 4; flags: clean session only; keepalive 20; client id
    assert packet == b"\x10\x10\x00\x04MQTT\x04\x02\x00\x14\x00\x04lt42"
    assert mqtt.parse_connect(packet) == mqtt.Connect("lt42", 20, True, 0x02)


@given(st.text(max_size=300), st.integers(0, mqtt.MAX_KEEPALIVE))
def test_connect_round_trips(client_id: str, keepalive: int) -> None:
    got = mqtt.parse_connect(mqtt.connect(client_id, keepalive))
    assert (got.client_id, got.keepalive, got.clean_session) == (client_id, keepalive, True)


@pytest.mark.parametrize("keepalive", [-1, 65_536, 2.5])
def test_an_mqtt_keepalive_is_whole_seconds_in_16_bits(keepalive: float) -> None:
    with pytest.raises(ValueError):
        mqtt.connect("x", keepalive)  # type: ignore[arg-type]


def test_a_qos0_publish_is_the_standards_layout() -> None:
    # MQTT-3.3.1: type 3, flags 0 (QoS 0, not retained, no DUP); then the topic (2-byte length) and payload
    assert mqtt.publish("k") == b"\x30\x03\x00\x01k"
    assert mqtt.publish("a/b", b"xy") == b"\x30\x07\x00\x03a/bxy"
    long = mqtt.publish("t", bytes(200))
    assert long[:3] == b"\x30\xcb\x01" and len(long) == 3 + 203  # a remaining length of two bytes


def test_the_constant_packets() -> None:
    assert (mqtt.PINGREQ, mqtt.PINGRESP, mqtt.DISCONNECT) == (b"\xc0\x00", b"\xd0\x00", b"\xe0\x00")
    assert mqtt.parse_packet(mqtt.PINGRESP) == mqtt.Packet(mqtt.PINGRESP_TYPE, 0, b"")
    assert mqtt.parse_packet(mqtt.connack()) == mqtt.Connack(False, 0)
    assert mqtt.parse_packet(mqtt.connack(5, True)) == mqtt.Connack(True, 5)


STREAM = [mqtt.connack(), mqtt.PINGRESP, mqtt.PINGRESP, b"\x30\x82\x01" + bytes(130), mqtt.PINGRESP]


def _feed(chunks: list[bytes], limit: int = 4096) -> tuple[list[bytes], bytes]:
    pending = b""
    out: list[bytes] = []
    for chunk in chunks:
        packets, pending = mqtt.cut_packets(pending + chunk, limit)
        out.extend(packets)
    return out, pending


def test_packets_one_byte_at_a_time() -> None:
    data = b"".join(STREAM)
    assert _feed([data[k:k + 1] for k in range(len(data))]) == (STREAM, b"")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 150), max_size=20))
def test_any_split_gives_the_same_packets(cuts: list[int]) -> None:
    data = b"".join(STREAM)
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]
    assert _feed(chunks) == (STREAM, b"")


def test_an_oversized_packet_is_refused_from_its_header_alone() -> None:
    # the header says 128 + 3 bytes: refused before a single byte of the body is there
    with pytest.raises(mqtt.MqttError, match="exceeds the limit of 100"):
        mqtt.cut_packets(b"\x30\x80\x01", 100)
    assert mqtt.cut_packets(b"\x30\x80", 100) == ([], b"\x30\x80")  # (its length not yet readable)


@pytest.mark.parametrize("packet", [
    b"\x21\x02\x00\x00",  # CONNACK with flags
    b"\x20\x03\x00\x00\x00",  # CONNACK of 3 bytes
    b"\x20\x02\x02\x00",  # reserved acknowledge flag
    b"\xd1\x00",  # PINGRESP with flags
    b"\xd0\x01\x00",  # PINGRESP with a body
])
def test_malformed_server_packets(packet: bytes) -> None:
    with pytest.raises(mqtt.MqttError):
        mqtt.parse_packet(packet)


# ------------------------------------------------------------------------------- the wire (engine glue)


def test_the_wire_gives_the_engine_its_three_messages() -> None:
    assert mqtt_message(mqtt.PINGRESP, 20) is PONG
    hello = mqtt_message(mqtt.connack(), 20)
    assert isinstance(hello, Welcome) and hello.timeout == 30.0  # the MQTT rule: 1.5 x the keepalive
    refused = mqtt_message(mqtt.connack(2), 20)
    assert isinstance(refused, Error) and refused.code == "connack_2"
    other = mqtt_message(b"\x30\x02\x00\x00", 20)  # a PUBLISH: handed back, ignored by the engine
    assert other == mqtt.Packet(3, 0, b"\x00\x00")


def test_the_wire_raises_the_engines_error_on_bad_bytes() -> None:
    with pytest.raises(ProtocolError):
        cut_mqtt(b"\x30\xff\xff\xff\xff\x01", 4096)
    with pytest.raises(ProtocolError):
        mqtt_message(b"\x20\x02\x02\x00", 20)


def test_client_ids_fit_what_every_broker_must_accept() -> None:
    ident = mqtt_client_id(2**63 - 1)
    assert len(ident) <= 23 and ident.isalnum()  # MQTT-3.1.3-5
