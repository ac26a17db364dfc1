"""A follower that stops reading for a while (its window full) and then reads again: does the stream resume,
is it cut (event: end busy) after OBSERVER_STALL, or does it stay open with nothing more? One follower,
RCVBUF 4 KiB, 6,000 events while it does not read, then reads for 20 s; then one more event.

Result: it resumes, every id in order; ~22 KB/s is the 4 KiB window's rate on loopback (the data was already in
the server's socket buffer: instrumenting events.py showed the follower never left its group), no server fault."""
import socket
import sys
import time

sys.path.insert(0, "review")
from common import Daemon, connect  # noqa: E402

USERS = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
PAUSE = float(sys.argv[2]) if len(sys.argv) > 2 else 2
d = Daemon()
TOKEN = d.token("api", "rev")


def drain(s: socket.socket, seconds: float) -> bytes:
    s.settimeout(0.2)
    data, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            chunk = s.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            data += b"<EOF>"
            break
        data += chunk
    return data


def ids(data: bytes) -> list[int]:
    return [int(line[4:]) for line in data.split(b"\n") if line.startswith(b"id: ")]


try:
    s = connect(d.api)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    time.sleep(0.3)
    for i in range(USERS):
        u = connect(d.port)
        u.sendall(d.login("uid", f"user-{i}-" + "x" * 100, keepalive=30.0))
        u.recv(200)
        u.close()
    print(f"{2 * USERS} events published; the follower did not read; pausing {PAUSE:g} s more")
    time.sleep(PAUSE)
    data = drain(s, 20)
    got = ids(data)
    print(f"read for 20 s: {len(data)} bytes, ids {got[:1]}..{got[-1:]} ({len(got)} events), "
          f"end event: {b'event: end' in data}, EOF: {data.endswith(b'<EOF>')}")
    u = connect(d.port)
    u.sendall(d.login("uid", "one-more", keepalive=30.0))
    u.recv(200)
    more = drain(s, 3)
    print(f"one more event: {len(more)} bytes, ids {ids(more)}, {more[-120:]!r}")
finally:
    d.stop()
