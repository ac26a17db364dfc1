"""Signatures: what the hook sends verifies, and each way it must not does not."""

from __future__ import annotations

import pytest

from idled.hook.sign import SignatureError, signature_header, verify_signature

SECRET = b"0123456789abcdef0123"
BODY = b'{"first_seq":1,"last_seq":1,"events":[]}'


def test_a_header_verifies_and_returns_its_timestamp() -> None:
    header = signature_header(SECRET, 1_700_000_000, BODY)
    assert header.startswith("t=1700000000,v1=") and len(header.split("v1=")[1]) == 64
    assert verify_signature(SECRET, header, BODY, now=1_700_000_100) == 1_700_000_000


@pytest.mark.parametrize("header, body, now, code", [
    (signature_header(SECRET, 1000, BODY), BODY + b" ", 1000, "mismatch"),
    (signature_header(b"another-secret-0123", 1000, BODY), BODY, 1000, "mismatch"),
    (signature_header(SECRET, 1000, BODY), BODY, 1301, "expired"),
    (signature_header(SECRET, 1000, BODY), BODY, 699, "expired"),
    ("v1=abc", BODY, 1000, "malformed"),
    ("t=1000", BODY, 1000, "malformed"),
    ("t=x" + "," * 5000, BODY, 1000, "malformed"),
])
def test_what_does_not_verify(header: str, body: bytes, now: float, code: str) -> None:
    with pytest.raises(SignatureError) as info:
        verify_signature(SECRET, header, body, now)
    assert info.value.code == code


def test_any_v1_may_match_and_unknown_schemes_are_ignored() -> None:
    good = signature_header(SECRET, 1000, BODY).split(",")[1]
    assert verify_signature(SECRET, f"t=1000,v0=zz,v1={'0' * 64},{good}", BODY, 1000) == 1000
