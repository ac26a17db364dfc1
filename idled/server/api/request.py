"""Requests, parsed: what a presence or kick request asks, validated before anything is touched (pure).

Every failure is an ``ApiError`` (``bad_request``, or ``too_large`` beyond ``max_batch`` uids), never another
exception: bad input only ever earns its own 4xx, and its message names the field and the rule in the API's
terms (``uids[2] must be ...``), never an internal name. Uids follow the protocol (``idled.protocol.check_uid``):
a str of 1..256 UTF-8 bytes or an int 0..2**63-1, kept as given -- in a JSON body ``42`` and ``"42"`` are two
uids; in a query string (``GET /v1/presence?uid=42``) every uid is a string.

**Numbers.** JSON has one number type, and JSON Schema (the OpenAPI document's) counts ``8605.0`` and ``8.605e3``
as the integer 8605. So does the API: a body's numbers are parsed exactly (``decimal.Decimal``, not a float,
which would turn ``9007199254740993.0`` into another uid), and an integral one in range is that int uid. ``NaN``
and ``Infinity`` (Python's extensions to JSON) are not JSON: ``bad_request``.

**Query parameters.** One rule on every route: a parameter the route does not take is ``400``, naming it
(``query_parameters``): a misspelt ``?uids=a`` must not be answered as if it were a query for nobody.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final
from urllib.parse import parse_qsl

from idled.protocol import MAX_DEVICE_BYTES, MAX_INT_UID, MAX_UID_BYTES, Uid
from idled.server.api.errors import ApiError

__all__ = ["MAX_NOTE_BYTES", "NOTE_PATTERN", "Kick", "body_uids", "json_body", "kick_request", "no_query",
           "query_parameters", "query_uids", "split_target"]

MAX_NOTE_BYTES: Final = 256  # a kick's free text, in UTF-8 bytes
# A kick's text goes into the event log, the kicked client's error message and the daemon's log: no control
# characters (C0, DEL, C1), which would let it forge log lines or drive a terminal that shows them. The
# OpenAPI document carries the same rule as this pattern.
NOTE_PATTERN: Final = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
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
        raise ApiError("bad_request", "the request target is not ASCII (percent-encode it)") from None
    path, _, query = text.partition("?")
    return path, query


def query_parameters(query: str, takes: tuple[str, ...], max_fields: int, route: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of a query string, in order: a name not in ``takes`` is ``bad_request`` naming it,
    more than ``max_fields`` pairs ``too_large`` (parsing stops there)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), errors="strict",
                          max_num_fields=max_fields)
    except UnicodeDecodeError:
        raise ApiError("bad_request", "the query string is not UTF-8 once percent-decoded") from None
    except ValueError as exc:
        if "Max number of fields" in str(exc):
            raise ApiError("too_large", f"more than {max_fields} query parameters") from None
        raise ApiError("bad_request", "malformed query string: expected name=value pairs joined by &") from None
    for name, _ in pairs:
        if name not in takes:
            takes_text = f"takes only {', '.join(takes)}" if takes else "takes no query parameters"
            raise ApiError("bad_request", f"unknown query parameter {name[:64]!r}: {route} {takes_text}")
    return pairs


def no_query(query: str, route: str) -> None:
    """A route that takes no query parameters: any is ``bad_request`` (the one rule, module docstring)."""
    if query:
        query_parameters(query, (), 1, route)


def query_uids(query: str, max_batch: int) -> tuple[Uid, ...]:
    """The ``uid`` parameters of a query string, in order, as strings (other parameters: bad_request)."""
    pairs = query_parameters(query, ("uid",), max_batch * MAX_QUERY_FIELDS_PER_UID, "GET /v1/presence")
    if len(pairs) > max_batch:
        raise ApiError("too_large", f"at most {max_batch} uids per request, got {len(pairs)}")
    return _batch([_uid(value, f"uid parameter {i}") for i, (_, value) in enumerate(pairs, 1)], max_batch)


def json_body(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (numbers with a fraction or exponent as exact ``Decimal``)."""
    try:
        value = json.loads(body, parse_float=Decimal, parse_constant=_not_json)
    except UnicodeDecodeError:
        raise ApiError("bad_request", "the body is not UTF-8") from None
    except (ValueError, RecursionError):
        raise ApiError("bad_request", "the body is not valid JSON") from None
    if type(value) is not dict:
        raise ApiError("bad_request", f"the body must be a JSON object, got {_json_type(value)}")
    return value


def body_uids(body: bytes, max_batch: int) -> tuple[Uid, ...]:
    """``{"uids": [...]}``: the uids, str or int, in order."""
    value = json_body(body)
    _only(value, ("uids",))
    uids = value.get("uids")
    if type(uids) is not list:
        raise ApiError("bad_request", 'the body must be {"uids": [uid, ...]}: '
                       + ("uids is missing" if uids is None and "uids" not in value else f"uids is {_json_type(uids)}"))
    if len(uids) > max_batch:
        raise ApiError("too_large", f"at most {max_batch} uids per request, got {len(uids)}")
    return _batch([_uid(uid, f"uids[{i}]") for i, uid in enumerate(uids)], max_batch)


def kick_request(body: bytes) -> Kick:
    """``{"uid": U, "device": D?, "reason": TEXT?}``."""
    value = json_body(body)
    _only(value, ("uid", "device", "reason"))
    if "uid" not in value:
        raise ApiError("bad_request", "uid is required")
    uid = _uid(value["uid"], "uid")
    device = value.get("device")
    if device is not None:
        device = _text(device, "device", 1, MAX_DEVICE_BYTES)
    note = value.get("reason")
    if note is not None:
        note = _text(note, "reason", 0, MAX_NOTE_BYTES)
        control = next((c for c in note if _is_control(c)), None)
        if control is not None:
            raise ApiError("bad_request", f"reason must not contain control characters (U+0000-U+001F, U+007F-U+009F)"
                           f": found U+{ord(control):04X} at character {note.index(control) + 1}")
    return Kick(uid, device, note or None)


def _only(value: dict[str, Any], keys: tuple[str, ...]) -> None:
    unknown = set(value) - set(keys)
    if unknown:
        raise ApiError("bad_request", f"unknown field {sorted(unknown)[0][:64]!r} (fields: {', '.join(keys)})")


def _uid(value: Any, where: str) -> Uid:
    """A uid of a request (the protocol's rule, ``check_uid``), with the message in the request's terms."""
    kind = type(value)
    if kind is int and 0 <= value <= MAX_INT_UID:
        return int(value)
    if kind is Decimal and value.is_finite() and 0 <= value <= MAX_INT_UID and value == value.to_integral_value():
        return int(value)  # 8605.0 is the integer 8605 (module docstring); the range first: int(1e999999) is huge
    if kind is int or kind is Decimal:
        raise ApiError("bad_request", f"{where} must be a string or an integer 0 to {MAX_INT_UID} (2**63-1), "
                       f"got {_json_type(value)}")
    if kind is not str:
        raise ApiError("bad_request", f"{where} must be a string or an integer, got {_json_type(value)}")
    return _text(value, where, 1, MAX_UID_BYTES)


def _text(value: Any, where: str, least: int, most: int) -> str:
    """A str of ``least``..``most`` UTF-8 bytes (a lone surrogate, JSON's ``"\\ud800"``, is no UTF-8)."""
    if type(value) is not str:
        raise ApiError("bad_request", f"{where} must be a string, got {_json_type(value)}")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ApiError("bad_request", f"{where} is not valid Unicode text (it holds an unpaired surrogate)") from None
    if not least <= size <= most:
        raise ApiError("bad_request", f"{where} must be {least} to {most} UTF-8 bytes long, got {size}")
    return value


def _is_control(c: str) -> bool:
    return unicodedata.category(c) == "Cc"  # exactly U+0000-U+001F and U+007F-U+009F (NOTE_PATTERN)


def _json_type(value: Any) -> str:
    """What a JSON value is, in JSON's words (a number as written: short, and the client's own)."""
    if value is None:
        return "null"
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is int or type(value) is Decimal:
        text = str(value)
        return f"the number {text if len(text) <= 40 else text[:40] + '...'}"
    names: dict[type, str] = {str: "a string", list: "an array", dict: "an object"}
    return names.get(type(value), "another type")


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _batch(uids: list[Uid], max_batch: int) -> tuple[Uid, ...]:
    if not uids:
        raise ApiError("bad_request", "no uid given")
    if len(uids) > max_batch:
        raise ApiError("too_large", f"at most {max_batch} uids per request, got {len(uids)}")
    return tuple(uids)
