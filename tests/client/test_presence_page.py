"""examples/presence.html, the browser page, in headless Chromium (Debian's) against a real `idled serve`: it
logs in over the browser's own WebSocket, shows itself online, keeps the session with application pings past
its timeout, and once told to go silent shows the daemon's `idle_timeout` -- while an observer over TCP sees
the online and the idle offline. The page is served as a static file by Python's http.server on loopback.
Skips (with the reason) where chromium, chromedriver or selenium are missing, as the status page's test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from idled.protocol import Event
from tests.browser import headless_chromium, static_site
from tests.peers import Daemon, serve_command
from tests.server.test_websocket import watching

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with headless_chromium(tmp_path / "chromium-profile") as driver:
        yield driver


@pytest.fixture
def site() -> Iterator[int]:
    """examples/ as static files on loopback: the port."""
    with static_site(EXAMPLES) as port:
        yield port


def state_after(browser: Any, wanted: str, timeout: float) -> str:
    """The page's presence line once it contains ``wanted`` (or what it says at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        text: str = browser.find_element("id", "state").text
        if wanted in text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


async def test_the_page_logs_in_stays_online_and_shows_its_idle_offline(browser: Any, site: int, tmp_path: Path) -> None:
    origin = f"http://127.0.0.1:{site}"
    command = serve_command(tmp_path / "data", "--tick", "0.1", "--fsync", "never", "--metrics-port", "0",
                            "--ws-origins", origin)
    async with Daemon(command, tmp_path / "idled.err") as d:
        observer = await watching(d.port)
        url = f"{origin}/presence.html?url=ws://127.0.0.1:{d.port}/&uid=carol&keepalive=1&connect=1"
        await trio.to_thread.run_sync(browser.get, url)
        shown = await trio.to_thread.run_sync(state_after, browser, "online as carol", 10.0)
        assert "online as carol (offline after 1.5 s of silence)" in shown, shown
        online = await observer.recv(10)
        assert isinstance(online, Event) and (online.uid, online.kind) == ("carol", "online")
        await trio.sleep(3.0)  # two timeouts: the page's pings keep it online
        assert "online as carol" in browser.find_element("id", "state").text
        browser.find_element("id", "silent").click()
        shown = await trio.to_thread.run_sync(state_after, browser, "idle_timeout", 10.0)
        assert shown.startswith("offline: idle_timeout"), shown
        offline = await observer.recv(10)
        assert isinstance(offline, Event) and (offline.uid, offline.kind, offline.reason) == ("carol", "offline", "idle")
