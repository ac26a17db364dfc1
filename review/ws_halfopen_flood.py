"""Pre-auth memory: many half-open WebSocket handshakes (a head of ~8,000 bytes that never ends) from many
loopback addresses, against a real `idled serve` (auth on). Measures the daemon's RSS and how many were taken,
refused at once, and cut at login_timeout; checks that a real login from another address still gets in."""
import sys
import time

sys.path.insert(0, "review")
from common import Daemon, connect, frame, handshake  # noqa: E402

ADDRS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
PER = int(sys.argv[2]) if len(sys.argv) > 2 else 110  # 10 over the share of 100
PAD = int(sys.argv[3]) if len(sys.argv) > 3 else 8192 - 300
d = Daemon("--login-timeout", "10")
try:
    base = d.rss()
    print(f"rss before: {base:.1f} MiB")
    socks = []
    refused_at_once = 0
    partial = (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nX-Pad: " + "a" * PAD).encode()
    t0 = time.monotonic()
    for a in range(ADDRS):
        src = f"127.0.{a // 200 + 10}.{a % 200 + 2}"
        for _ in range(PER):
            s = connect(d.port, src)
            s.sendall(partial)
            socks.append(s)
    time.sleep(1.0)
    answered = b""
    for s in socks:
        s.setblocking(False)
        try:
            got = s.recv(4096)
            if got or got == b"":
                refused_at_once += 1
                answered = answered or got
        except BlockingIOError:
            pass
        except OSError:
            refused_at_once += 1
    print("a refusal reads:", answered[:120])
    held = len(socks) - refused_at_once
    rss = d.rss()
    print(f"opened {len(socks)} in {time.monotonic()-t0:.1f}s from {ADDRS} addresses; refused at once {refused_at_once}; "
          f"held {held}; rss {rss:.1f} MiB (+{rss-base:.1f}, {(rss-base)*1024/max(held,1):.1f} KiB per held)")
    # a real user from an address of its own, during the flood
    t1 = time.monotonic()
    s = handshake(d.port, "127.0.9.9")
    s.sendall(frame(d.login("uid", "real", keepalive=30.0)[4:]))
    s.settimeout(5)
    welcome = s.recv(200)
    print(f"real user during flood: {b'welcome' in welcome} in {1000*(time.monotonic()-t1):.0f} ms")
    time.sleep(10.5)
    cut = 0
    for x in socks:
        x.setblocking(False)
        try:
            if x.recv(4096) == b"":
                cut += 1
        except BlockingIOError:
            pass
        except OSError:
            cut += 1
    print(f"after login_timeout: {cut} of {len(socks)} closed; rss {d.rss():.1f} MiB; alive {d.alive()}")
    for x in socks:
        x.close()
finally:
    d.stop()
