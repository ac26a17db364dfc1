"""A standby's ``replicate`` request with its optional check of the standby's last record (sans-IO).

``{"op":"replicate","from":SEQ,"last":[SEQ-1,CRC]}``: ``last`` names the standby's last record, its seq (one
below ``from``) and the CRC-32 of its bytes as its segment holds them, so that the active core can tell a
standby that merely lags from one whose log went its own way (``idled.protocol.replication`` has the rest of
the replication link's frames; it imports the client parser, which imports this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from idled.protocol.messages import MAX_SEQ, ErrorCode, ProtocolError, Replicate

__all__ = ["MAX_CRC", "ReplicateChecked", "bad_message", "checked_seq", "parse_replicate"]

MAX_CRC: Final = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class ReplicateChecked(Replicate):
    """``replicate`` with ``last``: (seq, crc) of the standby's last record; seq is always ``from_seq - 1``.
    A subclass so that the observer role hands it on as any ``replicate`` (a field of `messages.Replicate`
    once that module takes it)."""

    last: tuple[int, int]


def bad_message(reason: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, reason)


def checked_seq(value: Any, what: str) -> int:
    if type(value) is int and 0 <= value <= MAX_SEQ:
        return value
    raise bad_message(f"{what} must be an int in 0..2**63-1")


_REPLICATE_KEYS: Final = frozenset({"op", "from", "last"})


def parse_replicate(obj: dict[str, Any]) -> Replicate:
    """A standby's ``replicate`` (called by the client parser): `ReplicateChecked` when it carries ``last``."""
    for key in obj:
        if key not in _REPLICATE_KEYS:
            raise bad_message(f"unknown field {key!r:.40} in replicate")
    from_seq = checked_seq(obj.get("from"), "from")
    last = obj.get("last")
    if last is None:
        return Replicate(from_seq)
    if type(last) is not tuple or len(last) != 2:
        raise bad_message("last must be [seq, crc]")
    seq, crc = checked_seq(last[0], "last's seq"), last[1]
    if seq != from_seq - 1 or seq < 1:
        raise bad_message("last must name the record just below from (from >= 2)")
    if type(crc) is not int or not 0 <= crc <= MAX_CRC:
        raise bad_message("last's crc must be an int in 0..2**32-1")
    return ReplicateChecked(from_seq, (seq, crc))
