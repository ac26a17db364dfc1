"""WebSocket on the client port, against a real `idled serve` (auth on): masking, control frames, fragments,
pings before login, cross-protocol (an upgrade to the API port, a non-GET on the client port), Host/Origin.
Prints what the daemon answered for each probe."""
import sys
import time

sys.path.insert(0, "review")
from common import Daemon, connect, frame, handshake, read_all, ws_head  # noqa: E402


def show(name: str, data: bytes) -> None:
    print(f"--- {name}: {len(data)} bytes: {data[:160]!r}")


d = Daemon()
P = d.port
try:
    # 1. unmasked frame before login: must be refused (RFC 6455 5.1)
    s = handshake(P)
    s.sendall(frame(d.login("uid", "u1")[4:], masked=False))
    show("unmasked login frame", read_all(s))
    # 2. masked login then an unmasked ping message (user on the plane)
    s = handshake(P)
    s.sendall(frame(d.login("uid", "u2", keepalive=30.0)[4:]))
    time.sleep(0.3)
    s.sendall(frame(b"\x81\xa2op\xa4ping", masked=False))
    show("logged-in user, unmasked message", read_all(s))
    # 3. pings before login: answered? (count pongs); then the login deadline
    s = handshake(P)
    s.sendall(frame(b"x" * 125, opcode=9) * 200)
    t0 = time.monotonic()
    data = read_all(s, 8)
    show(f"200 pings before login (pongs={data.count(bytes((0x8a, 125)))}), ended after {time.monotonic()-t0:.1f}s", data[-60:])
    # 4. control frame too big / fragmented control
    s = handshake(P)
    s.sendall(frame(b"x" * 126, opcode=9))
    show("ping of 126 bytes", read_all(s))
    s = handshake(P)
    s.sendall(frame(b"x", opcode=9, fin=False))
    show("fragmented ping", read_all(s))
    # 5. a 64-bit length of 2**63 (pre-auth)
    s = handshake(P)
    s.sendall(bytes((0x82, 0xFF)) + (2**63).to_bytes(8, "big") + b"\0\0\0\0")
    show("length 2**63", read_all(s))
    # 6. close with 1-byte payload, close with invalid code 999, close with bad utf-8 reason
    for payload in (b"\x03", b"\x03\xe7", b"\x03\xe8\xff\xfe"):
        s = handshake(P)
        s.sendall(frame(payload, opcode=8))
        show(f"close {payload!r}", read_all(s))
    # 7. text frame
    s = handshake(P)
    s.sendall(frame(b"{}", opcode=1))
    show("text frame", read_all(s))
    # 8. fragments never completed, pre-auth, up to the 4 KiB login limit: held until the deadline?
    s = handshake(P)
    s.sendall(frame(b"\x00" * 4000, fin=False))
    t0 = time.monotonic()
    data = read_all(s, 10)
    show(f"fragment never completed, ended after {time.monotonic()-t0:.1f}s", data)
    # 9. a fragment beyond the pre-auth limit
    s = handshake(P)
    s.sendall(frame(b"\x00" * 4000, fin=False) + frame(b"\x00" * 200, opcode=0, fin=False))
    show("fragments past 4 KiB pre-auth", read_all(s))
    # 10. cross protocol: a WebSocket upgrade to the API port
    s = connect(d.api)
    s.sendall(ws_head(d.api))
    show("upgrade to the API port", read_all(s))
    # 11. non-GET HTTP on the client port
    for req in (b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"GET  / HTTP/1.1\r\n\r\n", b"get / HTTP/1.1\r\n\r\n"):
        s = connect(P)
        s.sendall(req)
        show(f"client port {req[:20]!r}", read_all(s))
    # 12. head over 8 KiB, and a head dripped one byte at a time (bounded by the login deadline?)
    s = connect(P)
    s.sendall(ws_head(P, extra="X-Pad: " + "a" * 9000 + "\r\n"))
    show("head > 8 KiB", read_all(s))
    s = connect(P)
    t0 = time.monotonic()
    try:
        for b in ws_head(P, extra="X-Pad: " + "a" * 500 + "\r\n"):
            s.sendall(bytes([b]))
            time.sleep(0.02)
    except OSError as exc:
        print("drip: send failed", exc)
    show(f"head dripped, ended after {time.monotonic()-t0:.1f}s", read_all(s, 1))
    # 13. Origin / Host (auth on): another origin, null, case, trailing dot, port
    for host, origin in ((f"127.0.0.1:{P}", "https://evil.example"), (f"127.0.0.1:{P}", "null"),
                         (f"127.0.0.1:{P}", f"HTTP://127.0.0.1:{P}"), (f"127.0.0.1:{P}", f"http://127.0.0.1:{P}."),
                         (f"127.0.0.1:{P}", "http://127.0.0.1"), ("evil.example", "http://evil.example")):
        s = connect(P)
        s.sendall(ws_head(P, host=host, origin=origin))
        print(f"--- Host {host!r} Origin {origin!r}: {read_all(s, 1)[:40]!r}")
    print("daemon alive:", d.alive(), "rss MiB", round(d.rss(), 1))
    print("tracebacks in log:", d.log().count("Traceback"))
finally:
    d.stop()
