"""The one receive loop: protocol messages from a byte stream, for every peer of the wire protocol.

Theory of operation
-------------------
`FrameDecoder` is sans-IO (bytes in, messages out); this module adds the only loop that reads: ask the
decoder for the next message, and only when it says NEED_DATA read once more from the stream. The server's
connection handlers, the load generator, the test peers and the client library all read through it, so end of
stream inside a frame, oversize frames and decode errors are handled the same way everywhere.

It does not import trio: a stream is anything with ``async receive_some(max_bytes) -> bytes`` (a
``trio.abc.ReceiveStream``, or an adapter over an asyncio ``StreamReader``), so the same loop serves trio and
asyncio code.

`receive_message` is the per-packet path (one coroutine call per message, no allocation beyond the decoder's);
`messages` is the same loop as an async iterator, for code that reads until the peer is done.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final, Protocol

from idled.protocol.framing import FrameDecoder
from idled.protocol.messages import NEED_DATA, ErrorCode, ProtocolError

__all__ = ["RECEIVE_BYTES", "ByteStream", "receive_message", "messages"]

RECEIVE_BYTES: Final = 16384  # one read: a user sends ~15-byte pings, a gateway large touch batches


class ByteStream(Protocol):
    async def receive_some(self, max_bytes: int | None = None, /) -> bytes | bytearray: ...


async def receive_message(stream: ByteStream, decoder: FrameDecoder, receive_bytes: int = RECEIVE_BYTES) -> Any:
    """The next message, reading from ``stream`` as needed; None at a clean end of stream.

    Raises ProtocolError for a bad frame, and for an end of stream inside a frame (the peer may still read
    the error frame the caller sends). Stream errors (broken, closed) propagate as the stream raises them.
    """
    while True:
        message = decoder.next_event()
        if message is not NEED_DATA:
            return message
        data = await stream.receive_some(receive_bytes)
        if not data:
            if decoder.buffered:
                raise ProtocolError(
                    ErrorCode.BAD_FRAME, f"end of stream inside a frame ({decoder.buffered} bytes pending)"
                )
            return None
        decoder.receive_data(data)


async def messages(
    stream: ByteStream, decoder: FrameDecoder, receive_bytes: int = RECEIVE_BYTES
) -> AsyncIterator[Any]:
    """Every message until a clean end of stream (same errors as `receive_message`)."""
    while (message := await receive_message(stream, decoder, receive_bytes)) is not None:
        yield message
