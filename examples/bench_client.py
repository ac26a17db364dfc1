"""Measure the client library against the raw codec, in one run against one local `idled serve`.

1. Keepalive: S sessions that keep themselves alive (`open_session`, pinging every 0.1 s) vs S bare trio
   streams pinging on their own timer and reading their pongs: this process's CPU time per ping (CPU time,
   not wall time: the server and other load only add noise to wall time).
2. Observed events: one observer replays the same M events (subscribe from 1) through the raw codec, the
   trio client and the asyncio client: events per CPU second of this process, each.
3. Gateway: touches/s one gateway client pushes into the server (single-uid `touch` calls, batched by the
   client), wall time until the last batch is written to the socket (TCP back-pressure ties it to the
   server's pace; the server's own processing of the last batch is not included).

    python examples/bench_client.py --idled-port 7878 [--events 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from contextlib import AsyncExitStack

import trio

import idled.client.asyncio as aio_client
import idled.client.trio as trio_client
from idled.protocol import (
    PING_FRAME, Event, FrameDecoder, Login, Pong, Subscribe, Welcome, encode, parse_server_message, receive_message,
)


async def raw_keepalives(host: str, port: int, sessions: int, keepalive: float, duration: float) -> tuple[float, int]:
    """`sessions` bare connections, each pinging every `keepalive` s and reading its pong: (CPU s, pings)."""
    pings = 0

    async def one(i: int) -> None:
        nonlocal pings
        stream = await trio.open_tcp_stream(host, port)
        decoder = FrameDecoder(1 << 24, parse=parse_server_message)
        await stream.send_all(encode(Login("uid", f"raw-{i}", None, keepalive)))
        assert isinstance(await receive_message(stream, decoder), Welcome)
        with trio.move_on_after(duration):
            while True:
                await trio.sleep(keepalive)
                await stream.send_all(PING_FRAME)
                pings += 1
                assert type(await receive_message(stream, decoder)) is Pong
        await stream.aclose()

    start = time.process_time()
    async with trio.open_nursery() as nursery:
        for i in range(sessions):
            nursery.start_soon(one, i)
    return time.process_time() - start, pings


async def client_keepalives(host: str, port: int, sessions: int, keepalive: float, duration: float) -> tuple[float, int]:
    """The same through `open_session` (which pings by itself every `keepalive` s): (CPU s, pings)."""
    start = time.process_time()
    async with AsyncExitStack() as stack:
        opened = [await stack.enter_async_context(trio_client.open_session(host, port, f"client-{i}", keepalive=keepalive))
                  for i in range(sessions)]
        await trio.sleep(duration)
        pings = sum(session.pings for session in opened)
        assert all(session.connections == 1 for session in opened), "a session reconnected"
    return time.process_time() - start, pings


async def make_events(host: str, port: int, uids: int) -> int:
    """2 * uids events (attach, then detach everything); returns the last seq."""
    async with trio_client.open_observer(host, port, "bench-probe") as probe, \
            trio_client.open_gateway(host, port, "bench-gen") as gateway:
        await gateway.attach(range(uids), keepalive=3600)
        await gateway.detach(range(uids))
        await gateway.flush()
        last = 0
        async for event in probe:
            last = event.seq
            if event.reason == "detach" and event.uid == uids - 1:
                return last
    raise AssertionError("no events")


async def raw_observe(host: str, port: int, last: int) -> float:
    stream = await trio.open_tcp_stream(host, port)
    decoder = FrameDecoder(1 << 24, parse=parse_server_message)
    await stream.send_all(encode(Login("observer", "bench-raw", None, None)))
    assert isinstance(await receive_message(stream, decoder), Welcome)
    start = time.process_time()
    await stream.send_all(encode(Subscribe(1)))
    while True:
        message = await receive_message(stream, decoder)
        if type(message) is Event and message.seq >= last:
            break
    elapsed = time.process_time() - start
    await stream.aclose()
    return elapsed


async def trio_observe(host: str, port: int, last: int) -> float:
    start = time.process_time()
    async with trio_client.open_observer(host, port, "bench-trio", after=0) as observer:
        async for event in observer:
            if event.seq >= last:
                return time.process_time() - start
    raise AssertionError("stream ended")


async def asyncio_observe(host: str, port: int, last: int) -> float:
    start = time.process_time()
    async with aio_client.open_observer(host, port, "bench-asyncio", after=0) as observer:
        async for event in observer:
            if event.seq >= last:
                return time.process_time() - start
    raise AssertionError("stream ended")


async def gateway_touches(host: str, port: int, uids: int, touches: int) -> tuple[float, int]:
    rng = random.Random(1)
    picks = [rng.randrange(uids) for _ in range(touches)]
    async with trio_client.open_gateway(host, port, "bench-touch") as gateway:
        await gateway.attach(range(uids), keepalive=3600)
        await gateway.flush()
        before = gateway.frames_sent
        start = time.perf_counter()
        for uid in picks:
            await gateway.touch((uid,))
        await gateway.flush()
        return time.perf_counter() - start, gateway.frames_sent - before


async def main(args: argparse.Namespace) -> None:
    host, port = args.idled_host, args.idled_port
    k, d, sessions = 0.1, args.duration, args.sessions
    raw_cpu, raw_n = await raw_keepalives(host, port, sessions, k, d)
    cli_cpu, cli_n = await client_keepalives(host, port, sessions, k, d)
    print(f"keepalive, {sessions} sessions pinging every {k} s for {d} s: raw {raw_cpu / raw_n * 1e6:.1f} us CPU "
          f"per ping ({raw_n} pings), client {cli_cpu / cli_n * 1e6:.1f} us ({cli_n} pings, login/bye included)")
    last = await make_events(host, port, args.events // 2)
    m = args.events
    raw = await raw_observe(host, port, last)
    via_trio = await trio_observe(host, port, last)
    via_asyncio = await trio.to_thread.run_sync(lambda: asyncio.run(asyncio_observe(host, port, last)))
    print(f"observer, {m} events replayed: raw codec {m / raw:,.0f}/s, trio client {m / via_trio:,.0f}/s, "
          f"asyncio client {m / via_asyncio:,.0f}/s; client overhead {(via_trio - raw) / m * 1e6:.2f} us/event (trio)")
    elapsed, frames = await gateway_touches(host, port, args.uids, args.touches)
    print(f"gateway: {args.touches:,} single-uid touches over {args.uids:,} uids in {elapsed:.2f} s = "
          f"{args.touches / elapsed:,.0f} touches/s in {frames} frames")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idled-host", default="127.0.0.1")
    parser.add_argument("--idled-port", type=int, default=7878)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--uids", type=int, default=100_000)
    parser.add_argument("--touches", type=int, default=1_000_000)
    trio.run(main, parser.parse_args())
