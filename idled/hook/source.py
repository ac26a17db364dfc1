"""The hook's side of the daemon: a durable observer that feeds events, in seq order, into a bounded channel.

Theory of operation
-------------------
`read_events` runs `idled.client`'s observer with ``durable=True`` -- the hook only ever posts events the
daemon's log already holds, so a crash of the daemon cannot make the receiver see an event the log then
forgets -- and reconnects by itself (daemon restarts, ``busy``), resuming from the last seq it read, so the
stream into the channel has no gap and no duplicate. A fresh token is minted for every (re)connection
(`HookObserver._login`): a token minted once would expire under a hook that runs for weeks.

The channel is bounded (``HookConfig.queue``): when the receiver is slow the channel fills, the observer's own
buffer fills, and the observer stops reading; the daemon cuts it (``busy``) 65,536 events behind, and it
resumes by seq when there is room. Memory stays bounded whatever the receiver does.

`Gone` (the requested seq fell out of the daemon's retention: the hook was down, or failing, for longer than
the daemon keeps events) is not retried blindly: without ``--resync`` it ends the hook with `HookGone`
naming the gap; with it, the hook logs the gap as an error and continues from the oldest retained event.
"""

from __future__ import annotations

import logging

import trio

from idled.client import Gone
from idled.client.follow import Follow, Following
from idled.client.observer import Observer
from idled.client.trio import TRIO, running
from idled.hook.config import HookConfig
from idled.protocol import Event, Login

__all__ = ["HookGone", "HookObserver", "read_events"]

log = logging.getLogger("idled.hook")


class HookGone(Exception):
    """The events after the checkpoint are no longer retained by the daemon (and ``--resync`` was not given)."""

    def __init__(self, after: int | None, oldest: int | None) -> None:
        self.after, self.oldest = after, oldest
        gap = f"seqs {(after or 0) + 1}..{oldest - 1}" if oldest is not None else f"seqs after {after}"
        super().__init__(f"the daemon no longer retains {gap}: they were never delivered; restart with --resync "
                         "to skip them and continue from the oldest retained event")


class HookObserver(Following, Observer):
    """An observer that logs in with a fresh token on every connection, and follows the leader among the cores
    it was given (`idled.client.follow`, as the command-line tools do) for as long as the hook runs."""

    def __init__(self, config: HookConfig, after: int | None) -> None:
        super().__init__(TRIO, config.host, config.port, config.name, after=after, durable=True,
                         connect_timeout=config.connect_timeout, ssl_context=config.ssl_context,
                         uids=config.uids)
        self._token = config.token
        # A service: it waits for the daemon from its first login on, and never gives up (systemd would only
        # restart it into the same wait).
        self.follow = Follow(log.warning, give_up_after=None, from_start=True)

    def _login(self) -> Login:
        return Login("observer", self.login.name, self._token())


async def read_events(config: HookConfig, after: int | None, channel: trio.MemorySendChannel[Event]) -> None:
    """Feed events after ``after`` (None: from now) into ``channel`` until cancelled; `HookGone` as above."""
    while True:
        observer = HookObserver(config, after)
        try:
            async with running(observer):
                where = "from now" if after is None else f"after seq {after}"
                log.info("subscribed to %s %s (durable)", observer.where, where)
                async for event in observer:
                    await channel.send(event)
            raise RuntimeError("the observer ended without an error")  # it reconnects: only cancel ends it
        except Gone as exc:
            lost_after = observer.position if observer.position is not None else after
            if not config.resync or exc.oldest_seq is None:
                raise HookGone(lost_after, exc.oldest_seq) from None
            log.error("GAP: the daemon no longer retains seqs %d..%d; they are skipped (--resync); "
                      "continuing from seq %d", (lost_after or 0) + 1, exc.oldest_seq - 1, exc.oldest_seq)
            after = exc.oldest_seq - 1
