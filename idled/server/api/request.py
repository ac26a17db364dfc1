"""Requests, parsed: what a presence or kick request asks, validated before anything is touched (pure).

Every failure is an ``ApiError`` (``bad_request``, or ``too_large`` beyond ``max_batch`` uids), never another
exception: bad input only ever earns its own 4xx. Uids follow the protocol (``idled.protocol.check_uid``): a
str of 1..256 UTF-8 bytes or an int 0..2**63-1, kept as given -- in a JSON body ``42`` and ``"42"`` are two
uids; in a query string (``GET /v1/presence?uid=42``) every uid is a string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from idled.protocol import ProtocolError, Uid, check_device, check_uid
from idled.server.api.errors import ApiError

__all__ = ["MAX_NOTE_BYTES", "Kick", "json_body", "kick_request", "query_uids", "body_uids", "split_target"]

MAX_NOTE_BYTES: Final = 256  # a kick's free text, in UTF-8 bytes
MAX_QUERY_FIELDS_PER_UID: Final = 2  # parse_qsl's max_num_fields: a little room beside the uids


@dataclass(frozen=True, slots=True)
class Kick:
    """``POST /v1/kick``: end ``uid``'s sessions (all, or ``device``'s alone), with an optional ``note``."""

    uid: Uid
    device: str | None = None
    note: str | None = None


def split_target(target: bytes) -> tuple[str, str]:
    """(path, query string) of a request target (h11 gives bytes; an absolute form is not served)."""
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        raise ApiError("bad_request", "request target is not ASCII") from None
    path, _, query = text.partition("?")
    return path, query


def query_uids(query: str, max_batch: int) -> tuple[Uid, ...]:
    """The ``uid`` parameters of a query string, in order, as strings (other parameters: bad_request)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), errors="strict",
                          max_num_fields=max_batch * MAX_QUERY_FIELDS_PER_UID)
    except ValueError as exc:
        if "Max number of fields" in str(exc):
            raise ApiError("too_large", f"at most {max_batch} uids per request") from None
        raise ApiError("bad_request", "malformed query string") from None
    uids: list[Uid] = []
    for name, value in pairs:
        if name != "uid":
            raise ApiError("bad_request", f"unknown query parameter {name[:64]!r} (only uid)")
        uids.append(_uid(value))
    return _batch(uids, max_batch)


def json_body(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise ApiError("bad_request", "body is not valid JSON") from None
    if type(value) is not dict:
        raise ApiError("bad_request", "body must be a JSON object")
    return value


def body_uids(body: bytes, max_batch: int) -> tuple[Uid, ...]:
    """``{"uids": [...]}``: the uids, str or int, in order."""
    value = json_body(body)
    _only(value, ("uids",))
    uids = value.get("uids")
    if type(uids) is not list:
        raise ApiError("bad_request", 'body must be {"uids": [uid, ...]}')
    if len(uids) > max_batch:
        raise ApiError("too_large", f"at most {max_batch} uids per request, got {len(uids)}")
    return _batch([_uid(uid) for uid in uids], max_batch)


def kick_request(body: bytes) -> Kick:
    """``{"uid": U, "device": D?, "reason": TEXT?}``."""
    value = json_body(body)
    _only(value, ("uid", "device", "reason"))
    if "uid" not in value:
        raise ApiError("bad_request", "uid is required")
    uid = _uid(value["uid"])
    device = value.get("device")
    if device is not None:
        try:
            check_device(device).encode()
        except (ProtocolError, UnicodeError) as exc:
            raise ApiError("bad_request", str(exc)) from None
    note = value.get("reason")
    if note is not None and (type(note) is not str or len(note.encode("utf-8", "surrogatepass")) > MAX_NOTE_BYTES
                             or not note.isprintable() and any(ord(c) < 32 or 0xD800 <= ord(c) < 0xE000 for c in note)):
        raise ApiError("bad_request", f"reason must be a string of at most {MAX_NOTE_BYTES} UTF-8 bytes")
    return Kick(uid, device, note or None)


def _only(value: dict[str, Any], keys: tuple[str, ...]) -> None:
    unknown = set(value) - set(keys)
    if unknown:
        raise ApiError("bad_request", f"unknown field {sorted(unknown)[0][:64]!r} (fields: {', '.join(keys)})")


def _uid(value: Any) -> Uid:
    try:
        uid = check_uid(value)
        if type(uid) is str:
            uid.encode()  # a lone surrogate (JSON "\ud800") is no UTF-8: refused here, not when answering
        return uid
    except (ProtocolError, UnicodeError) as exc:
        raise ApiError("bad_request", str(exc)) from None


def _batch(uids: list[Uid], max_batch: int) -> tuple[Uid, ...]:
    if not uids:
        raise ApiError("bad_request", "no uid given")
    if len(uids) > max_batch:
        raise ApiError("too_large", f"at most {max_batch} uids per request, got {len(uids)}")
    return tuple(uids)
