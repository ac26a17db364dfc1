"""Does the WebSocket hot path need a leaner frame decoder than wsproto's? The figures that decided it.

Not a test (no `test_` prefix: pytest does not collect it); a micro-benchmark that prints figures:

    PYTHONPATH=. python tests/protocol/bench_websocket.py [--messages 200000]

Per keepalive message (a client's masked binary frame holding ``{"op": "ping"}``, a fresh mask each), in one
process, no I/O: the bytes in, the message out, the pong's bytes built:

* ``wsproto``: ``wsproto.connection.Connection`` (server side, after a handshake): ``receive_data``,
  ``events()``, then ``send(BytesMessage)`` for the pong -- and the idled ``FrameDecoder`` the payload would
  still have to pass through, as the roles read messages;
* ``lean``: ``idled.protocol.websocket.WsDecoder`` (its fast path) and the precomputed pong message;
* ``tcp``: the plain ``FrameDecoder`` on a 13-byte frame, the floor.

And the memory one idle connection's decoder holds (tracemalloc, over 1,000 of them).
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc
from collections.abc import Callable

from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import BytesMessage

from idled.protocol import NEED_DATA, PING, PING_FRAME, FrameDecoder
from idled.protocol.codec import PING_BODY, PONG_BODY
from idled.protocol.websocket import WsDecoder, message

WS_PONG = message(PONG_BODY)


def frames(count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        mask = os.urandom(4)
        out.append(bytes([0x82, 0x80 | len(PING_BODY)]) + mask
                   + bytes(b ^ mask[i % 4] for i, b in enumerate(PING_BODY)))
    return out


def with_wsproto(data: list[bytes]) -> None:
    conn, decoder = Connection(ConnectionType.SERVER), FrameDecoder()
    for chunk in data:
        conn.receive_data(chunk)
        for event in conn.events():
            body = bytes(event.data)  # type: ignore[attr-defined]
            decoder.receive_data(len(body).to_bytes(4, "big") + body)
            assert decoder.next_event() is PING
            conn.send(BytesMessage(data=PONG_BODY))


def with_lean(data: list[bytes]) -> None:
    decoder = WsDecoder()
    for chunk in data:
        decoder.receive_data(chunk)
        assert decoder.next_event() is PING
        assert decoder.next_event() is NEED_DATA
        _ = WS_PONG


def with_tcp(data: list[bytes]) -> None:
    decoder = FrameDecoder()
    for _ in data:
        decoder.receive_data(PING_FRAME)
        assert decoder.next_event() is PING
        assert decoder.next_event() is NEED_DATA


def per_message(run: Callable[[list[bytes]], None], data: list[bytes]) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        run(data)
        best = min(best, time.perf_counter() - started)
    return best / len(data) * 1e6


def idle_bytes(make: Callable[[], object], count: int = 1000) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = [make() for _ in range(count)]
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del held
    return (after - before) / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    data = frames(args.messages)
    for name, run, make in (("wsproto", with_wsproto, lambda: (Connection(ConnectionType.SERVER), FrameDecoder())),
                            ("lean", with_lean, WsDecoder), ("tcp", with_tcp, FrameDecoder)):
        print(f"{name:8s} {per_message(run, data):6.2f} us per keepalive message, "
              f"{idle_bytes(make):6.0f} bytes per idle connection's decoder")


if __name__ == "__main__":
    main()
