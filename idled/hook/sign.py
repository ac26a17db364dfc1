"""Webhook signatures: Standard Webhooks (https://www.standardwebhooks.com), so a receiver verifies with a
stock library (PyPI and npm ``standardwebhooks``, Svix's libraries in Go, Java, Ruby, ...). Pure: time is an
argument.

Theory of operation
-------------------
Each attempt of a delivery carries three headers:

    webhook-id: 41-42                       the batch's first and last seq: the same on every retry
    webhook-timestamp: 1795640000           the attempt's wall clock, unix seconds
    webhook-signature: v1,<base64 HMAC-SHA256(key, "41-42.1795640000." + raw body)>

The id binds the signature to one delivery (a receiver dedupes on it), the timestamp lets a receiver refuse a
captured request replayed later (the stock libraries allow 5 minutes), and the HMAC covers both and the exact
body bytes. The key is the secret's bytes: the operator's secret file holds ``whsec_<base64>`` -- the form
the stock libraries take as a string -- or the bare base64 (they decode that too); it decodes to 24..64
bytes (the specification's range). The same text handed to the receiver's library gives the same key.

Why not a scheme of our own (``Idled-Signature: t=..,v1=hex`` until 0.1): every receiver had to hand-write
its check; that header is gone, not kept beside these (nothing was released with it, and a second scheme is
one more thing a receiver can get wrong).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Final

__all__ = ["ID_HEADER", "TIMESTAMP_HEADER", "SIGNATURE_HEADER", "SECRET_PREFIX", "MIN_KEY_BYTES", "MAX_KEY_BYTES",
           "GENERATE", "parse_secret", "sign", "webhook_headers"]

ID_HEADER: Final = "webhook-id"
TIMESTAMP_HEADER: Final = "webhook-timestamp"
SIGNATURE_HEADER: Final = "webhook-signature"
SECRET_PREFIX: Final = "whsec_"
MIN_KEY_BYTES: Final = 24
MAX_KEY_BYTES: Final = 64
GENERATE: Final = "printf 'whsec_%s\\n' \"$(head -c 32 /dev/urandom | base64)\""


def parse_secret(text: bytes) -> bytes:
    """The HMAC key from a secret file's text: ``whsec_<base64>`` or bare base64, decoding to 24..64 bytes.
    ValueError says what is wrong and how to make a good one."""
    value = text.strip()
    if value.startswith(SECRET_PREFIX.encode()):
        value = value[len(SECRET_PREFIX):]
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"not a Standard Webhooks secret (whsec_<base64>); make one with {GENERATE}") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"the secret decodes to {len(key)} bytes; {MIN_KEY_BYTES} to {MAX_KEY_BYTES} are needed "
                         f"(make one with {GENERATE})")
    return key


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256(key, "<msg_id>.<timestamp>." + body)>``."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def webhook_headers(key: bytes | None, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one attempt (no signature when ``key`` is None: ``--insecure-unsigned``)."""
    headers = {ID_HEADER: msg_id, TIMESTAMP_HEADER: str(timestamp)}
    if key is not None:
        headers[SIGNATURE_HEADER] = sign(key, msg_id, timestamp, body)
    return headers
