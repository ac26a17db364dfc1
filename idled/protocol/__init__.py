"""The wire protocol, sans-IO: message types, limits, error codes, the codec, framing and the receive loop.

Modules, lowest first: `messages` (limits, ErrorCode, ProtocolError, the frozen message types), `parse`
(decoded object -> validated message), `codec` (encode; frame body -> message, with the frame-level rules),
`framing` (FrameDecoder: byte stream -> messages), `stream` (the one receive loop). Their public names are
re-exported here: import them from `idled.protocol`. Tokens (`idled.protocol.tokens`) are imported from
their own module.
"""

from idled.protocol.codec import BYE_FRAME, PING_FRAME, PONG_FRAME, QUIET_FRAME, decode_client_body, decode_server_body, encode
from idled.protocol.framing import KEEPALIVE_FRAMES, FrameDecoder
from idled.protocol.messages import (
    DEFAULT_MAX_FRAME, MAX_FRAME_LIMIT, MAX_UID_BYTES, MAX_DEVICE_BYTES, MAX_NAME_BYTES, MAX_TOKEN_CHARS, MIN_KEEPALIVE,
    MAX_KEEPALIVE, MAX_TOUCH_AGO, MAX_INT_UID, MAX_SEQ, MAX_DATA_DEPTH, ROLES, ErrorCode, ProtocolError, NEED_DATA,
    NeedData, Uid, SessionKey, Role, EventKind, Login, Ping, Msg, Bye, Attach, Touch, Detach, Marked, Subscribe, Query, Welcome, Pong,
    Event, Status, Error, Ended, Mark, ENDED_REASONS, DETACH_REASONS, PING, BYE, PONG, QUIET, ClientMessage,
    ServerMessage,
    Message,
)
from idled.protocol.messages import Replicate, Unwatch, Watch
from idled.protocol.parse import check_device, check_key, check_uid, parse_client_message, parse_server_message
from idled.protocol.stream import RECEIVE_BYTES, ByteStream, messages, receive_message

__all__ = [
    "DEFAULT_MAX_FRAME", "MAX_FRAME_LIMIT", "MAX_UID_BYTES", "MAX_DEVICE_BYTES", "MAX_NAME_BYTES", "MAX_TOKEN_CHARS",
    "MIN_KEEPALIVE", "MAX_KEEPALIVE", "MAX_TOUCH_AGO", "MAX_INT_UID", "MAX_SEQ", "MAX_DATA_DEPTH", "ROLES", "ErrorCode",
    "ProtocolError", "NEED_DATA", "NeedData", "Uid", "SessionKey", "Role", "EventKind", "Login", "Ping", "Msg", "Bye", "Attach",
    "Touch", "Detach", "Marked", "Subscribe", "Query", "Welcome", "Pong", "Event", "Status", "Error", "Ended", "Mark",
    "ENDED_REASONS", "DETACH_REASONS", "PING", "BYE",
    "PONG", "QUIET", "ClientMessage", "ServerMessage", "Message", "parse_client_message", "parse_server_message",
    "check_uid", "check_device", "check_key", "PING_FRAME", "BYE_FRAME", "PONG_FRAME", "QUIET_FRAME", "encode", "decode_client_body",
    "decode_server_body", "FrameDecoder", "KEEPALIVE_FRAMES", "RECEIVE_BYTES", "ByteStream", "messages", "receive_message",
    "Watch", "Unwatch", "Replicate",
]
