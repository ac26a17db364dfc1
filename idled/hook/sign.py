"""Webhook signatures: what `idled hook` puts in ``Idled-Signature``, and what a receiver checks.

Theory of operation
-------------------
Stripe's scheme. For each request (each attempt: the timestamp is the attempt's) the hook computes

    v1 = hex(HMAC-SHA256(secret, f"{t}.".encode() + body))

over the exact body bytes and sends ``Idled-Signature: t=<t>,v1=<v1>`` (and ``Idled-Timestamp: <t>``).
Binding the timestamp into the MAC lets a receiver refuse a captured request replayed later: `verify_signature`
accepts only when ``|now - t| <= tolerance`` (300 s by default) and the MAC matches, compared in constant time.
Several ``v1=`` entries may appear (a receiver rotating secrets would check each); unknown schemes are
ignored, so a later ``v2`` can be added without breaking receivers. Pure: time is an argument.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "DELIVERY_HEADER", "SignatureError", "sign", "signature_header",
           "verify_signature", "DEFAULT_TOLERANCE"]

SIGNATURE_HEADER: Final = "Idled-Signature"
TIMESTAMP_HEADER: Final = "Idled-Timestamp"
DELIVERY_HEADER: Final = "Idled-Delivery"
DEFAULT_TOLERANCE: Final = 300.0
_MAX_HEADER: Final = 4096  # a receiver parses no more than this (a header is ~80 bytes)


class SignatureError(ValueError):
    """The signature does not verify. ``code``: ``malformed`` (no t= or v1=), ``expired`` (timestamp outside
    the tolerance) or ``mismatch`` (no v1 matches the body)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code, self.reason = code, reason


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``"<timestamp>." + body`` under ``secret``."""
    return hmac.new(secret, b"%d." % timestamp + body, hashlib.sha256).hexdigest()


def signature_header(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``Idled-Signature`` value: ``t=<timestamp>,v1=<hex>``."""
    return f"t={timestamp},v1={sign(secret, timestamp, body)}"


def verify_signature(secret: bytes, header: str, body: bytes, now: float,
                     tolerance: float = DEFAULT_TOLERANCE) -> int:
    """Check an ``Idled-Signature`` header against the raw request body; return its timestamp, or raise
    `SignatureError`. ``now``: the receiver's wall clock (``time.time()``)."""
    if len(header) > _MAX_HEADER:
        raise SignatureError("malformed", "header too long")
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureError("malformed", "expected t=<unix seconds>,v1=<hex hmac>")
    if abs(now - timestamp) > tolerance:
        raise SignatureError("expired", f"timestamp {timestamp} is {now - timestamp:+.0f} s from now "
                                        f"(tolerance {tolerance:g} s)")
    expected = sign(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, candidate) for candidate in candidates):
        raise SignatureError("mismatch", "no v1 signature matches the body")
    return timestamp
