"""A user session: login with a keepalive, automatic pings, `send(data)`, `bye` on close, reconnects.

Theory of operation
-------------------
After `welcome` the session knows its timeout T and sends a keepalive whenever it has sent nothing for
`ping_interval(T, keepalive)` (see `idled.client.core`): the timer sleeps until `last_sent + interval`,
re-checks (a `send` in between moved `last_sent`), and sends one. A keepalive is the quiet `{"op":"msg"}`,
which the server does not answer, unless the last ping (or the welcome) is ``ask_after`` seconds old (default
2 T, one keepalive in three; 0: every keepalive): then it is a `ping`, which the server answers with a `pong`
(`asks_for_answer`). A ping that gets no `pong` (nor any other frame) within one timeout (at least 1 s) means
the path to the server is dead even if TCP has not noticed yet: the connection is dropped and, with
`reconnect=True`, logged in again after a backoff (the user comes back online with reason `login`; if the
server never noticed the gap, no event at all). So a silent path is noticed within ``ask_after`` + one
keepalive + T at the most (3 T + the interval by default; T + the interval with ``ask_after=0``).

*Devices.* ``device=D`` logs in as one device of the user (the login carries ``"device": D``): the session's
key is then ``(uid, D)``, so the same uid may be logged in from several devices at once, each with its own
session, and the user stays online while any of them lives (the server's events stay per user). A second
login of the same uid *and* device replaces this one (``kicked``), as a second login of a plain uid does.
Without ``device`` the login is byte for byte what it was before devices.
"""

from __future__ import annotations

import ssl
from typing import Any

from idled.client.core import (
    Backoff, KeepaliveTimer, asks_for_answer, check_device, default_ask_after, ping_interval,
)
from idled.client.errors import ConnectionLost
from idled.client.leader import Hosts
from idled.client.link import Conn, Link, Runtime
from idled.protocol import PING_FRAME, QUIET_FRAME, Login, Msg, Pong, SessionKey, Uid, Welcome, encode

__all__ = ["Session"]


class Session(Link):
    """A user's connection. Create it through `idled.client.trio.open_session` or
    `idled.client.asyncio.open_session`, which run it in the background for the duration of a block."""

    def __init__(self, runtime: Runtime, host: Hosts, port: int | None, uid: Uid, *, token: str | None = None,
                 keepalive: float | None = None, device: str | None = None, ask_after: float | None = None,
                 reconnect: bool = True,
                 backoff: Backoff | None = None, connect_timeout: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        login = Login("uid", uid, token, keepalive, device=check_device(device))
        super().__init__(runtime, host, port, login, reconnect=reconnect,
                         backoff=backoff, connect_timeout=connect_timeout,
                         ssl_context=ssl_context, server_hostname=server_hostname)
        if ask_after is not None and not ask_after >= 0:
            raise ValueError(f"ask_after must be >= 0 seconds, got {ask_after!r}")
        self.keepalive = keepalive
        self.ask_after = ask_after  # None: default_ask_after(the welcome's timeout)
        self.pings = 0  # keepalives that asked for an answer (and pings sent by `ping()`)
        self.quiet_keepalives = 0  # keepalives that did not
        self.pongs = 0
        self._timer = KeepaliveTimer(None, 0.0)  # replaced at each welcome; no clock read outside a loop
        self._ping_sent: float | None = None  # when the unanswered ping went out
        self._asked = 0.0  # when the last ping went out (the welcome arrived, at first)

    @property
    def uid(self) -> Uid:
        return self.login.name

    @property
    def device(self) -> str | None:
        """The device this session logged in as (None: a plain login, the user's one session)."""
        return self.login.device

    @property
    def key(self) -> SessionKey:
        """The session key the server knows this session by: the uid, or (uid, device)."""
        return self.login.key

    @property
    def timeout(self) -> float | None:
        """Seconds of silence after which the server marks this user offline (from `welcome`)."""
        return None if self.welcome is None else self.welcome.timeout

    async def send(self, data: Any = None) -> None:
        """An application `msg` (also activity: it postpones the next ping). Waits while reconnecting."""
        await self.send_frame(encode(Msg(data)))

    async def ping(self) -> None:
        """A keepalive now (the session pings by itself; this is for applications that want one more)."""
        await self.send_frame(PING_FRAME)

    def _sent(self, frame: bytes) -> None:
        now = self.runtime.now()
        self._timer.sent(now)
        if frame is PING_FRAME:
            self.pings += 1
            self._asked = now
            if self._ping_sent is None:
                self._ping_sent = now
        elif frame is QUIET_FRAME:
            self.quiet_keepalives += 1

    async def _on_welcome(self, conn: Conn, welcome: Welcome) -> None:
        self._timer = KeepaliveTimer(ping_interval(welcome.timeout, self.keepalive), self.runtime.now())
        self._ping_sent = None
        self._asked = self.runtime.now()

    async def _on_message(self, message: Any) -> None:
        # Any frame proves the path is alive; users get only pongs today.
        self._ping_sent = None
        if type(message) is Pong:
            self.pongs += 1

    async def _background(self, conn: Conn) -> None:
        timer, runtime = self._timer, self.runtime
        if timer.interval is None:
            await runtime.event().wait()
        # How long a ping may go unanswered: one whole timeout (by then the server would have expired a
        # silent user anyway), at least a second, so a loaded machine's slow pong is not a dead connection.
        patience = max(self.timeout or 0.0, 1.0)
        ask_after = default_ask_after(patience) if self.ask_after is None else self.ask_after
        while True:
            now = runtime.now()
            if self._ping_sent is not None and now - self._ping_sent >= patience:
                raise ConnectionLost(f"no reply to a ping within {patience:.3g} s")
            deadline: float = timer.deadline  # type: ignore[assignment]
            if now >= deadline:
                ask = asks_for_answer(now, self._asked, self._ping_sent, ask_after)
                await self.send_frame(PING_FRAME if ask else QUIET_FRAME)
                continue
            wake = deadline if self._ping_sent is None else min(deadline, self._ping_sent + patience)
            await runtime.sleep(wake - now)
