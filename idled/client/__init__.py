"""The public idled client: user sessions, gateways and observers, for trio and asyncio.

* `idled.client.trio` / `idled.client.asyncio`: ``open_session``, ``open_gateway``, ``open_observer`` --
  async context managers that log in, keep the connection alive, reconnect with full-jitter backoff after
  retryable failures, and log out on exit.
* `idled.client.errors`: one exception hierarchy (`ClientError`, with the server's error `code`).
* `idled.client.core`: the sans-IO rules (keepalive schedule, backoff, gateway batching, observer position),
  usable by clients on other I/O stacks.
"""

from idled.client.errors import (
    AuthFailed, Busy, ClientError, ConnectFailed, ConnectionLost, Gone, IdleTimeout, Kicked, NotLeader, ProtocolMismatch,
    ServerError,
    ServerShutdown, TLSRequired, Unavailable,
)
from idled.client.gateway import Gateway
from idled.client.observer import Observer, UserStatus
from idled.client.session import Session

__all__ = [
    "ClientError", "ConnectionLost", "ConnectFailed", "ServerError", "AuthFailed", "Kicked", "Busy", "ServerShutdown",
    "IdleTimeout", "Gone", "NotLeader", "ProtocolMismatch", "TLSRequired", "Unavailable", "Session", "Gateway", "Observer",
    "UserStatus",
]
