"""The client library's one exception hierarchy.

Every failure a client reports is a `ClientError`. `code` is the server's error code (an `ErrorCode` value
such as ``"auth_failed"``) when the server said so in an `error` frame, or a client-side code
(``"connection_lost"``, ``"timeout"``) otherwise. `retryable` says whether reconnecting can help: a server
at capacity, restarting or unable to take new work for now (`busy`, `server_shutdown`, `unavailable`: its
event log's disk is full) or a dropped connection are worth a retry with backoff, and so is `not_leader` (a standby or non-leader core: another core, or this one once promoted, will
take the login; `NotLeader.leader` names it when the core knew); a rejected token, a newer login (`kicked`) or a malformed message will fail the same way again,
and so will `tls_required` (`TLSRequired`: the port speaks TLS and the client connected without it -- a
configuration error, said at once rather than retried).
Unknown codes are final, as the wire contract asks of clients.
"""

from __future__ import annotations

import os
import re
from typing import Final

from idled.protocol import ErrorCode
from idled.protocol.address import format_address

__all__ = [
    "ClientError", "ConnectionLost", "ConnectFailed", "ServerError", "AuthFailed", "Kicked", "Busy", "Unavailable",
    "ServerShutdown",
    "IdleTimeout", "Gone", "NotLeader", "ProtocolMismatch", "TLSRequired", "CONNECTION_LOST", "RETRYABLE_CODES",
    "error_from",
]

CONNECTION_LOST: Final = "connection_lost"
# Codes after which the same login may succeed later: capacity, restarts, and our own lost keepalives.
RETRYABLE_CODES: Final = frozenset({
    ErrorCode.BUSY, ErrorCode.SERVER_SHUTDOWN, ErrorCode.IDLE_TIMEOUT, ErrorCode.LOGIN_TIMEOUT, CONNECTION_LOST,
    ErrorCode.NOT_LEADER, ErrorCode.UNAVAILABLE,
})


class ClientError(Exception):
    """Base of every client error. `code`: the server's error code or a client-side one; `reason`: text."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason

    @property
    def retryable(self) -> bool:
        """True when reconnecting (after a backoff) may succeed."""
        return self.code in RETRYABLE_CODES

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class ConnectionLost(ClientError):
    """The connection failed or closed without an error frame (refused, reset, server killed...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(CONNECTION_LOST, reason)


class ConnectFailed(ConnectionLost):
    """No connection could be made (refused, unreachable, unknown host): nothing listens there, or not yet.
    Retryable like any ConnectionLost; a command line can say "is the daemon running?" only to this one."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        causes = _leaves(exc)
        reasons = [_words(c) for c in causes]
        super().__init__(f"connect to {format_address((host, port))} failed: {'; '.join(dict.fromkeys(reasons))}")
        # True when every address answered "nothing listens here" (the likeliest cause: no daemon).
        self.refused = all(isinstance(c, ConnectionRefusedError) for c in causes)


def _leaves(exc: OSError) -> list[BaseException]:
    # trio wraps one error per address it tried in an ExceptionGroup behind a generic "all attempts to
    # connect to ... failed", which alone says nothing.
    cause = exc.__cause__
    return list(cause.exceptions) if isinstance(cause, BaseExceptionGroup) and cause.exceptions else [exc]


def _words(exc: BaseException) -> str:
    """The operating system's words ("Connection refused"), without the address the caller names already."""
    if isinstance(exc, OSError) and exc.errno is not None and exc.errno > 0:
        return os.strerror(exc.errno)
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)  # e.g. a resolver error


class ServerError(ClientError):
    """The server sent an `error` frame (and closed the connection)."""


class AuthFailed(ServerError):
    """`auth_failed`: the token is missing, forged, expired, or for another identity. Final."""


class Kicked(ServerError):
    """`kicked`: a newer login for the same identity replaced this connection. Final (reconnecting would
    kick the newer one in turn)."""


class Busy(ServerError):
    """`busy`: the server is at capacity, or an observer fell behind. Retryable."""


class Unavailable(ServerError):
    """`unavailable`: the server cannot take new work now (its event log's disk is full: it runs degraded, and
    keeps the sessions it has). Retryable, like `busy`."""


class ServerShutdown(ServerError):
    """`server_shutdown`: the server is stopping. Retryable (it is probably restarting)."""


class IdleTimeout(ServerError):
    """`idle_timeout`: our keepalives did not arrive in time (e.g. the process was paused). Retryable."""


class Gone(ServerError):
    """`gone`: an observer asked for events older than the server retains. `oldest_seq` is the oldest seq
    still available (None if the reason did not say): resume from there and resynchronise with `query`."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(code, reason)
        match = re.search(r"oldest available is (\d+)", reason)
        self.oldest_seq: int | None = int(match.group(1)) if match else None


class NotLeader(ServerError):
    """`not_leader`: this core does not lead (a standby, or not elected now). `leader` ("HOST:PORT") is the
    core it named, None if it did not know. Retryable: a link given several cores goes there (or to the next
    one) at once, and a lone standby may be promoted on the same address."""

    def __init__(self, code: str, reason: str, leader: str | None = None) -> None:
        super().__init__(code, reason)
        self.leader = leader


class TLSRequired(ServerError):
    """`tls_required`: the server's port speaks TLS and this client began in plain text. A configuration
    error, final: connect with TLS (an `ssl_context`; `idled user/watch/query --tls`, with `--ca-file` for a
    private CA). Its message says so."""

    def __str__(self) -> str:
        return (f"{self.code}: the server speaks TLS on this port and this client connected without it "
                f"(give it an ssl_context; on the command line --tls, and --ca-file FILE for a private CA)")


class ProtocolMismatch(ServerError):
    """The server rejected our frame (`bad_frame`, `bad_message`, `not_allowed`, ...) or sent one we cannot
    parse: a bug or a version mismatch on one side. Final."""


_CLASSES: Final[dict[str, type[ServerError]]] = {
    ErrorCode.AUTH_FAILED: AuthFailed,
    ErrorCode.KICKED: Kicked,
    ErrorCode.BUSY: Busy,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.SERVER_SHUTDOWN: ServerShutdown,
    ErrorCode.IDLE_TIMEOUT: IdleTimeout,
    ErrorCode.GONE: Gone,
    ErrorCode.TLS_REQUIRED: TLSRequired,
}


def error_from(code: str, reason: str, leader: str | None = None) -> ServerError:
    """The typed exception for an `error` frame's code (unknown codes: ProtocolMismatch, final); `leader`:
    the frame's, kept by `NotLeader`."""
    if code == ErrorCode.NOT_LEADER:
        return NotLeader(code, reason, leader)
    return _CLASSES.get(code, ProtocolMismatch)(code, reason)
