"""Sans-IO client state: keepalive schedule, reconnect backoff, gateway batching, observer position.

Theory of operation
-------------------
Nothing here reads a clock, a socket or a random source of its own: times are arguments and randomness is
injected, so every rule is tested with plain numbers. The I/O drivers (`idled.client.session`, `.gateway`,
`.observer`) call these objects and do what they return.

*Keepalive.* A user asking for keepalive k gets a timeout T = min(1.5 k, max_timeout) in `welcome`. The
client pings when it has sent nothing for `ping_interval(T, k)` = min(k, T / 1.5) seconds, so the ping is due
a third of the timeout before the deadline even when the server capped T (one lost scheduling slice or a slow
link does not take the user offline). Any frame sent (`msg`) counts as activity and postpones the ping.
Most keepalives ask for no answer: `asks_for_answer` makes one a `ping` (answered with a `pong`) only when
the last ping (or the welcome) is `ask_after` seconds old (default two timeouts, `default_ask_after`) and
has been answered; the others are the quiet keepalive `{"op":"msg"}`, activity the server does not answer. A
pong costs the server a send (a fifth of a keepalive's CPU at 4,700 a second, docs/peer.md) and proves only
what one pong per `ask_after` proves as well: that the path and the server's loop are alive.

*Backoff.* Attempt n (0-based) waits uniform(0, min(cap, base * 2**n)) seconds: "full jitter", so that 100k
clients cut off by one restart spread their return over the whole window instead of arriving in lockstep.

*Gateway batching.* `attach` / `touch` / `detach` calls append to a list of groups; consecutive calls of the
same kind (and keepalive, or detach reason) share a group, an insertion-ordered dict used as a set, so
repeated touches of one uid cost nothing until the flush, and the order of an attach then a detach of one uid
is kept. A touch of a uid whose attach is still pending in the last group is dropped (the attach is activity
already). `take()` encodes the groups into frames no larger than the connection's frame limit. The batcher
also remembers the live uids (attached, not detached) with their keepalive: after a reconnect `reattach()`
replaces whatever was pending with attach frames for all of them (the server forgot them: `gateway_lost`).
Both gateway links batch here: the client library's `Gateway` and the edge's `CoreLink`.
What the batcher holds per session is its *session key* (`idled.protocol.SessionKey`): a plain uid, or the
tuple ``(uid, device)`` for one device of a user -- hashable, so a device's session is batched, deduplicated,
kept live and re-attached exactly like a uid, and encoded as the 2-array ``[uid, device]`` the server decodes
back into the same tuple. `check_key` validates a key where the application hands it over (an attach).

*Observer position.* `ObserverCursor.last` is the last seq handed to the application (or its stored
checkpoint at start); `subscribe()` asks for ``from = last + 1``, durable-only when `durable` (by default
exactly when the application gave a checkpoint); `accept(event)` drops any event whose seq is
not beyond `last`, so a replay overlap never reaches the application twice within one process. Across a
restart of the application, delivery is at-least-once: events after the stored checkpoint are delivered
again, and their seq shows they were seen. A watchlist observer's cursor also holds its current watchlist
(`uids`, insertion-ordered): `subscribe_frames()` re-sends it on every (re)connection as `watch` frames of at
most a frame each, then the `subscribe` carrying the last part -- all before the subscribe, so a resume
`from` a seq replays every uid's events (a list sent after it would miss those of the uids it carried).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from idled.core.timeouts import KEEPALIVE_FACTOR
from idled.protocol import (
    DEFAULT_MAX_FRAME, MAX_DEVICE_BYTES, MAX_KEEPALIVE, MAX_UID_BYTES, MIN_KEEPALIVE, Attach, Detach, Event,
    ProtocolError, SessionKey, Subscribe, Touch, Uid, encode,
)
from idled.protocol import Unwatch, Watch
from idled.protocol import check_device as _check_device
from idled.protocol import check_key as _check_key

__all__ = [
    "ping_interval", "default_ask_after", "asks_for_answer", "default_durable", "Backoff", "KeepaliveTimer",
    "GatewayBatcher", "ObserverCursor",
    "DEFAULT_FLUSH_INTERVAL", "DEFAULT_MAX_PENDING", "check_device", "check_key", "uid_chunks",
]

DEFAULT_FLUSH_INTERVAL: Final = 0.05  # seconds a touch may wait for company before it is sent
DEFAULT_MAX_PENDING: Final = 100_000  # uids buffered before a touch waits for the flush it triggers
_FRAME_OVERHEAD: Final = 64  # op, keys, keepalive, array header: generous, so a frame never exceeds the limit


def default_durable(after: int | None) -> bool:
    """An observer given a checkpoint (`after`, even 0) reads the durable view; one reading from now, the fast
    one. Checkpointing means the application keeps state that must agree with the log after any crash."""
    return after is not None


def default_ask_after(timeout: float) -> float:
    """Seconds after the last ping (or the welcome) at which a keepalive asks for an answer again: two
    timeouts, at least a second (at the default keepalive, one keepalive in three is a ping)."""
    return max(2.0 * timeout, 1.0)


def asks_for_answer(now: float, asked: float, ping_sent: float | None, ask_after: float) -> bool:
    """Whether the keepalive due at ``now`` is a ping (answered) rather than the quiet keepalive: no ping is
    outstanding (``ping_sent``), and the last one -- or the welcome -- (``asked``) is ``ask_after`` seconds old
    or older (0: always)."""
    return ping_sent is None and now - asked >= ask_after


def ping_interval(timeout: float | None, keepalive: float | None) -> float | None:
    """Seconds of silence after which to ping, or None when the connection needs no keepalive."""
    if timeout is None:
        return None
    interval = timeout / KEEPALIVE_FACTOR
    return interval if keepalive is None else min(keepalive, interval)


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2**n))."""

    base: float = 0.1
    cap: float = 30.0
    random: Callable[[], float] = random.random

    def delay(self, attempt: int) -> float:
        return self.random() * min(self.cap, self.base * 2 ** min(attempt, 62))


class KeepaliveTimer:
    """When to ping: `sent(now)` after every frame; `due(now)` says whether a ping is due; `deadline`."""

    __slots__ = ("interval", "last_sent")

    def __init__(self, interval: float | None, now: float) -> None:
        self.interval = interval
        self.last_sent = now

    def sent(self, now: float) -> None:
        self.last_sent = now

    @property
    def deadline(self) -> float | None:
        return None if self.interval is None else self.last_sent + self.interval

    def due(self, now: float) -> bool:
        deadline = self.deadline
        return deadline is not None and now >= deadline


def check_device(device: str | None) -> str | None:
    """`device` if the server accepts it (None, or a str of 1..MAX_DEVICE_BYTES UTF-8 bytes), else ValueError --
    raised where the caller can see it, rather than the server's ``bad_message`` (a final error) on the wire."""
    if device is None:
        return None
    try:
        return _check_device(device)
    except ProtocolError as exc:
        raise ValueError(exc.reason) from None


def check_key(key: SessionKey) -> SessionKey:
    """`key` if it is a valid session key -- a uid, or a tuple ``(uid, device)`` -- else ValueError. A list is
    refused too: keys are dict keys, and the server's ``ended`` reports the tuple."""
    try:
        return _check_key(key)
    except ProtocolError as exc:
        raise ValueError(exc.reason) from None


def _uid_size(uid: Uid) -> int:
    """Upper bound of a uid's msgpack size."""
    return 9 if type(uid) is int else len(uid.encode()) + 3  # type: ignore[union-attr]


def _key_size(key: SessionKey) -> int:
    """Upper bound of a session key's msgpack size: a uid, or the 2-array [uid, device]."""
    if type(key) is tuple:
        return 1 + _uid_size(key[0]) + len(key[1].encode()) + 3
    return _uid_size(key)  # type: ignore[arg-type]


class _Group:
    """One run of consecutive operations of one kind: the uids (an insertion-ordered dict used as a set) and
    what the frame carries beside them, ``arg``: an attach's keepalive, a touch's age, a detach's reason."""

    __slots__ = ("arg", "op", "uids")

    def __init__(self, op: str, arg: Any) -> None:
        self.op = op
        self.arg = arg
        self.uids: dict[SessionKey, None] = {}

    def encode(self, uids: list[SessionKey]) -> bytes:
        if self.op == "attach":
            return encode(Attach(tuple(uids), self.arg))
        return encode(Touch(tuple(uids), self.arg) if self.op == "touch" else Detach(tuple(uids), self.arg))


class GatewayBatcher:
    """Pending gateway operations and the live uids; see the module docstring.

    `max_pending` bounds the uids buffered (the driver flushes when `full`); `first_pending` is the time of
    the oldest pending operation, so the driver flushes at `first_pending + flush_interval`.
    """

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.max_pending = max_pending
        self.live: dict[SessionKey, float | None] = {}  # session key -> its keepalive
        self._groups: list[_Group] = []
        self.pending = 0
        self.first_pending: float | None = None

    @property
    def full(self) -> bool:
        return self.pending >= self.max_pending

    @property
    def attaching(self) -> bool:
        """Whether an attach is pending (an edge acknowledges the flush that carries one)."""
        return any(group.op == "attach" for group in self._groups)

    def _add(self, op: str, arg: Any, uids: Iterable[SessionKey], now: float) -> None:
        groups = self._groups
        if groups and (last := groups[-1]).op == op and last.arg == arg:
            group = last
        else:
            group = _Group(op, arg)
            groups.append(group)
            if self.first_pending is None:
                self.first_pending = now
        before = len(group.uids)
        group.uids.update(dict.fromkeys(uids))
        self.pending += len(group.uids) - before

    def attach(self, uids: Iterable[SessionKey], keepalive: float | None, now: float) -> None:
        # Checked here, where the caller can see it: the server answers a bad keepalive by closing the
        # connection, and the reconnect would send the same attach again.
        if keepalive is not None and not MIN_KEEPALIVE <= keepalive <= MAX_KEEPALIVE:
            raise ValueError(f"keepalive must be within {MIN_KEEPALIVE:g}..{MAX_KEEPALIVE:g} seconds, got {keepalive}")
        uids = tuple(uids)
        for uid in uids:
            self.live[uid] = keepalive
        self._add("attach", keepalive, uids, now)

    def touch(self, uids: Iterable[SessionKey], now: float, ago: float = 0.0) -> None:
        """Activity of these uids, read ``ago`` seconds before ``now`` (``Touch.ago``: 0, read just now)."""
        groups = self._groups
        if groups and groups[-1].op == "attach":
            attached = groups[-1].uids
            uids = [uid for uid in uids if uid not in attached]
            if not uids:
                return
        self._add("touch", ago, uids, now)

    def detach(self, uids: Iterable[SessionKey], now: float, reason: str | None = None) -> None:
        """These uids disconnected; `reason` (one of the protocol's `DETACH_REASONS`, e.g. an edge's ``logout``
        or ``closed``) is the offline reason the server records, None for its default (``detach``). Detaches
        of different reasons travel in separate frames, in order."""
        uids = tuple(uids)
        for uid in uids:
            self.live.pop(uid, None)
        self._add("detach", reason, uids, now)

    def forget(self, uids: Iterable[SessionKey]) -> None:
        """The server ended these sessions itself (idle, kicked): no longer live, not re-attached."""
        live = self.live
        for uid in uids:
            live.pop(uid, None)

    def take(self, max_frame: int = DEFAULT_MAX_FRAME) -> list[bytes]:
        """Every pending operation as frames of at most `max_frame` body bytes, in order; clears them."""
        frames: list[bytes] = []
        budget = max_frame - _FRAME_OVERHEAD
        if budget < MAX_UID_BYTES + MAX_DEVICE_BYTES + 7:  # the largest key: [uid, device]
            raise ValueError(f"max_frame {max_frame} is too small for a gateway frame")
        for group in self._groups:
            chunk: list[SessionKey] = []
            size = 0
            for uid in group.uids:
                n = _key_size(uid)
                if size + n > budget:
                    frames.append(group.encode(chunk))
                    chunk, size = [], 0
                chunk.append(uid)
                size += n
            if chunk:
                frames.append(group.encode(chunk))
        self._clear()
        return frames

    def _clear(self) -> None:
        self._groups = []
        self.pending = 0
        self.first_pending = None

    def reattach(self, now: float) -> None:
        """After a reconnect: drop what was pending; attach every live uid again (grouped by keepalive)."""
        self._clear()
        by_keepalive: dict[float | None, list[SessionKey]] = {}
        for uid, keepalive in self.live.items():
            by_keepalive.setdefault(keepalive, []).append(uid)
        for keepalive, uids in by_keepalive.items():
            self._add("attach", keepalive, uids, now)


def uid_chunks(uids: Iterable[Uid], max_frame: int = DEFAULT_MAX_FRAME) -> list[tuple[Uid, ...]]:
    """``uids`` in runs that each fit one frame of at most ``max_frame`` body bytes with its other fields."""
    budget = max_frame - _FRAME_OVERHEAD
    if budget < MAX_UID_BYTES + 3:
        raise ValueError(f"max_frame {max_frame} is too small for a frame of uids")
    chunks: list[tuple[Uid, ...]] = []
    chunk: list[Uid] = []
    size = 0
    for uid in uids:
        n = _uid_size(uid)
        if size + n > budget:
            chunks.append(tuple(chunk))
            chunk, size = [], 0
        chunk.append(uid)
        size += n
    if chunk:
        chunks.append(tuple(chunk))
    return chunks


class ObserverCursor:
    """The observer's position: `last` is the last seq delivered (None: none yet and subscribed from now).

    `durable`: subscribe to durable events only. None (the default) picks it from `after`: an observer that
    starts from a stored checkpoint keeps state across restarts, and only a durable view can never show it an
    event that a crash of the server then erases (see `default_durable`).

    `uids`: None for every event; else the watchlist (empty allowed), changed by `watch` / `unwatch`.
    """

    __slots__ = ("last", "durable", "uids")

    def __init__(self, after: int | None = None, durable: bool | None = None,
                 uids: Iterable[Uid] | None = None) -> None:
        if after is not None and after < 0:
            raise ValueError("after must be a seq (>= 0; 0 = from the first event ever)")
        self.last = after
        self.durable = default_durable(after) if durable is None else durable
        self.uids: dict[Uid, None] | None = None if uids is None else dict.fromkeys(uids)

    def subscribe(self) -> Subscribe:
        """What to send after (re)connecting: from last + 1, or from now if nothing was seen yet (with the
        whole watchlist, if any: see `subscribe_frames` for one that may not fit a frame)."""
        uids = None if self.uids is None else tuple(self.uids)
        return Subscribe(None if self.last is None else self.last + 1, self.durable, uids)

    def subscribe_frames(self, max_frame: int = DEFAULT_MAX_FRAME) -> list[bytes]:
        """`subscribe()` as frames of at most ``max_frame`` body bytes: the watchlist's first parts as `watch`
        frames, then the subscribe with the last part (see the module docstring)."""
        subscribe = self.subscribe()
        if not subscribe.uids:
            return [encode(subscribe)]
        *first, last = uid_chunks(subscribe.uids, max_frame)
        return [*(encode(Watch(chunk)) for chunk in first),
                encode(Subscribe(subscribe.from_seq, subscribe.durable, last))]

    def _watchlist(self) -> dict[Uid, None]:
        if self.uids is None:
            raise ValueError("not a watchlist observer: give it uids (an empty list is one) to watch uids")
        return self.uids

    def watch(self, uids: Iterable[Uid]) -> list[bytes]:
        """Add ``uids`` to the watchlist; the `watch` frames that tell the server (at most ``DEFAULT_MAX_FRAME``
        body bytes each)."""
        watchlist = self._watchlist()
        uids = tuple(dict.fromkeys(uids))
        watchlist.update(dict.fromkeys(uids))
        return [encode(Watch(chunk)) for chunk in uid_chunks(uids)]

    def unwatch(self, uids: Iterable[Uid]) -> list[bytes]:
        """Remove ``uids`` from the watchlist; the `unwatch` frames that tell the server."""
        watchlist = self._watchlist()
        uids = tuple(dict.fromkeys(uids))
        for uid in uids:
            watchlist.pop(uid, None)
        return [encode(Unwatch(chunk)) for chunk in uid_chunks(uids)]

    def accept(self, event: Event) -> bool:
        """True if `event` is new (and advance); False for a duplicate of something already delivered."""
        last = self.last
        if last is not None and event.seq <= last:
            return False
        self.last = event.seq
        return True
