"""The ``standby`` role on the wire: its login and welcome, what its login may carry, its token letter ``s``."""

from __future__ import annotations

import base64
import math
from typing import Any

import msgpack
import pytest

from idled.protocol import (
    NEED_DATA, ROLES, ErrorCode, FrameDecoder, Login, ProtocolError, Welcome, encode, parse_client_message,
    parse_server_message,
)
from idled.protocol.replicate import ReplicateChecked
from idled.protocol.replication import encode_replicate, parse_replication_message
from idled.protocol.tokens import AuthError, mint, verify

SECRET = b"0123456789abcdef-test-secret"
EXP = 2_000_000_000


def packed(obj: Any) -> bytes:
    body = msgpack.packb(obj)
    return len(body).to_bytes(4, "big") + body


def decode(data: bytes, parse: Any = parse_client_message) -> list[Any]:
    """Fed one byte at a time, as a peer's bytes may arrive."""
    decoder = FrameDecoder(1 << 16, parse)
    out = []
    for i in range(len(data)):
        decoder.receive_data(data[i:i + 1])
        while (message := decoder.next_event()) is not NEED_DATA:
            out.append(message)
    return out


def test_standby_is_a_login_role() -> None:
    assert "standby" in ROLES
    login = Login("standby", "standby-b", "tok")
    assert msgpack.unpackb(encode(login)[4:]) == {"op": "login", "standby": "standby-b", "token": "tok"}
    # What a standby sends on connecting: its login and replicate in one write.
    data = encode(login) + encode_replicate(8, (7, 0xDEADBEEF))
    assert decode(data) == [login, ReplicateChecked(8, (7, 0xDEADBEEF))]


def test_standby_welcome_parses_on_both_client_sides() -> None:
    welcome = Welcome("standby", "standby-b")
    assert msgpack.unpackb(encode(welcome)[4:]) == {"op": "welcome", "standby": "standby-b"}
    assert decode(encode(welcome), parse_server_message) == [welcome]
    assert decode(encode(welcome), parse_replication_message) == [welcome]  # the standby link's parser


@pytest.mark.parametrize("obj", [
    {"op": "login", "standby": 5},
    {"op": "login", "standby": ""},
    {"op": "login", "standby": "s" * 129},
    {"op": "login", "standby": "s", "observer": "s"},  # one identity only
    {"op": "login", "standby": "s", "keepalive": 30},
    {"op": "login", "standby": "s", "device": "d"},
    {"op": "login", "standby": "s", "ended": True},
    {"op": "login", "standby": "s", "marks": True},
    {"op": "login", "standby": "s", "token": 5},
    {"op": "login", "standby": "s", "keepalive": math.nan},
])
def test_bad_standby_logins_are_bad_message(obj: dict[str, Any]) -> None:
    decoder = FrameDecoder(1 << 16, parse_client_message)
    decoder.receive_data(packed(obj))
    with pytest.raises(ProtocolError) as info:
        decoder.next_event()
    assert info.value.code == ErrorCode.BAD_MESSAGE and len(info.value.reason) < 200


def test_the_identity_error_names_every_role() -> None:
    decoder = FrameDecoder(1 << 16, parse_client_message)
    decoder.receive_data(packed({"op": "login", "token": "t"}))
    with pytest.raises(ProtocolError, match="uid, gateway, observer, standby"):
        decoder.next_event()


def kind_of(token: str, role: str, name: str = "standby-b") -> str:
    with pytest.raises(AuthError) as info:
        verify(SECRET, token, role, name, EXP - 1)
    return info.value.kind


def test_standby_tokens_carry_their_own_letter_and_stand_in_for_no_other_role() -> None:
    token = mint(SECRET, "standby", "standby-b", EXP)
    payload = base64.urlsafe_b64decode(token.split(".")[0] + "==").decode()
    assert payload == f"1:s:{EXP}:standby-b"
    verify(SECRET, token, "standby", "standby-b", EXP - 1)
    for role in ("observer", "gateway", "uid"):
        assert kind_of(token, role) == "wrong_role"  # a standby token is no observer's
        assert kind_of(mint(SECRET, role, "standby-b", EXP), "standby") == "wrong_role"  # nor the reverse
    assert kind_of(mint(SECRET, "api", "standby-b", EXP), "standby") == "wrong_role"
    assert kind_of(token, "standby", "standby-c") == "wrong_name"
    assert kind_of(mint(SECRET, "standby", "standby-b", 100), "standby") == "expired"
    assert kind_of(mint(b"another secret of 16+ bytes", "standby", "standby-b", EXP), "standby") == "forged"
