"""Messages between the load-test coordinator and its workers: 4-byte big-endian length + one msgpack value.

The same framing as the wire protocol, on a pipe (worker stdin / stdout), and read by the same code: the
protocol's `FrameDecoder` (with a parse function that keeps the decoded value as it is) under the one
receive loop, `idled.protocol.receive_message`. So the limit is checked on the header before anything is
buffered, and a message cut off by EOF is an error, exactly as on the wire. Two consequences of sharing
the wire's decoder: map keys must be strings (the plan travels as ``[index, kind, moment]`` triples, a
histogram's buckets as pairs) and arrays decode as tuples. `MAX_MESSAGE` bounds any one message (the
worker's configuration, carrying its part of the plan, is the largest).
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgpack
import trio

from idled.protocol import FrameDecoder, ProtocolError, receive_message

__all__ = ["MAX_MESSAGE", "IpcError", "pack", "send", "Reader"]

MAX_MESSAGE: Final = 256 * 1024 * 1024
_HEADER: Final = struct.Struct(">I")
_RECEIVE_BYTES: Final = 1 << 20


class IpcError(Exception):
    """The peer broke the framing (or sent more than MAX_MESSAGE)."""


def pack(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > MAX_MESSAGE:
        raise IpcError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE}")
    return _HEADER.pack(len(body)) + body


async def send(stream: trio.abc.SendStream, obj: Any) -> None:
    await stream.send_all(pack(obj))


def _as_is(obj: Any) -> Any:
    return obj


class Reader:
    """Reassembles messages from a receive stream. `recv()` returns None at EOF (between messages)."""

    __slots__ = ("_stream", "_decoder")

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._decoder = FrameDecoder(MAX_MESSAGE, parse=_as_is)

    async def recv(self) -> Any:
        try:
            return await receive_message(self._stream, self._decoder, _RECEIVE_BYTES)
        except ProtocolError as exc:
            raise IpcError(str(exc)) from None
