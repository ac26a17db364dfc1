"""Event-to-subscriber latency at a steady presence-event rate (issue: event log, "added latency").

    python -m idled.tools.loadtest.eventrate PORT [RATE [SECONDS]]      # against `idled serve` on 127.0.0.1:PORT

A gateway attaches and detaches fresh uids at RATE/2 per second each (every attach and every detach is one
presence event, logged and streamed); an observer subscribed beforehand records, per event, its receive wall
time minus the event's ``ts``. Prints count, achieved rate and latency percentiles. Loopback only, bounded
by SECONDS.
"""

from __future__ import annotations

import sys
import time

import trio

from idled.tools.loadtest.stats import percentile
from idled.protocol import NEED_DATA, Attach, Detach, Event, FrameDecoder, Login, Subscribe, encode, parse_server_message


class _Peer:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(1 << 24, parse=parse_server_message)

    async def recv(self) -> object:
        while (message := self.decoder.next_event()) is NEED_DATA:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.decoder.receive_data(data)
        return message


async def _login(port: int, role: str, name: str) -> _Peer:
    peer = _Peer(await trio.open_tcp_stream("127.0.0.1", port))
    await peer.stream.send_all(encode(Login(role, name)))  # type: ignore[arg-type]
    await peer.recv()
    return peer


async def measure(port: int, rate: float, seconds: float) -> list[float]:
    observer = await _login(port, "observer", "eventrate")
    await observer.stream.send_all(encode(Subscribe()))
    gateway = await _login(port, "gateway", "eventrate")
    latencies: list[float] = []

    async def observe() -> None:
        while (message := await observer.recv()) is not None:
            if isinstance(message, Event):
                latencies.append(time.time() - message.ts)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(observe)
        start, sent = trio.current_time(), 0
        while trio.current_time() - start < seconds:
            due = int((trio.current_time() - start) * rate / 2)  # uids owed so far, attach + detach each
            if due > sent:
                uids = tuple(f"eventrate-{i}" for i in range(sent, due))
                await gateway.stream.send_all(encode(Attach(uids)) + encode(Detach(uids)))
                sent = due
            await trio.sleep(0.005)
        await trio.sleep(1.0)  # let the last events arrive
        nursery.cancel_scope.cancel()
    return latencies


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    port, rate, seconds = int(args[0]), float(args[1]) if len(args) > 1 else 3000.0, float(args[2]) if len(args) > 2 else 20.0
    latencies = trio.run(measure, port, rate, seconds)
    if not latencies:
        print("no events received")
        return 1

    def ms(q: float) -> float:
        return 1000 * percentile(latencies, q)

    print(
        f"events {len(latencies)} in {seconds:g} s = {len(latencies) / seconds:.0f}/s; event -> subscriber latency "
        f"ms: p50 {ms(0.5):.2f} p90 {ms(0.9):.2f} p99 {ms(0.99):.2f} max {1000 * max(latencies):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
