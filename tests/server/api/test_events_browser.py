"""The browser's own ``EventSource`` (headless Chromium) following ``GET /v1/events`` of a real ``idled serve``.

Auth off (the API on loopback) and the page on the API's own origin: an ``EventSource`` cannot send an
``Authorization`` header, and the API takes no token in a URL (docs/api.md#events). The page sees a login's
online and the idle offline, with ``lastEventId`` = seq; then the daemon stops (the stream ends with
``event: end``) and starts again on the same data and port, and the browser's own reconnection -- with the
``Last-Event-ID`` it keeps by itself -- brings the shutdown's offline from the log: the next seq, nothing twice.
Skips (with the reason) where Chromium, chromedriver or selenium are missing, as the status page's tests do.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idled.protocol import Login, encode
from idled.tools.bench.daemon import Daemon
from tests import peers
from tests.browser import headless_chromium, until

pytestmark = pytest.mark.slow

FOLLOW = """
window.got = []; window.ends = []; window.opened = 0;
const source = new EventSource('/v1/events');
source.onopen = () => { window.opened += 1; };
for (const kind of ['online', 'offline']) {
  source.addEventListener(kind, e => {
    const data = JSON.parse(e.data);
    window.got.push([e.lastEventId, e.type, data.uid, data.seq, data.reason]);
  });
}
source.addEventListener('end', e => window.ends.push(JSON.parse(e.data).code));
window.source = source;
"""


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with headless_chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def login(port: int, uid: str, keepalive: float) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(encode(Login("uid", uid, None, keepalive)))
    assert b"welcome" in sock.recv(4096)
    return sock


def test_event_source_follows_and_resumes_across_a_restart(chromium: Any, tmp_path: Path) -> None:
    api_port = peers.free_port()
    flags = ("--metrics-port", "0", "--tick", "0.1", "--fsync", "always", "--api-port", str(api_port))
    users: list[socket.socket] = []
    serve = Daemon(tmp_path, *flags)
    try:
        chromium.get(f"http://127.0.0.1:{api_port}/v1/openapi.json")  # the API's own origin
        chromium.execute_script(FOLLOW)
        until(lambda: chromium.execute_script("return window.opened"), 10, "the stream open")
        users.append(login(serve.port, "alice", keepalive=1))  # silent: idle offline after 1.5 s
        users.append(login(serve.port, "bob", keepalive=60))  # online until the shutdown
        got = until(lambda: (g := chromium.execute_script("return window.got")) and len(g) >= 3 and g, 10,
                    "alice online, bob online, alice offline")
        assert [(kind, uid) for _, kind, uid, _, _ in got] == [("online", "alice"), ("online", "bob"),
                                                              ("offline", "alice")]
        assert all(last_id == str(seq) for last_id, _, _, seq, _ in got)
        serve.stop()  # bob's offline (shutdown) is logged after the streams end: the browser reads it after
        until(lambda: chromium.execute_script("return window.ends"), 5, "the end event")
        assert chromium.execute_script("return window.ends") == ["server_shutdown"]
        serve = Daemon(tmp_path, *flags)
        got = until(lambda: (g := chromium.execute_script("return window.got")) and len(g) >= 4 and g, 30,
                    "the reconnection's events")
        assert chromium.execute_script("return window.opened") >= 2
        assert got[3][1:3] == ["offline", "bob"] and got[3][4] == "shutdown", got
        seqs = [seq for _, _, _, seq, _ in got]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"a gap or a duplicate: {got}"
    finally:
        chromium.get("about:blank")
        for user in users:
            user.close()
        serve.stop()
