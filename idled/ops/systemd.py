"""The three systemd protocols a service needs: sd_notify, the watchdog, and socket activation.

Theory of operation
-------------------
All three are environment variables plus a few syscalls, so they are implemented here directly
(no libsystemd binding, no unmaintained wrapper package):

* **sd_notify** -- systemd puts the path of a unix datagram socket in ``$NOTIFY_SOCKET`` (a file
  path, or ``@name`` for the abstract namespace). A message is newline-separated ``KEY=VALUE``
  assignments sent as one datagram: ``READY=1`` once serving (``Type=notify`` units are "starting"
  until then), ``STATUS=...`` free text for ``systemctl status``, ``WATCHDOG=1`` keep-alive pings,
  ``STOPPING=1`` when a graceful stop begins, ``RELOADING=1``, ``MAINPID=n``.
  Sending never raises: a missing variable or a vanished socket is reported as ``False`` and
  logged, because losing a status line must never take the daemon down. The send is
  non-blocking (the caller is an event loop); systemd drains its notify socket promptly, and a
  full queue drops one message rather than stalling every connection.

* **watchdog** -- with ``WatchdogSec=`` systemd sets ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, the
  pid meant to ping). The service must send ``WATCHDOG=1`` more often than that; the
  conventional rate, returned by :func:`watchdog_interval`, is every half interval. The server
  pings from its event loop, so a wedged loop -- not just a dead process -- is restarted.

* **socket activation** -- systemd binds the listening sockets, starts the service with them as
  fds 3, 4, ... and sets ``LISTEN_FDS`` (count), ``LISTEN_PID`` (who they are meant for: a forked
  child must not adopt them) and optionally ``LISTEN_FDNAMES`` (colon-separated
  ``FileDescriptorName=`` values). :func:`listen_fds` checks the pid, wraps each fd in a
  :class:`socket.socket`, sets close-on-exec (systemd leaves them inheritable), and unsets the
  variables so nothing we spawn tries again.

Plus :func:`raise_nofile_limit`: systemd gives services a soft ``RLIMIT_NOFILE`` of 1024
whatever ``LimitNOFILE=`` sets the hard limit to, and the soft limit is the one that bites.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
from collections.abc import Mapping, MutableMapping

__all__ = [
    "READY",
    "STOPPING",
    "RELOADING",
    "WATCHDOG",
    "MANAGER_VARS",
    "LISTEN_FDS_START",
    "SystemdError",
    "Notifier",
    "notify",
    "status",
    "extend_timeout",
    "mainpid",
    "watchdog_interval",
    "listen_fds",
    "listen_fds_with_names",
    "raise_nofile_limit",
]

log = logging.getLogger(__name__)

READY = "READY=1"
STOPPING = "STOPPING=1"
RELOADING = "RELOADING=1"
WATCHDOG = "WATCHDOG=1"

# sd_listen_fds(3): passed sockets start right after stdin/stdout/stderr.
LISTEN_FDS_START = 3

_LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
# What tells a process to talk to the manager or hands it sockets (a process that runs parts of itself
# fresh -- idled.server.node -- gives them an environment without these).
MANAGER_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", *_LISTEN_VARS)


class SystemdError(Exception):
    """The environment systemd gave us is malformed; ``code`` says how (machine-readable)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def status(text: str) -> str:
    """A ``STATUS=`` assignment; newlines would start a new assignment, so they become spaces."""
    return "STATUS=" + text.replace("\n", " ")


def extend_timeout(seconds: float) -> str:
    """An ``EXTEND_TIMEOUT_USEC=`` assignment: "give me this much longer" during a slow start or stop
    (e.g. recovering a large event log), sent repeatedly while the work goes on."""
    return f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1_000_000))}"


def mainpid(pid: int) -> str:
    """A ``MAINPID=`` assignment (only needed if the main process changes, e.g. after a re-exec)."""
    return f"MAINPID={int(pid)}"


def _address(env: Mapping[str, str]) -> str | bytes | None:
    value = env.get("NOTIFY_SOCKET", "")
    if not value:
        return None
    if value.startswith("@"):
        # Abstract namespace: the kernel name is a leading NUL followed by the rest, unterminated.
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    # systemd >= 253 may also pass vsock:CID:PORT; idled runs on the host, so that is not handled.
    log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract name; not notifying", value)
    return None


class Notifier:
    """A reusable sd_notify sender: one socket opened once, used for every message.

    The daemon pings ``WATCHDOG=1`` every few seconds while it may be close to its file-descriptor
    limit (one fd per client); holding the socket means a ping never needs a fresh fd.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._address = _address(os.environ if env is None else env)
        self._sock: socket.socket | None = None
        if self._address is not None:
            try:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            except OSError as exc:
                log.warning("cannot create sd_notify socket: %s", exc)
                self._sock = None

    @property
    def enabled(self) -> bool:
        """True when systemd asked for notifications (``$NOTIFY_SOCKET`` was usable)."""
        return self._sock is not None

    def send(self, message: str) -> bool:
        """Send one datagram; True if the kernel accepted it. Never raises."""
        if self._sock is None or self._address is None:
            return False
        try:
            self._sock.sendto(message.encode(), self._address)
        except OSError as exc:
            # ENOENT/ECONNREFUSED: the manager's socket is gone (e.g. tests, or systemd re-exec);
            # EAGAIN: its queue is full. Either way, report and carry on.
            level = logging.DEBUG if exc.errno == errno.EAGAIN else logging.WARNING
            log.log(level, "sd_notify %r to %r failed: %s", message, self._address, exc)
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def notify(message: str, *, env: Mapping[str, str] = os.environ) -> bool:
    """Send ``message`` (e.g. ``READY``, ``status("serving")``, or several joined by newlines).

    Returns False when ``$NOTIFY_SOCKET`` is unset/unusable or the send failed (logged); never raises.
    """
    with Notifier(env) as notifier:
        return notifier.send(message)


def watchdog_interval(env: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WatchdogSec``), or None if no watchdog is asked of us."""
    usec = env.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None  # meant for our parent or child, not us
        except ValueError:
            log.warning("ignoring malformed WATCHDOG_PID=%r", pid)
            return None
    try:
        interval = int(usec)
    except ValueError:
        log.warning("ignoring malformed WATCHDOG_USEC=%r", usec)
        return None
    if interval <= 0:
        return None
    return interval / 2 / 1_000_000


def listen_fds_with_names(
    env: MutableMapping[str, str] = os.environ, *, unset: bool = True
) -> list[tuple[str, socket.socket]]:
    """Adopt the sockets systemd passed us, with their ``FileDescriptorName=`` (``"unknown"`` if unnamed).

    Returns [] when nothing was passed, or when it was passed to another pid. Raises
    :class:`SystemdError` when the variables are malformed or an fd is not a socket: a unit
    that hands us garbage is a deployment error to report at start, not to work around.
    """
    try:
        pid_text = env.get("LISTEN_PID", "")
        count_text = env.get("LISTEN_FDS", "")
        names_text = env.get("LISTEN_FDNAMES")
    finally:
        if unset:
            for name in _LISTEN_VARS:
                env.pop(name, None)
    if not pid_text or not count_text:
        return []
    try:
        pid = int(pid_text)
        count = int(count_text)
    except ValueError:
        raise SystemdError("bad-listen-env", f"LISTEN_PID={pid_text!r} LISTEN_FDS={count_text!r}") from None
    if pid != os.getpid():
        return []
    if count < 0:
        raise SystemdError("bad-listen-env", f"LISTEN_FDS={count}")
    names = names_text.split(":") if names_text else []
    if names and len(names) != count:
        raise SystemdError("bad-listen-env", f"LISTEN_FDNAMES has {len(names)} names for {count} fds")
    adopted: list[tuple[str, socket.socket]] = []
    try:
        for index in range(count):
            fd = LISTEN_FDS_START + index
            # systemd leaves passed fds inheritable; nothing we might spawn should get them.
            os.set_inheritable(fd, False)
            try:
                sock = socket.socket(fileno=fd)  # family/type/proto are read from the fd
            except OSError as exc:
                raise SystemdError("not-a-socket", f"fd {fd}: {exc}") from None
            adopted.append((names[index] if names else "unknown", sock))
            # An Accept=yes unit would pass a connected socket; accept() on it fails much later.
            if sock.type == socket.SOCK_STREAM and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                raise SystemdError("not-listening", f"fd {fd} is a stream socket that is not listening")
    except BaseException:
        for _, sock in adopted:
            sock.detach()  # leave the fds as we found them; the caller decides what to close
        raise
    return adopted


def listen_fds(env: MutableMapping[str, str] = os.environ, *, unset: bool = True) -> list[socket.socket]:
    """Adopt the sockets systemd passed us (see :func:`listen_fds_with_names`)."""
    return [sock for _, sock in listen_fds_with_names(env, unset=unset)]


def _nr_open() -> int | None:
    try:
        with open("/proc/sys/fs/nr_open", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; return the resulting (soft, hard).

    An unlimited hard limit cannot be the soft limit for file descriptors (the kernel caps it at
    ``fs.nr_open``), so that value is used instead. Failure leaves the limit as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        target = _nr_open() or soft
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
    return resource.getrlimit(resource.RLIMIT_NOFILE)
