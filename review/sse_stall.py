"""Do followers that never read get cut (event: end busy, then the connection closed) OBSERVER_STALL (5 s)
after they stop taking bytes? N followers from one address, RCVBUF 4 KiB, events flowing, then each drained
with a blocking read: does it end with `event: end` and EOF, and how long after the events stopped?

Result (see the report): not cut -- and rightly: the server's non-blocking writes were all taken by its own
socket's send buffer (loopback autotunes it up to tcp_wmem's 4 MiB), so nothing waited in the process and
the stall rule had nothing to time. The slow drain is this client's 4 KiB window (~22 KB/s with delayed ACKs),
not the server. Memory held for such a follower is the kernel's, up to tcp_wmem[2] per socket."""
import socket
import sys
import time

sys.path.insert(0, "review")
from common import Daemon, connect  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
USERS = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
WAIT = float(sys.argv[3]) if len(sys.argv) > 3 else 12
d = Daemon()
TOKEN = d.token("api", "rev")
try:
    socks = []
    for _ in range(N):
        s = connect(d.api)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        socks.append(s)
    time.sleep(0.5)
    for i in range(USERS):
        u = connect(d.port)
        u.sendall(d.login("uid", f"user-{i}-" + "x" * 100, keepalive=30.0))
        u.recv(200)
        u.close()
    stopped = time.monotonic()
    print(f"{2 * USERS} events sent; rss {d.rss():.1f} MiB; waiting {WAIT:g} s")
    time.sleep(WAIT)
    ended = eof = 0
    sizes: list = []
    outcomes: list = []
    for s in socks:
        s.settimeout(0.5)
        data = b""
        try:
            while chunk := s.recv(1 << 20):
                data += chunk
            eof += 1
        except TimeoutError:
            outcomes.append("still open (read timed out)")
        except OSError as exc:
            outcomes.append(type(exc).__name__)
        else:
            outcomes.append("EOF")
        ended += b"event: end" in data
        ids = [line for line in data.split(b"\n") if line.startswith(b"id: ")]
        sizes.append((len(data), ids[0][4:].decode() if ids else None, ids[-1][4:].decode() if ids else None))
    print(f"after {time.monotonic() - stopped:.1f} s: {ended} of {N} got event: end, {eof} closed; drained (bytes, first id, last id): {sizes[:4]}; {outcomes}")
finally:
    d.stop()
