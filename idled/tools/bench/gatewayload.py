"""What the process benchmarks (``--standby``, ``--failover``) drive a core with, from plain threads and sockets.

* `login`: a connection logged in with a given `Login`, or None when it is refused (``not_leader`` too) or
  nobody listens;
* `GatewayLoad`: events at a steady rate through one gateway connection -- every ``STEP`` seconds it attaches
  a step's uids and detaches the previous step's -- obtained from ``connect`` and obtained again when it is
  lost (a failover: whichever core takes it);
* `read_events`: the events a subscribed observer's connection brings.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

from idled.protocol import (
    NEED_DATA, Attach, Detach, Error, Event, FrameDecoder, Login, Welcome, encode, parse_server_message,
)

__all__ = ["MAX_FRAME", "STEP", "GatewayLoad", "login", "read_events"]

STEP = 0.01  # seconds between two gateway frames
MAX_FRAME = 1 << 22


def login(address: tuple[str, int], message: Login, timeout: float = 1.0) -> socket.socket | None:
    """A connection logged in as ``message``, or None (refused, ``not_leader``, nobody listening)."""
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError:
        return None
    try:
        sock.sendall(encode(message))
        decoder = FrameDecoder(MAX_FRAME, parse=parse_server_message)
        while (data := sock.recv(65536)):
            decoder.receive_data(data)
            reply = decoder.next_event()
            if reply is NEED_DATA:
                continue
            if type(reply) is Welcome:
                sock.settimeout(None)
                return sock
            break
    except OSError:
        pass
    sock.close()
    return None


class GatewayLoad(threading.Thread):
    """Events at ``rate``/s through a gateway connection from ``connect()`` (None: nobody took it, try again
    shortly) until ``stop`` is set; ``sent`` counts them, ``connections`` the connections it used."""

    def __init__(self, connect: Callable[[], socket.socket | None], rate: float, prefix: str = "g") -> None:
        super().__init__(daemon=True)
        self.connect, self.rate, self.prefix = connect, rate, prefix
        self.sent = 0
        self.connections = 0
        self.stop = threading.Event()

    def run(self) -> None:
        per_step = max(2, round(self.rate * STEP / 2))
        uid, step, started = 0, 0, time.monotonic()
        previous: tuple[str, ...] = ()
        sock: socket.socket | None = None
        while not self.stop.is_set():
            if sock is None:
                sock, previous = self.connect(), ()  # a new connection: the core forgot the old one's uids
                if sock is None:
                    time.sleep(0.05)
                    continue
                self.connections += 1
            attach = tuple(f"{self.prefix}{uid + i}" for i in range(per_step))
            uid += per_step
            try:
                sock.sendall(encode(Attach(attach, 600.0)) + (encode(Detach(previous)) if previous else b""))
            except OSError:
                sock.close()
                sock = None
                continue
            self.sent += len(attach) + len(previous)
            previous = attach
            step += 1
            time.sleep(max(0.0, started + step * STEP - time.monotonic()))
        if sock is not None:
            sock.close()


def read_events(sock: socket.socket, waiting: Callable[[], bool]) -> Iterator[Event]:
    """The events ``sock`` brings, until its end -- or until a read times out while ``waiting()`` is false
    (a socket without a timeout reads to its end). An error frame raises OSError."""
    decoder = FrameDecoder(MAX_FRAME, parse=parse_server_message)
    while True:
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            if waiting():
                continue
            return
        if not data:
            return
        decoder.receive_data(data)
        while (message := decoder.next_event()) is not NEED_DATA:
            if type(message) is Event:
                yield message
            elif type(message) is Error:
                raise OSError(message.reason)
