"""HMAC login tokens: mint, verify, load the secret.

Theory of operation
-------------------
A token proves that whoever holds the shared secret allowed one identity to log in until a given time::

    payload = "1:u:1767225600:alice"       version : role letter (u/g/o/s/a) : expiry (unix s) : name
    token   = b64url(payload) + "." + b64url(HMAC-SHA256(secret, "idled-token-v1\\0" + b64url(payload)))

(base64url without "=" padding; a uid token is ~60 characters plus the name.) The MAC covers the *encoded*
payload text and `verify` compares the MAC *text* with `hmac.compare_digest`, so there is exactly one valid
spelling of each token: base64 decoders ignore stray characters and spare low bits, and a MAC over decoded
bytes would accept several spellings of one token. `verify` checks, in order: shape (charset, length),
MAC (before the attacker-chosen payload is parsed), version, role, name, expiry (`now >= expiry` is expired;
`now` is wall-clock unix time, passed in).

Uid tokens bind the canonical string `str(uid)`: the int uid 42 and the str uid "42" -- distinct uids on the
wire -- share one token. Whoever may be 42 may be "42"; an app that gives the two different owners must not
use both spellings.

Role ``standby`` (letter ``s``) is a standby core's replication link: the one login that may ``replicate``.
A standby mints its own from the secret it shares with the active; an observer token (``o``) never stands
in for it, nor it for an observer.

Role ``api`` (letter ``a``) is not a login role: it is the bearer token of the HTTP API
(``idled.server.api``), minted and checked the same way. A login checks its role among the protocol's ``ROLES``
and an api token's letter names none of them, so it never logs in; the API checks for ``api``, so no login
token reaches it (``verify_bearer``).

The name is the last payload field, so it may contain ":" or any other character.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from idled.protocol import MAX_TOKEN_CHARS, MAX_UID_BYTES, ROLES, ErrorCode

__all__ = [
    "ROLES", "MIN_SECRET_BYTES", "MAX_SECRET_BYTES", "MAX_TOKEN_CHARS", "DEFAULT_TTL",
    "API_ROLE", "BEARER_CHALLENGE", "BEARER_REQUIRED", "AuthError", "SecretError", "bearer_refusal", "canonical_name",
    "mint", "verify", "verify_bearer", "load_secret",
]

MIN_SECRET_BYTES: Final = 16
MAX_SECRET_BYTES: Final = 4096  # a secret file larger than this is a mistake (or /dev/zero)
DEFAULT_TTL: Final = 86400

_VERSION: Final = "1"
_CONTEXT: Final = b"idled-token-v1\x00"  # domain separation: this MAC means "idled login token"
API_ROLE: Final = "api"  # the HTTP API's bearer tokens: never a login role (see the module docstring)
_ROLE_LETTER: Final = {"uid": "u", "gateway": "g", "observer": "o", "standby": "s", API_ROLE: "a"}
_LETTER_ROLE: Final = {letter: role for role, letter in _ROLE_LETTER.items()}
# 32-byte SHA-256 MAC = 43 base64url characters without padding
_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,1000}\.[A-Za-z0-9_-]{43}")
_PAYLOAD_RE: Final = re.compile(r"([0-9]+):([a-z]):([0-9]{1,12}):(.+)", re.DOTALL)


class AuthError(Exception):
    """A token was refused. `kind` is one of malformed, forged, expired, wrong_role, wrong_name (a metric
    label); `reason` is safe to send to the client."""

    code: Final = ErrorCode.AUTH_FAILED

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


class SecretError(Exception):
    """The secret file is unusable (unreadable, too short, too long); the message says which and why."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, encoded_payload: str) -> str:
    return _b64(hmac.new(secret, _CONTEXT + encoded_payload.encode("ascii"), hashlib.sha256).digest())


def canonical_name(role: str, name: str | int) -> str:
    """The string a token binds: str(uid) for uids (42 and "42" agree), the name itself otherwise."""
    if role not in _ROLE_LETTER:
        raise ValueError(f"role must be one of {(*ROLES, API_ROLE)}, got {role!r}")
    if type(name) is int and role == "uid":
        if name < 0:
            raise ValueError("int uids are >= 0")
        return str(name)
    if type(name) is not str:
        raise ValueError(f"a {role} name must be a str{' or int' if role == 'uid' else ''}, got {type(name).__name__}")
    # The longest uid: tokens also cover gateway/observer/standby names, which the protocol bounds lower.
    if not name or len(name.encode()) > MAX_UID_BYTES:
        raise ValueError(f"a {role} name must be 1..{MAX_UID_BYTES} UTF-8 bytes")
    return name


def mint(secret: bytes, role: str, name: str | int, expires_at: float) -> str:
    """A token letting `name` log in as `role` until `expires_at` (unix seconds, rounded down)."""
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes")
    if not math.isfinite(expires_at) or expires_at < 0:
        raise ValueError("expires_at must be a finite unix time")
    bound = canonical_name(role, name)
    payload = f"{_VERSION}:{_ROLE_LETTER[role]}:{math.floor(expires_at)}:{bound}"
    encoded = _b64(payload.encode())
    token = f"{encoded}.{_mac(secret, encoded)}"
    if len(token) > MAX_TOKEN_CHARS:  # cannot happen with names <= 256 bytes; guards future edits
        raise ValueError("token would exceed the protocol's token limit")
    return token


def verify(secret: bytes, token: str, role: str, name: str | int, now: float) -> None:
    """Return if `token` lets `name` log in as `role` at wall-clock time `now`; raise AuthError otherwise."""
    expected_name = canonical_name(role, name)  # ValueError: a caller bug, not a bad token
    token_name = _check(secret, token, role, now, expected_name)
    assert token_name == expected_name


def verify_bearer(secret: bytes, token: str, role: str, now: float) -> str:
    """The name `token` was minted for, if it is a valid `role` token at `now` (any name); AuthError otherwise."""
    canonical_name(role, "-")  # ValueError for an unknown role: a caller bug
    return _check(secret, token, role, now, None)


BEARER_REQUIRED: Final = "Authorization: Bearer <api token> is required"
BEARER_CHALLENGE: Final = (("WWW-Authenticate", 'Bearer realm="idled"'),)  # the header every 401 carries


def bearer_refusal(secret: bytes, authorizations: Sequence[str], now: float) -> str | None:
    """Why a request's ``Authorization`` header values do not carry one good api token (None: they do) -- the
    HTTP API's and the metrics endpoint's one rule: exactly one header (two: a proxy in front may keep either,
    so neither is picked), the Bearer scheme, a token ``verify_bearer`` accepts for role ``api`` at ``now``."""
    if not authorizations:
        return BEARER_REQUIRED
    if len(authorizations) > 1:
        return "more than one Authorization header"
    scheme, _, token = authorizations[0].strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return "the Authorization scheme must be Bearer"
    try:
        verify_bearer(secret, token.strip(), API_ROLE, now)
    except AuthError as exc:
        return exc.reason
    return None


def _check(secret: bytes, token: str, role: str, now: float, expected_name: str | None) -> str:
    """The checks of `verify`, in order (see the module docstring); returns the token's name."""
    if type(token) is not str or len(token) > MAX_TOKEN_CHARS or not _TOKEN_RE.fullmatch(token):
        raise AuthError("malformed token", "malformed")
    encoded, mac = token.split(".")
    if not hmac.compare_digest(_mac(secret, encoded), mac):
        raise AuthError("token signature does not match", "forged")
    # Only the holder of the secret can have written what follows, so failures below are our own bugs or
    # tokens of another version; they are still reported as AuthError, never as a crash.
    try:
        match = _PAYLOAD_RE.fullmatch(_unb64(encoded).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError):
        match = None
    if match is None:
        raise AuthError("malformed token payload", "malformed")
    version, letter, expiry, token_name = match.groups()
    if version != _VERSION:
        raise AuthError(f"unsupported token version {version}", "malformed")
    token_role = _LETTER_ROLE.get(letter)
    if token_role != role:
        if API_ROLE in (role, token_role):  # an api token never logs in; a login token never reaches the API
            raise AuthError(f"token is {'an api' if token_role == API_ROLE else 'a login'} token, not an "
                            f"{'api' if role == API_ROLE else 'login'} token", "wrong_role")
        raise AuthError(f"token is for a {token_role or 'unknown'} login, not {role}", "wrong_role")
    if expected_name is not None and token_name != expected_name:
        raise AuthError(f"token was issued for another {role}", "wrong_name")
    if now >= int(expiry):
        raise AuthError("token expired", "expired")
    return token_name


def load_secret(path: str | Path) -> bytes:
    """The HMAC key: the file's bytes minus trailing newlines. SecretError if unreadable or too short/long."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SECRET_BYTES + 1)  # bounded: the path may name a device or a huge file
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_SECRET_BYTES:
        raise SecretError(f"secret file {path} is larger than {MAX_SECRET_BYTES} bytes")
    secret = raw.rstrip(b"\r\n")
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(
            f"secret in {path} is {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed "
            f"(e.g. head -c 32 /dev/urandom | base64 > {path})")
    return secret
