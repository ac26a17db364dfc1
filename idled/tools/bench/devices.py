"""`idled bench --devices`: what a device costs -- plain uid keys against (uid, device) keys, in one run.

Theory of operation
-------------------
A session key is a plain uid (every client that sends no device) or the tuple ``(uid, device)``
(``idled.core.presence``). The table's keepalive is one dict lookup whatever the key, but a tuple key is
hashed and compared element by element, and a device session keeps a tuple, a device string and, per user,
a list of its keys. This mode measures that difference through the server's own objects, each figure for
both kinds of key in the same process, alternating, so that the machine's state is the same for both:

* keys come from the wire: each round decodes a msgpack array of N keys (``"u<i>"``, or ``["u<i>",
  "phone"]``), as a gateway frame or N user frames would, so every key is a fresh object whose hash is not
  cached yet -- exactly what ``touch`` gets from a frame. Decoding is not timed.
* ``touch``: ``PresenceTable.touch(key, now)`` over N live sessions (a ``ring-lazy`` table, the server's
  default), every key once per round, timed per round with the collector off; the best of ``--rounds``
  rounds per kind, reported in ns per touch. The ratio device / plain (target <= 1.1) is the median of the
  rounds' own ratios: each round times both kinds back to back, so a busy moment of a shared machine
  weighs on both sides of one ratio, not on one side of the comparison.
* ``parse``: the protocol's validation of a touch frame's keys (``_key_list``), ns per key, same rounds.
* ``login``: N logins into an empty table (one device per user), ns per login, best of the rounds.
* ``bytes/session``: tracemalloc over the logins of N sessions, the keys included (decoded inside the
  trace): what the process holds per session, plain and with a device.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgpack

from idled.core.factory import make_detector
from idled.core.presence import PresenceTable, ticks_for
from idled.protocol.parse import _key_list
from idled.tools.bench.detectors import CLOCKS

__all__ = ["DEFAULT_ROUNDS", "DEFAULT_SIZES", "report_lines"]

DEFAULT_SIZES = (100_000,)
DEFAULT_ROUNDS = 15
TARGET_RATIO = 1.1
TIMEOUT = 30.0
TICK = 1.0
DEVICE = "phone"
KINDS = ("plain", "device")
Clock = Callable[[], int]


class _Owner:
    __slots__ = ()

    def release(self, uid: Any, code: str, reason: str) -> None:  # nobody is released here
        pass


def _packed_keys(size: int, kind: str) -> bytes:
    if kind == "plain":
        return msgpack.packb([f"u{i}" for i in range(size)])
    return msgpack.packb([[f"u{i}", DEVICE] for i in range(size)])


def _decode(packed: bytes) -> tuple[Any, ...]:
    """Fresh key objects, as a frame decodes them (arrays as tuples)."""
    keys: tuple[Any, ...] = msgpack.unpackb(packed, use_list=False, raw=False)
    return keys


def _table(size: int, max_devices: int = 8) -> PresenceTable:
    detector = make_detector("ring-lazy", timeout=ticks_for(TIMEOUT, TICK), slots=30)
    return PresenceTable(detector, tick=TICK, timeout=TIMEOUT, max_timeout=3600.0, detector_name="ring-lazy",
                         max_devices=max_devices)


def _login_all(table: PresenceTable, keys: Sequence[Any], owner: _Owner) -> None:
    login = table.login
    for key in keys:
        login(key, owner, 0.0, 0.0)


def _time_touches(table: PresenceTable, keys: Sequence[Any], now: float, clock: Clock) -> int:
    touch = table.touch
    started = clock()
    for key in keys:
        touch(key, now)
    return clock() - started


def measure(size: int, rounds: int, clock: Clock) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """ns per touch / parsed key / login for each kind of key (best of ``rounds``, alternating kinds), and the
    median over the rounds of each round's device / plain ratio."""
    packed = {kind: _packed_keys(size, kind) for kind in KINDS}
    owner = _Owner()
    tables = {}
    for kind in KINDS:
        tables[kind] = _table(size)
        _login_all(tables[kind], _decode(packed[kind]), owner)
    best: dict[str, dict[str, float]] = {kind: {"touch": float("inf"), "parse": float("inf"), "login": float("inf")}
                                         for kind in KINDS}
    ratios: dict[str, list[float]] = {"touch": [], "parse": [], "login": []}
    enabled = gc.isenabled()
    try:
        for r in range(rounds):
            this: dict[str, dict[str, float]] = {}
            for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                got = this[kind] = {}
                keys = _decode(packed[kind])
                gc.disable()
                got["touch"] = _time_touches(tables[kind], keys, 1.0 + r, clock) / size
                keys = _decode(packed[kind])
                started = clock()
                _key_list(keys)
                got["parse"] = (clock() - started) / size
                keys = _decode(packed[kind])
                table = _table(size)
                started = clock()
                _login_all(table, keys, owner)
                got["login"] = (clock() - started) / size
                del table, keys
                if enabled:
                    gc.enable()
                gc.collect()
                for what, ns in got.items():
                    best[kind][what] = min(best[kind][what], ns)
            for what in ratios:
                ratios[what].append(this["device"][what] / this["plain"][what])
    finally:
        if enabled:
            gc.enable()
    return best, {what: statistics.median(values) for what, values in ratios.items()}


def bytes_per_session(size: int, kind: str) -> float:
    """Traced bytes per session over ``size`` logins, the decoded keys included."""
    packed = _packed_keys(size, kind)
    owner = _Owner()
    gc.collect()
    tracemalloc.start()
    try:
        table = _table(size)
        before = tracemalloc.get_traced_memory()[0]
        keys = _decode(packed)
        _login_all(table, keys, owner)
        del keys  # the table keeps what it needs of them
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(table) == size
    return (after - before) / size


def report_lines(sizes: Sequence[int], *, rounds: int, clock_name: str, memory: bool) -> Iterator[str]:
    clock = CLOCKS[clock_name]
    yield (f"idled bench --devices: plain uid keys vs (uid, device) keys, same run, best of {rounds} alternating "
           f"rounds, ring-lazy, {clock_name} clock, collector off while timed, python {sys.version.split()[0]}")
    yield (f"{'size':>9}  {'key':<7} {'touch_ns':>8} {'parse_ns':>8} {'login_ns':>8} {'bytes/session':>13}")
    for size in sizes:
        best, ratio = measure(size, rounds, clock)
        memory_of = {kind: bytes_per_session(size, kind) if memory else 0.0 for kind in KINDS}
        for kind in KINDS:
            b = best[kind]
            yield (f"{size:>9,}  {kind:<7} {b['touch']:>8.1f} {b['parse']:>8.1f} {b['login']:>8.1f} "
                   f"{memory_of[kind]:>13.1f}")
        verdict = "ok" if ratio["touch"] <= TARGET_RATIO else "ABOVE TARGET"
        yield (f"{'':>9}  device/plain (median of the rounds' ratios): touch {ratio['touch']:.2f}x (target <= {TARGET_RATIO}: {verdict}), "
               f"parse {ratio['parse']:.2f}x, login {ratio['login']:.2f}x"
               + (f", memory +{memory_of['device'] - memory_of['plain']:.0f} bytes/session" if memory else ""))
