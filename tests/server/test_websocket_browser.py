"""The browser's own WebSocket (headless Chromium, Debian's) against a real `idled serve`: log in, ping, see the
offline -- and a page of another origin refused.

The page is a static file served by Python's http.server on loopback (nothing of idled serves it); the script
that speaks to idled is the browser's: ``new WebSocket(url, "idled.v1")``, binary messages of msgpack bytes made
here. Skips (with the reason) where chromium, chromedriver or selenium are missing, as the status page's test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from idled.protocol import Event
from tests.browser import headless_chromium, static_site
from tests.peers import Daemon, serve_command
from tests.server.test_websocket import watching

pytestmark = pytest.mark.slow

SESSION = """
const [url, login, ping, done] = arguments;
const got = [];
let ws;
try { ws = new WebSocket(url, "idled.v1"); } catch (e) { done({error: String(e)}); return; }
ws.binaryType = "arraybuffer";
ws.onopen = () => ws.send(new Uint8Array(login));
ws.onmessage = (e) => {
  got.push(Array.from(new Uint8Array(e.data)));
  if (got.length <= 3) ws.send(new Uint8Array(ping));  // after the welcome and two pongs: silence
};
ws.onclose = (e) => done({got, code: e.code, reason: e.reason, protocol: ws.protocol});
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with headless_chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        driver.set_script_timeout(30)
        yield driver


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A static page on loopback: its port."""
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text("<!doctype html><title>presence</title><p>a page</p>")
    with static_site(root) as port:
        yield port


def session(browser: Any, page: str, port: int) -> dict[str, Any]:
    browser.get(page)
    login = list(msgpack.packb({"op": "login", "uid": "alice", "keepalive": 1}))
    ping = list(msgpack.packb({"op": "ping"}))
    result: dict[str, Any] = browser.execute_async_script(SESSION, f"ws://127.0.0.1:{port}/", login, ping)
    return result


async def test_the_browsers_websocket_logs_in_pings_and_is_closed_idle(browser: Any, site: int, tmp_path: Path) -> None:
    page = f"http://127.0.0.1:{site}/"
    command = serve_command(tmp_path / "data", "--tick", "0.1", "--fsync", "never", "--metrics-port", "0",
                            "--ws-origins", f"http://127.0.0.1:{site}")
    async with Daemon(command, tmp_path / "idled.err") as d:
        observer = await watching(d.port)
        started = time.monotonic()
        result = await trio.to_thread.run_sync(session, browser, page, d.port)
        messages = [msgpack.unpackb(bytes(m)) for m in result["got"]]
        assert [m["op"] for m in messages] == ["welcome", "pong", "pong", "pong", "error"], result
        assert messages[-1]["code"] == "idle_timeout" and messages[0]["timeout"] == 1.5
        assert (result["code"], result["reason"], result["protocol"]) == (4000, "idle_timeout", "idled.v1")
        assert time.monotonic() - started >= 1.5
        online, offline = [await observer.recv(10) for _ in range(2)]
        assert isinstance(online, Event) and isinstance(offline, Event)
        assert [(e.uid, e.kind, e.reason) for e in (online, offline)] == [("alice", "online", "login"),
                                                                        ("alice", "offline", "idle")]
        # A page of another origin (localhost is not 127.0.0.1 to a browser) is refused at the handshake.
        refused = await trio.to_thread.run_sync(session, browser, f"http://localhost:{site}/", d.port)
        assert refused["got"] == [] and refused["code"] == 1006, refused
