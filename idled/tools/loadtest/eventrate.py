"""Event-to-subscriber latency at a steady presence-event rate (`idled loadtest --event-rate RATE --target H:P`).

A gateway attaches and detaches fresh uids at RATE/2 per second each (every attach and every detach is one
presence event, logged and streamed); an observer subscribed beforehand records, per event, its receive wall
time minus the event's ``ts``. `summary` gives count, achieved rate and latency percentiles. Loopback only
(the command checks the target), bounded by SECONDS.
"""

from __future__ import annotations

import time

import trio

from idled.protocol import (
    Attach, Detach, Error, Event, FrameDecoder, Login, Subscribe, Welcome, encode, parse_server_message,
    receive_message,
)
from idled.protocol.address import format_address
from idled.tools.loadtest.connect import connect_reason
from idled.tools.loadtest.histogram import percentile

__all__ = ["EventRateError", "measure", "summary"]

_RECEIVE_BYTES = 65536


class EventRateError(Exception):
    """The server refused a login or closed a connection."""


class _Peer:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(1 << 24, parse=parse_server_message)

    async def recv(self) -> object:
        """The next message; None at the end of the stream."""
        return await receive_message(self.stream, self.decoder, _RECEIVE_BYTES)


async def _login(host: str, port: int, role: str, name: str, secret: bytes | None) -> _Peer:
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        raise EventRateError(f"cannot connect to {format_address((host, port))}: {connect_reason(exc)}") from None
    peer = _Peer(stream)
    token = None
    if secret is not None:
        from idled.protocol.tokens import mint

        token = mint(secret, role, name, time.time() + 86400)
    await peer.stream.send_all(encode(Login(role, name, token)))  # type: ignore[arg-type]
    reply = await peer.recv()
    if type(reply) is not Welcome:
        why = f"{reply.code}: {reply.reason}" if type(reply) is Error else "connection closed"
        await peer.stream.aclose()
        raise EventRateError(f"{role} login refused ({why})")
    return peer


async def measure(host: str, port: int, rate: float, seconds: float, secret: bytes | None = None) -> list[float]:
    """Drive `rate` events/s for `seconds`; every event's delivery latency (seconds), in arrival order."""
    observer = await _login(host, port, "observer", "eventrate", secret)
    await observer.stream.send_all(encode(Subscribe()))
    gateway = await _login(host, port, "gateway", "eventrate", secret)
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


def summary(latencies: list[float], seconds: float) -> str:
    def ms(q: float) -> float:
        return 1000 * percentile(latencies, q)

    return (
        f"events {len(latencies)} in {seconds:g} s = {len(latencies) / seconds:.0f}/s; event -> subscriber latency "
        f"ms: p50 {ms(0.5):.2f} p90 {ms(0.9):.2f} p99 {ms(0.99):.2f} max {1000 * max(latencies):.2f}"
    )
