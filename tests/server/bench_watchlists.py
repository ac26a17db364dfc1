"""What a watchlist observer costs the server, against a full-stream observer: CPU per delivered event at
1M events/minute with 1 % of the events matching its watchlist.

Not a test (no `test_` prefix: pytest does not collect it); a benchmark that prints figures:

    PYTHONPATH=. python tests/server/bench_watchlists.py [--rate 16700] [--seconds 10] [--rounds 3]
        [--uids 100000] [--match 0.01] [--period 0.005]

The server side is the daemon's own bus and observer role (``EventBus``, ``Observers``) behind a real
loopback listener, in this process; a publisher task calls ``bus.publish`` at ``--rate`` events per second
(every ``--period`` seconds, the events then due: bursts of ~84 at the default rate), for uids drawn at random
from ``--uids``; a task drains the log writer's channel (no disk: the same in every run). The observers are
real TCP clients in a *child process* (so their reading costs this process nothing): one full-stream
observer and/or one watchlist observer of ``--match`` x ``--uids`` uids, each counting the events it
receives. Each round runs five configurations for ``--seconds`` each, interleaved so a noisy neighbour
hits them alike -- nothing, full only, watchlist only, both, and a *silent* watchlist (as many uids, none of
which ever has an event) -- and measures this process's CPU time (``time.process_time``: the event loop,
the frames, the sockets' system time) over the run. Attributed:

* full observer      = CPU(full) - CPU(nothing), over the events the full observer received;
* watchlist observer = CPU(watchlist) - CPU(nothing), and CPU(both) - CPU(full), over the events it received;
* silent watchlist   = CPU(silent) - CPU(nothing): what the event rate alone costs a watchlist observer.

Process CPU differences of a few ms/s are within the noise of a shared machine, so the run first times the
publish path alone (no sockets, no event loop turns: ``bus.publish`` of pre-built events, best of several
interleaved passes) with no watchlist observer, a silent one and a 1 % one -- the per-event price of the
index -- and also
each task's steps on the event loop (a trio ``Instrument`` reading ``time.thread_time`` around every step):
the CPU of each observer's sender task -- its wake-ups, frames and socket writes -- per delivered event, in
the same run ("both"), which is the direct figure. The medians of the rounds are printed, with the
watchlist observer's cost per delivered event as a ratio of the full one's, and what serving the same uids
by filtering a full stream would cost per useful event (the full observer's cost over the matching events).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

from idled.core.factory import make_detector
from idled.core.presence import PresenceEvent, PresenceTable
from idled.log.eventlog import EventLog
from idled.protocol import PING, PONG, Event, FrameDecoder, Login, Subscribe, Welcome, encode, parse_server_message
from idled.protocol import Watch, receive_message
from idled.server.engine.bus import EventBus
from idled.server.roles.observers import Observers

WARMUP = 1.0  # seconds published before the CPU is measured
CONFIGS = ("nothing", "full", "watchlist", "both", "silent")
KINDS = {"nothing": [], "full": ["full"], "watchlist": ["watchlist"], "both": ["full", "watchlist"],
         "silent": ["silent"]}


class TaskCPU(trio.abc.Instrument):
    """Thread CPU time of every task step, summed per label: ``sender:NAME`` and ``requests:NAME`` for an
    observer's two tasks, ``publisher``, ``other``."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.steps: dict[str, int] = collections.defaultdict(int)
        self._labels: dict[trio.lowlevel.Task, str] = {}
        self._started = 0.0

    def reset(self) -> None:
        self.cpu.clear()
        self.steps.clear()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        label = self._labels.get(task)
        if label is None:
            label = self._labels[task] = _label(task)
        self.cpu[label] += time.thread_time() - self._started
        self.steps[label] += 1


def _label(task: trio.lowlevel.Task) -> str:
    frame = getattr(task.coro, "cr_frame", None)
    code = getattr(task.coro, "cr_code", None)
    name = code.co_name if code is not None else "?"
    peer = frame.f_locals.get("peer") if frame is not None else None
    if name == "_sender" and peer is not None:
        return f"sender:{peer.name}"
    if name == "run" and frame is not None and "login" in frame.f_locals:
        return f"requests:{frame.f_locals['login'].name}"
    return "publisher" if name == "publisher" else "other"


def uid_of(i: int) -> str:
    return f"user-{i}"


# ---------------------------------------------------------------------------------- the observers' process


async def observe(port: int, kind: str, uids: list[str], counts: dict[str, int], ready: trio.Event) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    decoder = FrameDecoder(1 << 24, parse=parse_server_message)
    await stream.send_all(encode(Login("observer", kind)))
    assert isinstance(await receive_message(stream, decoder), Welcome)
    frames = []
    if kind != "full":  # the list as the client library sends one longer than a frame
        if kind == "silent":
            uids = [f"nobody-{i}" for i in range(len(uids))]
        chunks = [tuple(uids[i:i + 200]) for i in range(0, len(uids), 200)]
        frames = [encode(Watch(chunk)) for chunk in chunks]
    frames.append(encode(Subscribe(uids=None if kind == "full" else ())))
    await stream.send_all(b"".join(frames) + encode(PING))
    while (message := await receive_message(stream, decoder)) is not PONG:
        pass
    ready.set()
    n = 0
    while True:
        message = await receive_message(stream, decoder)
        if message is None:
            break
        if type(message) is Event:
            n += 1
            counts[kind] = n


async def observers_main(port: int, kinds: list[str], uids: list[str]) -> None:
    counts = {kind: 0 for kind in kinds}
    async with trio.open_nursery() as nursery:
        readies = []
        for kind in kinds:
            ready = trio.Event()
            readies.append(ready)
            nursery.start_soon(observe, port, kind, uids, counts, ready)
        for ready in readies:
            await ready.wait()
        print("READY", flush=True)
        # Counts at the start and at the end of the measured window, on request (a line on stdin).
        for _ in range(2):
            await trio.to_thread.run_sync(sys.stdin.readline)
            print(json.dumps(counts), flush=True)
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------------- the server's process


def publish_path(args: argparse.Namespace, watched: list[str], events: int = 200_000, passes: int = 5) -> None:
    """Microseconds per ``bus.publish``: no watchlist, a silent one, one of ``watched`` (queue emptied as it
    fills, as its sender would)."""
    from idled.server.engine.bus import Subscription

    rng = random.Random(3)
    batch = [PresenceEvent(seq, "online", uid_of(rng.randrange(args.uids)), 1.7e9, "login", 1.7e9, 1.7e9 + 30,
                           30.0, "ring-lazy") for seq in range(1, events + 1)]
    best: dict[str, float] = {}

    async def one(kind: str) -> float:
        bus = EventBus()
        bus.start(1)
        subscription = Subscription()
        if kind != "none":
            bus.watch(subscription, watched if kind == "1 %" else [f"nobody-{i}" for i in range(len(watched))])
            bus.subscribe(subscription, None)
        queue = subscription.queue
        publish = bus.publish
        started = time.process_time()
        for event in batch:
            publish(event)
            if len(queue) > 64:
                queue.clear()
                subscription.queue_bytes = 0
        elapsed = time.process_time() - started
        bus.close_log()
        return elapsed / events * 1e6

    for _ in range(passes):
        for kind in ("none", "silent", "1 %"):
            best[kind] = min(best.get(kind, math.inf), trio.run(one, kind))
    print(f"publish path (best of {passes} x {events:,} publishes): no watchlist {best['none']:.3f} us, "
          f"silent watchlist {best['silent']:.3f} us (+{best['silent'] - best['none']:.3f}), 1 % watchlist "
          f"{best['1 %']:.3f} us (+{best['1 %'] - best['none']:.3f}) per event", flush=True)


async def serve(args: argparse.Namespace, config: str, tasks: TaskCPU) -> dict[str, Any]:
    bus = EventBus()
    presence = PresenceTable(make_detector("ring-lazy", timeout=30), tick=1.0, timeout=30.0, max_timeout=3600.0,
                             detector_name="ring-lazy")
    with tempfile.TemporaryDirectory() as directory:
        observers = Observers(presence, bus, EventLog(directory), first_seq=1, peers=set())

        async def handle(stream: trio.SocketStream) -> None:
            decoder = FrameDecoder(4096)
            login = await receive_message(stream, decoder)
            assert isinstance(login, Login)
            await observers.run(stream, decoder, login)

        async def drain_log() -> None:
            async for _ in bus.log_receive:
                pass

        rng = random.Random(7)
        seq = 1

        def publish(count: int) -> None:
            nonlocal seq
            now = time.time()
            for _ in range(count):
                uid = uid_of(rng.randrange(args.uids))
                bus.publish(PresenceEvent(seq, "online" if seq & 1 else "offline", uid, now, "login", now,
                                          now + 30.0, 30.0, "ring-lazy"))
                seq += 1

        async def publisher(stop_at: float) -> None:
            started = trio.current_time()
            published = 0
            while (now := trio.current_time()) < stop_at:
                due = int((now - started) * args.rate) - published
                publish(due)
                published += due
                await trio.sleep(args.period)

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, handle, 0)
            port = listeners[0].socket.getsockname()[1]
            nursery.start_soon(drain_log)
            child = subprocess.Popen([sys.executable, __file__, "--observers", str(port), *KINDS[config]],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert child.stdin is not None and child.stdout is not None
            assert await trio.to_thread.run_sync(child.stdout.readline) == "READY\n"
            start = trio.current_time()
            nursery.start_soon(publisher, start + WARMUP + args.seconds)
            await trio.sleep(WARMUP)
            child.stdin.write("\n")
            child.stdin.flush()
            before = json.loads(await trio.to_thread.run_sync(child.stdout.readline))
            tasks.reset()
            cpu0, seq0, wall0 = time.process_time(), seq, time.perf_counter()
            await trio.sleep(args.seconds)
            cpu1, seq1, wall1 = time.process_time(), seq, time.perf_counter()
            task_cpu, steps = dict(tasks.cpu), dict(tasks.steps)
            await trio.sleep(0.2)  # what was published in the window reaches the observers
            child.stdin.write("\n")
            child.stdin.flush()
            after = json.loads(await trio.to_thread.run_sync(child.stdout.readline))
            await trio.to_thread.run_sync(child.wait)
            nursery.cancel_scope.cancel()
    return {
        "cpu": cpu1 - cpu0, "published": seq1 - seq0, "wall": wall1 - wall0,
        "delivered": {kind: after[kind] - before[kind] for kind in after}, "tasks": task_cpu, "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=16_700.0, help="events per second (default 16700: 1M/min)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the five runs (default 3; 0: the publish path only)")
    parser.add_argument("--uids", type=int, default=100_000, help="distinct uids of the events (default 100000)")
    parser.add_argument("--match", type=float, default=0.01, help="share of the uids watched (default 0.01)")
    parser.add_argument("--period", type=float, default=0.005,
                        help="seconds between two bursts of events (default 0.005: ~84 events a burst)")
    parser.add_argument("--observers", nargs="+", help=argparse.SUPPRESS)  # the child: PORT KIND...
    args = parser.parse_args()
    watched = [uid_of(i) for i in random.Random(11).sample(range(args.uids), int(args.uids * args.match))]
    if args.observers:
        trio.run(observers_main, int(args.observers[0]), args.observers[1:], watched)
        return
    print(f"{args.rate:,.0f} events/s over {args.uids:,} uids in bursts every {args.period * 1000:g} ms, watchlist "
          f"of {len(watched):,} uids ({args.match:.1%}), {args.seconds:g} s per run, {args.rounds} rounds", flush=True)
    publish_path(args, watched)
    if args.rounds < 1:
        return
    results: dict[str, list[dict[str, Any]]] = {config: [] for config in CONFIGS}
    for round_ in range(args.rounds):
        for config in CONFIGS:
            tasks = TaskCPU()
            result = trio.run(serve, args, config, tasks, instruments=[tasks])
            results[config].append(result)
            senders = {k[7:]: f"{v * 1000 / result['wall']:.1f}" for k, v in result["tasks"].items()
                       if k.startswith("sender:")}
            print(f"  round {round_ + 1} {config:9s}: {result['cpu'] * 1000 / result['wall']:6.1f} ms CPU/s, "
                  f"published {result['published'] / result['wall']:,.0f}/s, delivered {result['delivered']}, "
                  f"sender tasks {senders} ms CPU/s", flush=True)

    def per_second(config: str) -> float:
        """Median CPU seconds per wall second of a configuration."""
        return statistics.median(r["cpu"] / r["wall"] for r in results[config])

    def delivered(config: str, kind: str) -> float:
        return statistics.median(r["delivered"][kind] / r["wall"] for r in results[config])

    def task(config: str, label: str) -> float:
        """Median CPU seconds per wall second of one task (label) in a configuration."""
        return statistics.median(r["tasks"].get(label, 0.0) / r["wall"] for r in results[config])

    base, full, watch, both, silent = (per_second(c) for c in CONFIGS)
    full_events, watch_events = delivered("full", "full"), delivered("watchlist", "watchlist")
    full_us = (full - base) / full_events * 1e6
    watch_alone_us = (watch - base) / watch_events * 1e6
    watch_beside_us = (both - full) / delivered("both", "watchlist") * 1e6
    print(f"publisher alone (bus, frames, log channel): {base * 1000:.1f} ms CPU per second")
    print(f"full-stream observer: {(full - base) * 1000:.1f} ms CPU/s for {full_events:,.0f} events/s = "
          f"{full_us:.2f} us per delivered event")
    print(f"watchlist observer alone: {(watch - base) * 1000:.1f} ms CPU/s for {watch_events:,.0f} events/s = "
          f"{watch_alone_us:.2f} us per delivered event ({watch_alone_us / full_us:.1f}x the full observer's)")
    print(f"watchlist observer beside the full one: {(both - full) * 1000:.1f} ms CPU/s = "
          f"{watch_beside_us:.2f} us per delivered event ({watch_beside_us / full_us:.1f}x)")
    print(f"silent watchlist (no event matches): {(silent - base) * 1000:.1f} ms CPU/s")
    print(f"the same uids filtered from a full stream (client side): {full_us * full_events / watch_events:.1f} us "
          f"of server CPU per useful event ({full_events / watch_events:.0f}x the events sent)")
    both_full, both_watch = delivered("both", "full"), delivered("both", "watchlist")
    full_task, watch_task = task("both", "sender:full"), task("both", "sender:watchlist")
    full_task_us, watch_task_us = full_task / both_full * 1e6, watch_task / both_watch * 1e6
    print(f"sender task CPU, same runs (both): full {full_task * 1000:.1f} ms/s = {full_task_us:.2f} us per "
          f"delivered event ({statistics.median(r['steps'].get('sender:full', 0) / r['wall'] for r in results['both']):,.0f} "
          f"steps/s); watchlist {watch_task * 1000:.2f} ms/s = {watch_task_us:.2f} us per delivered event "
          f"({watch_task_us / full_task_us:.1f}x); silent watchlist's sender "
          f"{task('silent', 'sender:silent') * 1e6:.0f} us/s")
    print(f"per useful event, watchlist vs filtering the full stream: {watch_task_us:.1f} vs "
          f"{full_task_us * both_full / both_watch:.1f} us ({full_task_us * both_full / both_watch / watch_task_us:.1f}x "
          f"cheaper)")


if __name__ == "__main__":
    main()
