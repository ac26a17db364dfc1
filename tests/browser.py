"""What the browser tests share: a headless Chromium (Debian's, through selenium) that skips the test with the
reason where it cannot start, a folder served as static files on loopback (nothing of idled serves the
pages), and a wait for a condition the page reaches."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from idled.tools.browser import BrowserUnavailable, start_chromium


@contextlib.contextmanager
def headless_chromium(profile: Path, flags: Sequence[str] = ()) -> Iterator[Any]:
    """A selenium driver of headless Chromium, quit on the way out; the test skips if none can start."""
    try:
        driver = start_chromium(profile, flags=tuple(flags))
    except BrowserUnavailable as exc:
        pytest.skip(f"no headless Chromium: {exc}")
    try:
        yield driver
    finally:
        driver.quit()


@contextlib.contextmanager
def static_site(directory: Path) -> Iterator[int]:
    """``directory`` served as static files on 127.0.0.1 (Python's http.server, in a thread): its port."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """``predicate()``'s first true value, polled every 50 ms; fails saying ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)
