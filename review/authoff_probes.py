"""Auth off (loopback, --insecure not needed): the Host rule (DNS rebinding) and the Origin rule on the client
port's WebSocket upgrade and on GET /v1/events; the edge-less core's /status without a token is in status_probes.py."""
import sys

sys.path.insert(0, "review")
from common import Daemon, connect, read_all, ws_head  # noqa: E402

d = Daemon(auth=False)
P, A = d.port, d.api
try:
    for host, origin in (("localhost", None), ("LOCALHOST", None), ("localhost.", None), ("127.0.0.1.", None),
                         ("[::1]", None), ("[::ffff:127.0.0.1]", None), ("0x7f000001", None), ("127.1", None),
                         ("localhost:1:2", None), ("localhost:", None), ("evil.example", None),
                         (f"127.0.0.1:{P}", f"http://127.0.0.1:{P}"), (f"127.0.0.1:{P}", "http://localhost:3000"),
                         (f"localhost:{P}", f"http://localhost:{P}"), (f"127.0.0.1:{P}", "null"),
                         (f"127.0.0.1:{P} ", f"http://127.0.0.1:{P}"), (f"127.0.0.1:{P}", f" http://127.0.0.1:{P} ")):
        s = connect(P)
        s.sendall(ws_head(P, host=host, origin=origin))
        print(f"WS Host {host!r} Origin {origin!r}: {read_all(s, 1)[:34]!r}")
    for extra in ("Host: evil.example\r\n", "Host: localhost\r\nOrigin: http://evil.example\r\n",
                  "Host: localhost\r\nSec-Fetch-Site: cross-site\r\n", "Host: localhost\r\nOrigin: null\r\n",
                  "Host: localhost\r\nSec-Fetch-Site: same-site\r\n",
                  "Host: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"):
        s = connect(A)
        s.sendall(("GET /v1/events HTTP/1.1\r\n" + extra + "\r\n").encode())
        print(f"SSE {extra.strip()[:60]!r}: {read_all(s, 0.7)[:30]!r}")
    print("alive:", d.alive())
finally:
    d.stop()
