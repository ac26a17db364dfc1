"""A flood of idle connections, as a process of its own: ``python -m tests.faults.floodpeer HOST PORT SOURCES N``.

Keeps ``N`` connections open to HOST:PORT from the loopback ``SOURCES`` (comma-separated, taken in turn), sends
nothing on any of them, and opens a new one as soon as one is closed (by the server, or refused) -- what an
attacker who wants to hold a port's every slot does. One epoll loop, non-blocking sockets, no task per
connection, so the flood costs the machine far less than what it floods (``idled.tools.loadtest.dial``: the
source bound with ``IP_BIND_ADDRESS_NO_PORT``). It prints ``ready`` once the first N are under way, and on
SIGTERM (or after ``--seconds``) one JSON line: connections opened, connections the server closed, connect
errors, how many were open at the end.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import socket
import sys
import time
from itertools import cycle

from idled.tools.loadtest.dial import check_loopback, dial


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="floodpeer")
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("sources", help="comma-separated loopback source addresses")
    parser.add_argument("connections", type=int)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    sources = args.sources.split(",")
    check_loopback(args.host, sources)
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    poller = select.epoll()
    socks: dict[int, socket.socket] = {}
    counts = {"opened": 0, "closed_by_server": 0, "connect_errors": 0}
    source = cycle(sources)

    def open_one() -> None:
        try:
            sock = dial(next(source), args.host, args.port)
        except OSError:
            counts["connect_errors"] += 1
            return
        socks[sock.fileno()] = sock
        poller.register(sock.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
        counts["opened"] += 1

    for _ in range(args.connections):
        open_one()
    print("ready", flush=True)
    deadline = time.monotonic() + args.seconds
    while not stop and time.monotonic() < deadline:
        try:
            ready = poller.poll(0.1)
        except InterruptedError:
            continue
        for fd, _ in ready:
            sock = socks.pop(fd)
            poller.unregister(fd)
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
                counts["connect_errors"] += 1
            if not data:
                counts["closed_by_server"] += 1
            sock.close()
        for _ in range(args.connections - len(socks)):  # one try each per turn: a refusal is retried next turn
            open_one()
    counts["open_at_end"] = len(socks)
    print(json.dumps(counts), flush=True)
    for sock in socks.values():
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
