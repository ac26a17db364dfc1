"""An attacker's flood, as a process of its own: ``python -m tests.door.flooder PORT COUNT SOURCES [SECONDS]``.

Holds COUNT connections from the source addresses SOURCES (comma-separated: spread evenly) to 127.0.0.1:PORT
that never send a byte; whenever the
server closes one (refused at once, or at the end of a login deadline) it is opened again at once, for
SECONDS (default 60) or until SIGTERM, then the process exits. It prints, at the end, one line: ``opened N
closed M``.
A process of its own, so that the flood's CPU is not the measuring client's (two cores: both run anyway).
"""

from __future__ import annotations

import os
import signal
import sys

import trio

async def connect_from(source: str, port: int, host: str = "127.0.0.1") -> trio.SocketStream:
    """A TCP connection to ``host:port`` from the address ``source`` (trio lets connect() pick the port)."""
    return await trio.open_tcp_stream(host, port, local_address=source)


async def hold(port: int, source: str, counts: list[int]) -> None:
    while True:
        try:
            stream = await connect_from(source, port)
        except OSError:
            await trio.sleep(0.01)
            continue
        counts[0] += 1
        try:
            while await stream.receive_some(4096):
                pass  # an error frame, then the close
        except (trio.BrokenResourceError, OSError):
            pass
        finally:
            stream.socket.close()
        counts[1] += 1


async def main(port: int, count: int, source: str, seconds: float) -> None:
    counts = [0, 0]
    with trio.move_on_after(seconds), trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            sources = source.split(",")
            for i in range(count):
                nursery.start_soon(hold, port, sources[i % len(sources)], counts)
            async for _ in signals:  # SIGTERM: stop, and say what was done
                nursery.cancel_scope.cancel()
    print(f"opened {counts[0]} closed {counts[1]}", flush=True)


if __name__ == "__main__":
    os.nice(19)  # the attacker's CPU is not the daemon's (it is another machine's): here, the least of this one's
    trio.run(main, int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 60.0)
