"""SSE (GET /v1/events) against a real `idled serve` (auth on): Last-Event-ID abuse, many followers vs
api_max_clients, followers that never read (RSS while events flow), and a SIGTERM with them connected."""
import signal
import socket
import sys
import time

sys.path.insert(0, "review")
from common import Daemon, connect, read_all  # noqa: E402

FOLLOWERS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
USERS = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
WAIT = float(sys.argv[3]) if len(sys.argv) > 3 else 3
d = Daemon("--api-max-clients", str(FOLLOWERS + 20), "--max-pending-per-address", "1000")
TOKEN = d.token("api", "rev")


def get(path: str, extra: str = "", auth: bool = True, src: str = "127.0.0.1") -> socket.socket:
    s = connect(d.api, src)
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (f"Authorization: Bearer {TOKEN}\r\n" if auth else "") + extra + "\r\n"
    s.sendall(req.encode())
    return s


def events(n: int) -> None:
    """n online + n offline events: users log in over TCP and leave (bye)."""
    for i in range(n):
        s = connect(d.port)
        s.sendall(d.login("uid", f"user-{i}-" + "x" * 100, keepalive=30.0))
        s.recv(200)
        s.close()


try:
    for value in ("-1", "99999999999999999999999999", "9223372036854775807", "9223372036854775806", "abc",
                  "1e3", " 5", "５", "0x10", "1" * 5000, "5, 6"):
        s = get("/v1/events", f"Last-Event-ID: {value}\r\n")
        print(f"Last-Event-ID {value[:30]!r}: {read_all(s, 1)[:140]!r}")
    s = get("/v1/events", "Last-Event-ID: 1\r\nLast-Event-ID: 2\r\n")
    print(f"two Last-Event-ID: {read_all(s, 1)[:60]!r}")
    s = get("/v1/events?from=-1")
    print(f"from=-1: {read_all(s, 1)[:60]!r}")
    s = get("/v1/events", auth=False)
    print(f"no token: {read_all(s, 1)[:60]!r}")
    # followers that never read, from one address
    base = d.rss()
    socks = [get("/v1/events") for _ in range(FOLLOWERS)]
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    time.sleep(1)
    extra = get("/v1/events")
    time.sleep(0.5)
    print(f"{FOLLOWERS} followers open, rss {d.rss():.1f} MiB (+{d.rss()-base:.1f})")
    over = [get("/v1/events") for _ in range(25)]
    time.sleep(0.5)
    answers = [read_all(s, 0.3)[:12] for s in over]
    print("beyond api_max_clients:", {a: answers.count(a) for a in set(answers)})
    t0, c0 = time.monotonic(), d.cpu()
    events(USERS)
    print(f"{2 * USERS} events in {time.monotonic()-t0:.1f}s (daemon cpu {d.cpu()-c0:.1f}s); rss {d.rss():.1f} MiB "
          f"(+{d.rss()-base:.1f}) with {FOLLOWERS} followers not reading")
    time.sleep(WAIT)
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            while s.recv(1 << 20):
                pass
            closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    print(f"rss after {WAIT:g} s: {d.rss():.1f} MiB; followers cut (EOF once drained): {closed} of {FOLLOWERS}")
    # SIGTERM with them connected
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    d.proc.wait(timeout=60)
    print(f"SIGTERM -> exit {d.proc.returncode} in {time.monotonic()-t0:.1f}s with {FOLLOWERS} stalled followers")
    tail = read_all(extra, 2)
    print("a reading follower's last bytes:", tail[-200:])
finally:
    if d.alive():
        d.stop()
