"""Measure what a durable subscription costs: login -> `online` event latency, durable vs fast, same events.

Two observers watch at once, one with ``durable=True`` and one with ``durable=False``; a user logs in N
times, one at a time, and each login's `online` event is timed from just before the login was sent to its
arrival at each observer. Run it against an `idled serve` started with the `--fsync` policy to measure:
under ``always`` the durable view waits for the batch's fdatasync, under ``interval`` for the next periodic
sync, under ``never`` for the write into the page cache.

    python examples/observer_latency.py --idled-port 7878 [--logins 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import trio

from idled.client import Observer
from idled.client.trio import open_observer, open_session


async def arrivals(observer: Observer, uid: str, logins: int, times: list[float]) -> None:
    async for event in observer:
        if event.uid == uid and event.kind == "online":
            times.append(time.perf_counter())
            if len(times) == logins:
                return


def report(name: str, sent: list[float], arrived: list[float]) -> None:
    ms = sorted((a - s) * 1000 for s, a in zip(sent, arrived))
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"{name:>8}: p50 {statistics.median(ms):8.2f} ms   p99 {p99:8.2f} ms   max {ms[-1]:8.2f} ms   (n={len(ms)})")


async def main(args: argparse.Namespace) -> None:
    host, port, uid = args.idled_host, args.idled_port, f"latency-{time.time_ns()}"
    sent: list[float] = []
    durable_at: list[float] = []
    fast_at: list[float] = []
    async with open_observer(host, port, "latency-durable", durable=True) as durable, \
            open_observer(host, port, "latency-fast", durable=False) as fast, trio.open_nursery() as nursery:
        nursery.start_soon(arrivals, durable, uid, args.logins, durable_at)
        nursery.start_soon(arrivals, fast, uid, args.logins, fast_at)
        for i in range(args.logins):
            sent.append(time.perf_counter())
            async with open_session(host, port, uid, keepalive=30):
                while len(durable_at) <= i or len(fast_at) <= i:  # one login in flight at a time
                    await trio.sleep(0.0005)
    report("fast", sent, fast_at)
    report("durable", sent, durable_at)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idled-host", default="127.0.0.1")
    parser.add_argument("--idled-port", type=int, default=7878)
    parser.add_argument("--logins", type=int, default=300)
    trio.run(main, parser.parse_args())
