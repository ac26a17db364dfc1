"""The wire protocol, sans-IO: message types, limits, error codes, the frame codec and the receive loop.

The public names of `idled.protocol.codec` and `idled.protocol.stream` are re-exported here: import them
from `idled.protocol`. Tokens (`idled.protocol.tokens`) are imported from their own module.
"""

from idled.protocol.codec import *  # noqa: F403
from idled.protocol.codec import __all__ as _codec_all
from idled.protocol.stream import RECEIVE_BYTES, ByteStream, messages, receive_message

__all__ = [*_codec_all, "RECEIVE_BYTES", "ByteStream", "messages", "receive_message"]
