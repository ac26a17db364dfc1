"""A logged-in WebSocket user (on the user plane) that opens a fragmented message and then sends empty
continuation frames for ever, and one that floods 125-byte pings without reading: the daemon's CPU per MB,
its RSS, whether the session stays online (fragments are no message: no activity), whether others are served."""
import socket
import sys
import time

sys.path.insert(0, "review")
from common import Daemon, frame, handshake  # noqa: E402

MB = int(sys.argv[1]) if len(sys.argv) > 1 else 30
d = Daemon("--timeout", "3", "--max-timeout", "3")
try:
    s = handshake(d.port)
    s.sendall(frame(d.login("uid", "frag", keepalive=2.0)[4:]))
    s.recv(200)
    empty = frame(b"", opcode=0, fin=False) * 10000  # 60 KB of empty continuations
    s.sendall(frame(b"\x81", fin=False))
    rss0, cpu0, t0 = d.rss(), d.cpu(), time.monotonic()
    sent = 0
    s.settimeout(10)
    try:
        while sent < MB << 20:
            s.sendall(empty)
            sent += len(empty)
    except OSError as exc:
        print("send ended:", exc)
    dt = time.monotonic() - t0
    print(f"empty continuations: {sent >> 20} MB ({sent // 6} frames) in {dt:.1f}s; daemon cpu {d.cpu()-cpu0:.1f}s "
          f"({(d.cpu()-cpu0) / max(sent >> 20, 1) * 1000:.0f} ms/MB); rss {rss0:.1f} -> {d.rss():.1f} MiB")
    s.settimeout(6)
    try:
        tail = s.recv(4096)
    except TimeoutError:
        tail = b"(nothing within 6 s)"
    print("then the server sent:", tail[:120])
    # ping flood without reading
    p = handshake(d.port)
    p.sendall(frame(d.login("uid", "pinger", keepalive=30.0)[4:]))
    p.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ping = frame(b"x" * 125, opcode=9) * 400
    rss0, cpu0, sent = d.rss(), d.cpu(), 0
    p.settimeout(5)
    try:
        while sent < MB << 20:
            p.sendall(ping)
            sent += len(ping)
    except OSError as exc:
        print("ping flood send ended:", type(exc).__name__, exc)
    print(f"pings: {sent >> 20} MB sent without reading; daemon cpu {d.cpu()-cpu0:.1f}s; rss {rss0:.1f} -> {d.rss():.1f} MiB; alive {d.alive()}")
finally:
    d.stop()
