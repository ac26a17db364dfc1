"""The core's internal listener: the unix socket its edge workers (``idled serve --workers N``) connect to.

Theory of operation
-------------------
With workers the core accepts nothing on the public port: the root (``idled.server.workers.root``) hands the public
listening socket(s) to the ``idled edge`` children and the core accepts here instead, on a unix stream
socket named ``core.sock`` in ``$RUNTIME_DIRECTORY`` (systemd's ``RuntimeDirectory=``) or else in the
event-log directory. The root binds it (and every core it starts inherits it, so it outlives a crashed
core); the file is created mode 0600 (the umask is narrowed around ``bind``, so it is never more open than
that) and removed when the root stops. A stale file from a daemon that crashed is removed before binding --
only once a connect to it was refused: a live daemon's socket is never taken over.

Everything arriving here is served by the ordinary ``Doorway``: the edges' own links (gateways named
``worker-<i>``), and the gateways, observers and standbys the edges relay from the public port (their login frame
forwarded unchanged). Only the first kind is trusted, and the rule is precise (``Workers.trusts``): a
*gateway* login *without a token* whose peer process (``SO_PEERCRED``) is the live worker the root started
under that very name (its pid from ``idled.server.workers.roster``), while no gateway of that name is connected.
Every other login -- a relayed gateway, observer or standby, anything carrying a token -- is verified as usual when
auth is on. The socket's permissions keep other users out; the pid and name rule keeps a client of the public
port from borrowing an edge's trust through the relay (an edge forwards a relayed login unchecked: the core
checks tokens).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Mapping
from pathlib import Path

import trio

from idled.door.door import open_unix_listener
from idled.ops.config import ConfigError
from idled.protocol.address import AddressError, UnixPath, format_address, parse_address

__all__ = ["SOCKET_NAME", "BACKLOG", "core_socket_path", "open_internal_listener", "remove_socket", "peer_pid"]

SOCKET_NAME = "core.sock"
BACKLOG = 512  # edges connect once each, relays one per relayed gateway/observer: a few at a time


def core_socket_path(env: Mapping[str, str], data_dir: str | os.PathLike[str]) -> Path:
    """Where the internal socket lives: ``$RUNTIME_DIRECTORY`` (its first entry) if systemd set it, else the
    event-log directory."""
    runtime = env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(runtime or data_dir) / SOCKET_NAME


async def open_internal_listener(path: Path) -> trio.SocketListener:
    """Bind and listen on ``path`` (mode 0600, through the door), replacing a stale socket file."""
    try:  # the edges are given it as --core unix:PATH: what they could not read is refused here, before they start
        parse_address(format_address(UnixPath(str(path))), unix=True)
    except AddressError as exc:
        raise ConfigError(f"internal socket {path}: {exc.problem}") from None
    try:
        # Left by a daemon that crashed (the root checked that nobody answers on it). (Blocking calls, but once
        # at startup on a local directory, before anything else runs.)
        if path.is_socket():  # noqa: ASYNC240
            path.unlink()  # noqa: ASYNC240
    except FileNotFoundError:
        pass
    return await open_unix_listener(path, BACKLOG)


def remove_socket(path: Path) -> None:
    """Remove the socket file at exit (never raises: a missing file is already the goal)."""
    try:
        path.unlink()
    except OSError:
        pass


def peer_pid(stream: trio.abc.Stream) -> int | None:
    """The pid of the process at the other end of a unix-socket stream (``SO_PEERCRED``); None for any other
    stream (TCP, memory streams in tests)."""
    sock = getattr(stream, "socket", None)
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid) or None
