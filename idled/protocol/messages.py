"""The wire protocol's vocabulary: limits, error codes, `ProtocolError`, and the frozen message types.

Everything here is plain data: no msgpack, no I/O. `codec` turns these messages into bytes and back,
`parse` validates decoded maps into them, `framing` cuts a byte stream into frames.

Every message is a frozen slots dataclass (immutable, ~56 bytes, hashable when its fields are). The
parameterless ones (`Ping`, `Bye`, `Pong`) are parsed as the shared `PING`, `BYE`, `PONG` instances, so
`message is PING` is a valid test.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

__all__ = [
    "DEFAULT_MAX_FRAME", "MAX_FRAME_LIMIT", "MAX_UID_BYTES", "MAX_DEVICE_BYTES", "MAX_NAME_BYTES", "MAX_TOKEN_CHARS",
    "MIN_KEEPALIVE", "MAX_KEEPALIVE", "MAX_TOUCH_AGO", "MAX_INT_UID", "MAX_SEQ", "MAX_DATA_DEPTH", "ROLES",
    "ErrorCode", "ProtocolError", "NEED_DATA", "NeedData", "Uid", "SessionKey", "Role", "EventKind",
    "Login", "Ping", "Msg", "Bye", "Attach", "Touch", "Detach", "Marked", "Subscribe", "Query",
    "Watch", "Unwatch", "Replicate",
    "Welcome", "Pong", "Event", "Status", "Error", "Ended", "Mark", "ENDED_REASONS", "DETACH_REASONS",
    "PING", "BYE", "PONG", "QUIET", "ClientMessage", "ServerMessage", "Message",
]

# ---------------------------------------------------------------------------------------------- limits

DEFAULT_MAX_FRAME: Final = 4096  # bytes of msgpack body (the 4-byte prefix is not counted)
MAX_FRAME_LIMIT: Final = 0xFFFF_FFFF  # what a 4-byte prefix can express
MAX_UID_BYTES: Final = 256  # string uids: 1..256 bytes of UTF-8
MAX_DEVICE_BYTES: Final = 64  # a user login's device: a str of 1..64 bytes of UTF-8
MAX_NAME_BYTES: Final = 128  # gateway / observer / standby names: 1..128 bytes of UTF-8
MAX_TOKEN_CHARS: Final = 1024
# keepalive k is accepted for 1 <= k <= 86400 seconds. The server ticks every second by default: a keepalive
# below that cannot be honoured, and a tiny one (1e-300) would mean a timeout of ~0.
MIN_KEEPALIVE: Final = 1.0  # seconds
MAX_KEEPALIVE: Final = 86400.0  # seconds
# A touch's `ago` is accepted up to this; the server applies at most half a tick of it (a later stamp is never
# an early offline), so anything larger is a gateway's mistake, not a clock to trust.
MAX_TOUCH_AGO: Final = 60.0  # seconds
MAX_INT_UID: Final = 2**63 - 1  # int uids: 0..2**63-1 (fits a signed 64-bit column everywhere)
MAX_SEQ: Final = 2**63 - 1
# `msg` data may nest at most this deep (a scalar is depth 0). msgpack alone would allow 1024 levels, which
# then breaks repr(), == and json in Python (recursion limit ~1000) wherever the data travels next.
MAX_DATA_DEPTH: Final = 32

Uid: TypeAlias = str | int
# A session key: a plain uid (a login without device: exactly the one session a user had before devices)
# or the tuple (uid, device). On the wire (gateway frames' `uids`, `ended`) the tuple is a 2-array, which
# msgpack decodes as a tuple: the decoded element IS the key.
SessionKey: TypeAlias = Uid | tuple[Uid, str]
# "standby": a standby core's replication link, the one role that may send `replicate` (and nothing else).
Role: TypeAlias = Literal["uid", "gateway", "observer", "standby"]
EventKind: TypeAlias = Literal["online", "offline"]
ROLES: Final[tuple[Role, ...]] = ("uid", "gateway", "observer", "standby")


class ErrorCode(enum.StrEnum):
    """Machine-readable codes carried by `ProtocolError.code` and by `error` frames (plain strings on the wire)."""

    BAD_FRAME = "bad_frame"  # body is not one well-formed msgpack value of the accepted subset
    TOO_LARGE = "too_large"  # length prefix exceeds the connection's max_frame
    BAD_MESSAGE = "bad_message"  # valid msgpack, but not a valid message (shape, op, field type or range)
    AUTH_FAILED = "auth_failed"  # token missing, malformed, forged, expired, or for another role/name
    LOGIN_TIMEOUT = "login_timeout"  # no login within the server's login deadline
    NOT_LOGGED_IN = "not_logged_in"  # a message other than login before login
    NOT_ALLOWED = "not_allowed"  # op not valid for this connection's role or state (e.g. attach from a user)
    IDLE_TIMEOUT = "idle_timeout"  # the connection was silent past its timeout
    KICKED = "kicked"  # a newer login for the same identity replaced this connection
    BUSY = "busy"  # the server refuses the connection or request for lack of capacity
    SERVER_SHUTDOWN = "server_shutdown"  # the server is stopping
    GONE = "gone"  # the requested thing no longer exists (server-defined, e.g. events pruned before `from`)
    NOT_LEADER = "not_leader"  # this core does not lead: log in to the leader (the frame's `leader`, when known)
    TLS_REQUIRED = "tls_required"  # this port speaks TLS and the client began in plain text: connect with TLS
    UNAVAILABLE = "unavailable"  # the server cannot take new work now (its event log's disk is full); retry later


class ProtocolError(Exception):
    """The peer broke the protocol. `code` is an ErrorCode, `reason` a short human-readable explanation;
    `leader` ("HOST:PORT", only with `not_leader`) the core to log in to instead, carried by the error frame."""

    def __init__(self, code: ErrorCode, reason: str, *, leader: str | None = None) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason
        self.leader = leader

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class NeedData:
    """Type of the `NEED_DATA` sentinel: no complete frame is buffered yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()

# ------------------------------------------------------------------------------------ client -> server


@dataclass(frozen=True, slots=True)
class Login:
    """`{"op":"login", <role>: name, "token"?: str, "keepalive"?: seconds, "ended"?: bool, "marks"?: bool,
    "device"?: str}`; keepalive and device only for role "uid"; `ended` and `marks` only for role "gateway":
    `ended` asks the server for `Ended` notices, `marks` for `Mark` requests the gateway answers with `Marked`
    (both opt-in, so gateways that do not know the messages never receive them). `device` (1..64 UTF-8
    bytes) makes the session key `(uid, device)`: one user may then hold several sessions, one per device.
    Role "standby" is a standby core's replication link: its only request is `Replicate`."""

    role: Role
    name: Uid  # a uid (str or int) for role "uid", else a str name
    token: str | None = None
    keepalive: float | None = None
    ended: bool = False
    marks: bool = False
    device: str | None = None

    @property
    def key(self) -> SessionKey:
        """The session key this login claims: the uid, or (uid, device)."""
        return self.name if self.device is None else (self.name, self.device)


@dataclass(frozen=True, slots=True)
class Ping:
    """`{"op":"ping"}`: keepalive. Parsed as the shared `PING` instance."""


@dataclass(frozen=True, slots=True)
class Msg:
    """`{"op":"msg","data":ANY}`: application payload (counts as activity). Arrays arrive as tuples."""

    data: Any = None


@dataclass(frozen=True, slots=True)
class Bye:
    """`{"op":"bye"}`: orderly logout. Parsed as the shared `BYE` instance."""


@dataclass(frozen=True, slots=True)
class Attach:
    """Gateway: these sessions are now connected through me. `keepalive` applies to all of them. Each element
    of `uids` is a session key: a uid, or a 2-array [uid, device] (decoded as the tuple (uid, device))."""

    uids: tuple[SessionKey, ...]
    keepalive: float | None = None


@dataclass(frozen=True, slots=True)
class Touch:
    """Gateway: activity from these sessions (session keys, as in `Attach`). `ago` (optional, seconds in
    0..`MAX_TOUCH_AGO`): how long before sending the gateway read that activity (a batching gateway holds
    touches for a while); the server stamps it that much earlier, within its own cap (half a tick)."""

    uids: tuple[SessionKey, ...]
    ago: float = 0.0


@dataclass(frozen=True, slots=True)
class Detach:
    """Gateway: these sessions (session keys, as in `Attach`) disconnected. `reason` (optional, one of
    `DETACH_REASONS`) is the offline reason to record, so an edge's users leave the same record as direct
    ones; absent: "detach"."""

    uids: tuple[SessionKey, ...]
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Marked:
    """Gateway: the answer to `Mark(t)`, `{"op":"marked","t":T}` with the very `t` it carried. Sent after every
    frame that reports activity the gateway had read before the mark reached it: the server then knows that
    the gateway's users' activity up to its own time `t` has been applied (the gateway's *watermark*)."""

    t: float


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Observer: stream events, from sequence number `from_seq` (wire key "from") or from now when None;
    `durable`: only events already durable in the event log (under the server's fsync policy); `uids`
    (None: every event) makes it a *watchlist* observer, sent only the events of these uids (and of those
    its `Watch` frames add), even when empty."""

    from_seq: int | None = None
    durable: bool = False
    uids: tuple[Uid, ...] | None = None


@dataclass(frozen=True, slots=True)
class Replicate:
    """Standby: `{"op":"replicate","from":SEQ}`, the first and only request of a `standby` login: a standby core
    asks for the durable log records from SEQ on, byte for byte (`idled.protocol.replication` has the server's
    replies and what the standby sends after it)."""

    from_seq: int


@dataclass(frozen=True, slots=True)
class Watch:
    """Observer: add these uids to its watchlist, `{"op":"watch","uids":[...]}` (plain uids only). Allowed
    before `subscribe` (which must then carry `uids`) and after a subscribe with `uids`."""

    uids: tuple[Uid, ...]


@dataclass(frozen=True, slots=True)
class Unwatch:
    """Observer: remove these uids from its watchlist, `{"op":"unwatch","uids":[...]}`."""

    uids: tuple[Uid, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """Observer: which of these uids are online? Answered by `Status`. `last_seen` (wire ``"last_seen": true``,
    sent only when set): the reply also says when each was last active, and which devices are online."""

    uids: tuple[Uid, ...]
    last_seen: bool = False


# ------------------------------------------------------------------------------------ server -> client


@dataclass(frozen=True, slots=True)
class Welcome:
    """Login accepted. `timeout` (seconds): a user's own timeout, or for a gateway the server's default;
    `max_frame` optionally tells a peer its new limit. A gateway's welcome also carries the server's `tick`
    and `max_timeout`, so an edge can answer its users' logins exactly as the server would, and `ages`
    (wire ``"ages": true``): the server honours a touch's `ago` (a gateway sends it only then: an older server
    refuses the unknown field)."""

    role: Role
    name: Uid
    timeout: float | None = None
    max_frame: int | None = None
    tick: float | None = None
    max_timeout: float | None = None
    ages: bool = False


@dataclass(frozen=True, slots=True)
class Pong:
    """`{"op":"pong"}`. Encodes to the precomputed `PONG_FRAME`."""


@dataclass(frozen=True, slots=True)
class Event:
    """A presence change. `extra` carries optional additional fields (e.g. "timeout", "detector")."""

    seq: int
    kind: EventKind
    uid: Uid
    ts: float  # wall-clock unix seconds of the event
    reason: str
    last_seen: float
    deadline: float
    extra: Mapping[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        """The event as the event log stores it: the fixed keys, then the extra ones."""
        record: dict[str, Any] = {
            "seq": self.seq, "kind": self.kind, "uid": self.uid, "ts": self.ts, "reason": self.reason,
            "last_seen": self.last_seen, "deadline": self.deadline,
        }
        record.update(self.extra or {})
        return record


@dataclass(frozen=True, slots=True)
class Status:
    """Answer to `Query`: uid -> online? With `Query.last_seen`, also `last_seen`: uid -> wall unix seconds of
    the user's last activity (online: its latest over its sessions; offline: its last offline's last_seen) or
    None (unknown, or older than the server's horizon); and `devices`: uid -> the devices online, for users
    online with at least one device. Both None (absent on the wire) when the query did not ask."""

    online: Mapping[Uid, bool]
    last_seen: Mapping[Uid, float | None] | None = None
    devices: Mapping[Uid, tuple[str, ...]] | None = None


@dataclass(frozen=True, slots=True)
class Error:
    """`{"op":"error","code":C,"reason":TEXT}`, sent before the server closes a connection. `leader`
    (wire ``"leader": "HOST:PORT"``, only with `not_leader`, only when known: absent otherwise, so the frame is
    byte for byte what it was before) names the core that accepts the refused login."""

    code: str
    reason: str
    leader: str | None = None


DETACH_REASONS: Final = ("logout", "closed", "shutdown")

# Why the server ended sessions a gateway carried (`Ended.reason`); "unavailable": an attach the server refused
# (it cannot take new sessions now: its event log's disk is full), so that the gateway refuses its user.
ENDED_REASONS: Final = ("idle", "kicked", "shutdown", "unavailable")


@dataclass(frozen=True, slots=True)
class Ended:
    """`{"op":"ended","uids":[...],"reason":R}`: the server ended these sessions of the gateway (R in
    `ENDED_REASONS`), by session key (a uid, or [uid, device] as the gateway attached it). Sent only to
    gateways that logged in with `"ended": true`."""

    uids: tuple[SessionKey, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Mark:
    """`{"op":"mark","t":T}`: the server asks a gateway that logged in with `"marks": true` to answer `Marked(t)`
    once everything it read from its users before this request arrived has been sent. `t` is the server's
    own clock reading when it sent the request (opaque to the gateway: it is echoed, never interpreted)."""

    t: float


ClientMessage: TypeAlias = (
    Login | Ping | Msg | Bye | Attach | Touch | Detach | Marked | Subscribe | Query
    | Watch | Unwatch | Replicate
)
ServerMessage: TypeAlias = Welcome | Pong | Event | Status | Error | Ended | Mark
Message: TypeAlias = ClientMessage | ServerMessage

PING: Final = Ping()
BYE: Final = Bye()
PONG: Final = Pong()
QUIET: Final = Msg()  # `{"op":"msg"}` without data, the quiet keepalive: the decoders return this one instance
