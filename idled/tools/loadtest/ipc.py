"""Messages between the load-test coordinator and its workers: 4-byte big-endian length + one msgpack value.

The same framing as the wire protocol, on a pipe (worker stdin / stdout). Messages are small maps except the
worker's configuration, which carries the worker's part of the plan; `MAX_MESSAGE` bounds any one of them.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgpack
import trio

__all__ = ["MAX_MESSAGE", "IpcError", "pack", "send", "Reader"]

MAX_MESSAGE: Final = 256 * 1024 * 1024
_HEADER: Final = struct.Struct(">I")


class IpcError(Exception):
    """The peer broke the framing (or sent more than MAX_MESSAGE)."""


def pack(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > MAX_MESSAGE:
        raise IpcError(f"message of {len(body)} bytes exceeds {MAX_MESSAGE}")
    return _HEADER.pack(len(body)) + body


async def send(stream: trio.abc.SendStream, obj: Any) -> None:
    await stream.send_all(pack(obj))


class Reader:
    """Reassembles messages from a receive stream. `recv()` returns None at EOF (between messages)."""

    __slots__ = ("_stream", "_buf")

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buf = bytearray()

    def _take(self) -> Any:
        if len(self._buf) < 4:
            return _NONE
        (n,) = _HEADER.unpack_from(self._buf, 0)
        if n > MAX_MESSAGE:
            raise IpcError(f"message of {n} bytes exceeds {MAX_MESSAGE}")
        if len(self._buf) < 4 + n:
            return _NONE
        body = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        return msgpack.unpackb(body, raw=False, strict_map_key=False)

    async def recv(self) -> Any:
        while True:
            obj = self._take()
            if obj is not _NONE:
                return obj
            chunk = await self._stream.receive_some(1 << 20)
            if not chunk:
                if self._buf:
                    raise IpcError(f"EOF inside a message ({len(self._buf)} bytes pending)")
                return None
            self._buf += chunk


_NONE: Final = object()
