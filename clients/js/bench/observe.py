"""The benchmark's independent observer: a process of its own that records every presence event idled publishes.

It subscribes from seq 1 (``after=0``, the fast view: every event, in seq order, none missed however late it
joined), writes one line per event -- ``kind uid ts reason deadline last_seen`` (uid as its msgpack int) -- to
`out`, touches `ready` once its subscription is set up, and stops by itself at the wall time `until`.
Neither gateway's own bookkeeping is read here: what the checker compares against is what the daemon said.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import trio

from idled.client.trio import open_observer


async def record(host: str, port: int, out: Path, ready: Path, until: float) -> int:
    count = 0
    with out.open("w", buffering=1 << 20) as sink:
        async with open_observer(host, port, "bench-observer", after=0, durable=False, buffer=65536) as observer:
            with trio.move_on_after(max(0.0, until - time.time())):
                while observer.settled == 0:
                    await trio.sleep(0.01)
                ready.touch()  # noqa: ASYNC240 -- one tiny file, once, before the events flow
                async for e in observer:
                    sink.write(f"{e.kind} {e.uid} {e.ts!r} {e.reason} {e.deadline!r} {e.last_seen!r}\n")
                    count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--until", type=float, required=True, help="wall time (unix seconds) to stop at")
    args = parser.parse_args()
    if not math.isfinite(args.until):
        parser.error("--until must be a time")
    count = trio.run(record, args.host, args.port, args.out, args.ready, args.until)
    print(f"observer: {count} events recorded")


if __name__ == "__main__":
    main()
