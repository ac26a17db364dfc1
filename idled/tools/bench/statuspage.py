"""`idled bench --status-page`: what an open status page costs the daemon, in CPU-seconds per second.

An `idled serve` subprocess (loopback, port 0, ``--fsync never``, a metrics port) is given a steady load by one
gateway connection from this process: ``sessions`` sessions attached with a 20 s keepalive and touched every
10 s, and every second a few detached (logout) and as many attached again -- half of those never touched,
so they go idle and feed the offline-lateness histogram. The daemon's CPU (user + system, psutil) is measured
over ``seconds`` with no page open, then with ``pages`` tabs of one headless Chromium (`idled.tools.browser`)
open on ``/``, each polling ``/status/live`` as the real page does. Background tabs are not throttled (Chromium
flags): every tab polls about once a second as a visible one would. The polls are counted in the tabs
(Resource Timing), so the report gives the cost per page and per poll.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from idled.protocol import Attach, Detach, Login, Touch, encode
from idled.tools.bench.daemon import Daemon, free_port
from idled.tools.browser import start_chromium

__all__ = ["report_lines"]

KEEPALIVE = 20.0  # seconds: timeout 30 s at the default max
TOUCH_EVERY = 10.0
CHURN = 10  # sessions detached, and attached again, each second (half of the new ones stay silent)
UNTHROTTLED = ("--disable-background-timer-throttling", "--disable-renderer-backgrounding",
               "--disable-backgrounding-occluded-windows")
COUNT_POLLS = "return performance.getEntriesByType('resource').filter(e => e.name.includes('status/live')).length"


async def _load(port: int, sessions: int, ready: trio.Event) -> None:
    """One gateway: ``sessions`` attached and kept alive, ``CHURN`` a second logged out and in again."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(encode(Login("gateway", "bench-status-page")))
    await stream.receive_some(65536)  # the welcome
    live = [f"user-{i}" for i in range(sessions)]
    for start in range(0, sessions, 1000):
        await stream.send_all(encode(Attach(tuple(live[start:start + 1000]), KEEPALIVE)))
    ready.set()
    fresh = itertools.count(sessions)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain, stream)
        for second in itertools.count():
            slice_ = len(live) * (second % int(TOUCH_EVERY)) // int(TOUCH_EVERY)
            chunk = live[slice_:slice_ + len(live) // int(TOUCH_EVERY) + 1]
            if chunk:
                await stream.send_all(encode(Touch(tuple(chunk))))
            gone, live = live[:CHURN], live[CHURN:]
            await stream.send_all(encode(Detach(tuple(gone), "logout")))
            new = [f"user-{next(fresh)}" for _ in range(CHURN)]
            live += new[: CHURN // 2]
            await stream.send_all(encode(Attach(tuple(new[: CHURN // 2]), KEEPALIVE)))
            await stream.send_all(encode(Attach(tuple(new[CHURN // 2:]), 1.0)))  # silent: idle after 1.5 s
            await trio.sleep(1.0)


async def _drain(stream: trio.SocketStream) -> None:
    while await stream.receive_some(65536):
        pass


async def _measure(daemon: Daemon, seconds: float) -> float:
    """The daemon's CPU-seconds per second over ``seconds``."""
    before, started = daemon.cpu_seconds(), time.monotonic()
    await trio.sleep(seconds)
    return (daemon.cpu_seconds() - before) / (time.monotonic() - started)


def _open_pages(driver: Any, url: str, pages: int) -> list[str]:
    handles = []
    for index in range(pages):
        if index:
            driver.switch_to.new_window("tab")
        driver.get(url)
        driver.execute_script("performance.setResourceTimingBufferSize(100000)")
        handles.append(driver.current_window_handle)
    return handles


def _polls(driver: Any, handles: list[str]) -> int:
    total = 0
    for handle in handles:
        driver.switch_to.window(handle)
        total += int(driver.execute_script(COUNT_POLLS))
    return total


async def _run(sessions: int, seconds: float, pages: int, directory: Path) -> list[str]:
    metrics_port = free_port()
    daemon = Daemon(directory, "--fsync", "never", "--metrics-port", str(metrics_port))
    driver = None
    try:
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            nursery.start_soon(_load, daemon.port, sessions, ready)
            await ready.wait()
            await trio.sleep(5.0)  # attached, first idle offlines, one-second samples running
            idle = await _measure(daemon, seconds)
            driver = await trio.to_thread.run_sync(lambda: start_chromium(directory / "profile", flags=UNTHROTTLED))
            url = f"http://127.0.0.1:{metrics_port}/"
            handles = await trio.to_thread.run_sync(_open_pages, driver, url, pages)
            await trio.sleep(3.0)
            polls_before = await trio.to_thread.run_sync(_polls, driver, handles)
            started = time.monotonic()
            busy = await _measure(daemon, seconds)
            polls = (await trio.to_thread.run_sync(_polls, driver, handles) - polls_before) / (time.monotonic() - started)
            nursery.cancel_scope.cancel()
    finally:
        if driver is not None:
            driver.quit()
        daemon.stop()
    per_page = (busy - idle) / pages
    per_poll = (busy - idle) / polls if polls else float("nan")
    return [
        f"daemon CPU, 0 pages open:   {idle:.4f} CPU-s/s",
        f"daemon CPU, {pages} pages open: {busy:.4f} CPU-s/s ({polls:.1f} polls/s over the {pages} tabs)",
        f"difference per open page:   {per_page:.5f} CPU-s/s ({per_page * 1000:.2f} ms of CPU each second); "
        f"per poll {per_poll * 1e6:.0f} us",
    ]


def report_lines(sessions: int, seconds: float, pages: int) -> Iterator[str]:
    """The report, a line at a time (see the module docstring)."""
    yield (f"idled bench --status-page: {sessions} sessions through a gateway, {2 * CHURN + CHURN // 2} events/s of churn "
           f"({CHURN // 2} of them idle offlines), {seconds:g} s per phase, {pages} pages in headless Chromium")
    directory = Path(tempfile.mkdtemp(prefix="idled-bench-page-"))
    try:
        yield from trio.run(_run, sessions, seconds, pages, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    yield f"(this machine: {os.cpu_count()} CPUs)"
