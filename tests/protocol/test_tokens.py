"""HMAC tokens: what verifies, what is refused and why, the secret file, and `idled token`."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from idled.protocol import tokens as auth
from idled.protocol.tokens import AuthError, SecretError, load_secret, mint, verify

SECRET = b"0123456789abcdef-test-secret"
EXP = 2_000_000_000


def kind_of(token: object, role: str = "uid", name: str | int = "alice", now: float = EXP - 1,
            secret: bytes = SECRET) -> str:
    with pytest.raises(AuthError) as info:
        verify(secret, token, role, name, now)  # type: ignore[arg-type]
    assert info.value.code == "auth_failed" and info.value.reason
    return info.value.kind


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_a_minted_token_verifies_for_its_role_and_name_until_expiry() -> None:
    for role, name in (("uid", "alice"), ("uid", 42), ("gateway", "gw-1"), ("observer", "obs"),
                       ("uid", "näme:with:colons and spaces"), ("uid", "é" * 128)):
        token = mint(SECRET, role, name, EXP)
        assert len(token) <= auth.MAX_TOKEN_CHARS
        verify(SECRET, token, role, name, now=EXP - 0.001)
        verify(SECRET, token, role, name, now=0)


def test_expired_exactly_at_the_expiry_second() -> None:
    token = mint(SECRET, "uid", "alice", EXP + 0.9)  # rounded down: never lives longer than asked
    verify(SECRET, token, "uid", "alice", now=EXP - 0.5)
    assert kind_of(token, now=EXP) == "expired"
    assert kind_of(token, now=EXP + 10_000) == "expired"


def test_int_and_str_uid_share_a_token() -> None:
    token = mint(SECRET, "uid", 42, EXP)
    verify(SECRET, token, "uid", "42", EXP - 1)
    assert token == mint(SECRET, "uid", "42", EXP)
    assert kind_of(token, name=43) == "wrong_name"


def test_forged_with_another_secret() -> None:
    token = mint(b"another-secret-of-16+bytes", "uid", "alice", EXP)
    assert kind_of(token) == "forged"


def test_wrong_role_and_wrong_name() -> None:
    gateway = mint(SECRET, "gateway", "alice", EXP)
    assert kind_of(gateway, role="uid") == "wrong_role"
    assert kind_of(gateway, role="observer") == "wrong_role"
    assert kind_of(mint(SECRET, "uid", "alice", EXP), name="bob") == "wrong_name"
    assert kind_of(mint(SECRET, "uid", "alice", EXP), name="alice ") == "wrong_name"


def test_tampered_payload_fails_the_mac() -> None:
    token = mint(SECRET, "uid", "alice", EXP)
    payload, mac = token.split(".")
    raw = base64.urlsafe_b64decode(payload + "==")
    for forged in (raw.replace(b"alice", b"admin"), raw.replace(str(EXP).encode(), b"9999999999"),
                   raw.replace(b":u:", b":g:")):
        assert forged != raw
        assert kind_of(f"{b64(forged)}.{mac}", name="admin" if b"admin" in forged else "alice") == "forged"
    # every single-character change anywhere is refused (no alternative spellings of a valid token)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i, ch in enumerate(token):
        if ch == ".":
            continue
        other = alphabet[(alphabet.index(ch) + 1) % 64]
        assert kind_of(token[:i] + other + token[i + 1 :]) in ("forged", "malformed")


def test_truncated_and_malformed_tokens() -> None:
    token = mint(SECRET, "uid", "alice", EXP)
    payload, mac = token.split(".")
    for bad in (token[:-1], token[:-10], payload, payload + ".", "." + mac, token + "A", token + ".x",
                "", ".", "a.b", "x" * 2000, payload + "." + mac + "=", payload + "!." + mac,
                payload + " ." + mac, payload + "\n." + mac):
        assert kind_of(bad) in ("malformed", "forged"), bad
    assert kind_of(token[:-1]) == "malformed"  # a MAC of the wrong length never reaches compare_digest
    assert kind_of(None) == "malformed"
    assert kind_of(12) == "malformed"


def test_a_correctly_signed_but_unparseable_payload_is_malformed_not_a_crash() -> None:
    # what a future token version, or a bug, would look like: signed with the right key
    for raw in (b"2:u:2000000000:alice", b"\xff\xfe", b"1:u:alice", b"1:x:2000000000:alice"):
        encoded = b64(raw)
        token = f"{encoded}.{auth._mac(SECRET, encoded)}"
        assert kind_of(token) in ("malformed", "wrong_role")


def test_mint_refuses_bad_input() -> None:
    for role, name in (("uid", True), ("uid", -1), ("uid", ""), ("uid", "x" * 257), ("gateway", 5),
                       ("admin", "x"), ("uid", 1.5)):
        with pytest.raises(ValueError):
            mint(SECRET, role, name, EXP)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        mint(b"short", "uid", "alice", EXP)
    with pytest.raises(ValueError):
        mint(SECRET, "uid", "alice", float("nan"))


def test_load_secret(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"s3cr3t-s3cr3t-s3cr3t\n")
    assert load_secret(path) == b"s3cr3t-s3cr3t-s3cr3t"
    path.write_bytes(b"s3cr3t-s3cr3t-s3cr3t\r\n")
    assert load_secret(str(path)) == b"s3cr3t-s3cr3t-s3cr3t"

    path.write_bytes(b"fifteen-bytes!!\n")
    with pytest.raises(SecretError, match="15 bytes; at least 16"):
        load_secret(path)
    path.write_bytes(b"x" * 5000)
    with pytest.raises(SecretError, match="larger than"):
        load_secret(path)
    with pytest.raises(SecretError, match="cannot read"):
        load_secret(tmp_path / "missing")
    with pytest.raises(SecretError, match="cannot read"):
        load_secret(tmp_path)  # a directory
