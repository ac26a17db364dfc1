"""Signatures: what the hook signs is what the stock Standard Webhooks library computes, and the secret's
forms (whsec_<base64>, bare base64) are read as that library reads them; anything else is refused."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from idled.hook.sign import parse_secret, sign, webhook_headers

KEY = b"0123456789abcdef0123456789abcdef"
WHSEC = "whsec_" + base64.b64encode(KEY).decode()
BODY = b'{"first_seq":1,"last_seq":2,"events":[{"uid":"\xc3\xa9"}]}'


def test_the_signature_is_the_stock_librarys() -> None:
    theirs = Webhook(WHSEC).sign("1-2", datetime.fromtimestamp(1_700_000_000, tz=UTC), BODY.decode())
    assert sign(KEY, "1-2", 1_700_000_000, BODY) == theirs


def test_the_headers_of_one_attempt() -> None:
    headers = webhook_headers(KEY, "1-2", 1_700_000_000, BODY)
    assert headers == {"webhook-id": "1-2", "webhook-timestamp": "1700000000",
                       "webhook-signature": sign(KEY, "1-2", 1_700_000_000, BODY)}
    assert "webhook-signature" not in webhook_headers(None, "1-2", 1, BODY)  # --insecure-unsigned


@pytest.mark.parametrize("text", [WHSEC.encode(), WHSEC.encode() + b"\n", base64.b64encode(KEY) + b"\r\n"])
def test_the_secret_forms_the_stock_libraries_take(text: bytes) -> None:
    assert parse_secret(text) == KEY == Webhook(text.decode().strip())._whsecret


@pytest.mark.parametrize("text, message", [
    (b"whsec_not base64!", "not a Standard Webhooks secret"),
    (b"hook-test-secret-0123456789abcdef", "not a Standard Webhooks secret"),
    (b"whsec_" + base64.b64encode(b"x" * 16), "decodes to 16 bytes"),
    (b"whsec_" + base64.b64encode(b"x" * 65), "decodes to 65 bytes"),
])
def test_what_is_not_a_secret(text: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_secret(text)
    assert "head -c 32 /dev/urandom" in str(info.value)
