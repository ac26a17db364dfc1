"""The benchmark's scenario driven through the Python client's `Gateway` (idled.client.trio): the twin of
gateway.ts, so the two gateways' CPU per attach and per touch compare as ratios in one run.

Theory of operation
-------------------
The scenario file (written by bench.py) names N sessions, uids ``uid_base + i``, keepalive K, jitter j, the
start ``t0`` and the stop (wall unix seconds), and the plan's special sessions ``[i, kind, moment]`` (kind 1:
silent, 2: bye; moment in seconds after t0). At t0 the driver attaches every session, one `attach([uid], K)`
call each (what a server does as its users connect), and flushes: that span of process CPU time over N is the
CPU per attach. Then a timing wheel of `tick`-second slots touches each session on its own schedule, one
`touch([uid])` call per session -- the first at a random phase within K, then every K * U(1 - j, 1 + j) --
recording the wall time of its last two calls. A silent session is dropped at its first slot after its
moment (its last call time is recorded); a bye session is detached there. The process CPU time from the end of
the attach to the stop, over the touches made, is the CPU per touch (timers and notices included: the cost of
running a gateway, per touch). ``ended`` notices for sessions that were still being touched are recorded with
their last two touch times, for the checker to judge (bench.py: `idled.tools.loadtest.stats.Matcher`).
"""

from __future__ import annotations

import json
import math
import random
import resource
import sys
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from idled.client.core import Backoff
from idled.client.trio import open_gateway

SILENT, BYE = 1, 2


def cpu() -> float:
    """User + system CPU seconds of this process (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def drive(spec: dict[str, Any]) -> dict[str, Any]:
    n, base, keepalive, jitter, width = (spec["sessions"], spec["uid_base"], spec["keepalive"], spec["jitter"],
                                         spec["tick"])
    special = {int(i): (int(kind), float(moment)) for i, kind, moment in spec["special"]}
    rng = random.Random(spec["seed"])
    prev, last = array("d", bytes(8 * n)), array("d", bytes(8 * n))
    stopped = bytearray(n)  # 1: silent or detached (no longer touched)
    closed: list[list[Any]] = []
    ended: Counter[str] = Counter()

    def on_ended(keys: tuple[Any, ...], reason: str) -> None:
        at = time.time()
        ended[reason] += len(keys)
        for key in keys:
            i = key - base if type(key) is int else -1
            if 0 <= i < n and not stopped[i]:
                closed.append([i, prev[i], last[i], at, f"ended:{reason}"])

    result: dict[str, Any] = {"lang": "python", "sessions": n}
    async with open_gateway(spec["host"], spec["port"], spec["name"], on_ended=on_ended,
                            backoff=Backoff(0.05, 1.0)) as gateway:
        await trio.sleep(max(0.0, spec["t0"] - time.time()))
        cpu0, wall0 = cpu(), time.time()
        for i in range(n):
            await gateway.attach([base + i], keepalive)
            prev[i] = last[i] = time.time()
            if i % 1000 == 999:
                await trio.lowlevel.checkpoint()  # let the reader run, as a server accepting connections would
        await gateway.flush()
        cpu1, wall1 = cpu(), time.time()
        result.update(attached=n, attach_cpu=cpu1 - cpu0, attach_wall=wall1 - wall0)

        slots = int(math.ceil(keepalive * (1.0 + jitter) / width)) + 3
        ring: list[list[int]] = [[] for _ in range(slots)]
        for i in range(n):
            ring[(1 + int(keepalive * (0.05 + 0.95 * rng.random()) / width)) % slots].append(i)
        silent: list[list[float]] = []
        bye: list[list[float]] = []
        touches = 0
        start = trio.current_time()
        slot = 0
        t0, stop = spec["t0"], spec["stop"]
        while time.time() < stop:
            slot += 1
            await trio.sleep_until(start + slot * width)
            due, ring[slot % slots] = ring[slot % slots], []
            now = time.time()
            rel = now - t0
            for i in due:
                entry = special.get(i)
                if entry is not None and rel >= entry[1]:
                    stopped[i] = 1
                    if entry[0] == SILENT:
                        silent.append([i, last[i]])
                    else:
                        await gateway.detach([base + i])
                        bye.append([i, time.time()])
                    continue
                await gateway.touch([base + i])
                prev[i], last[i] = last[i], time.time()
                touches += 1
                ring[(slot + max(1, int(keepalive * (1.0 - jitter + 2.0 * jitter * rng.random()) / width)))
                     % slots].append(i)
        await gateway.flush()
        cpu2 = cpu()
        result.update(touches=touches, touch_cpu=cpu2 - cpu1, touch_wall=time.time() - wall1, silent=silent,
                      bye=bye, closed=closed, ended=dict(ended), connections=gateway.connections,
                      frames_sent=gateway.frames_sent, rss_max_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      last_error=None if gateway.last_error is None else str(gateway.last_error))
    return result


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = trio.run(drive, spec)
    Path(spec["result"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
