"""An unauthenticated flood of the HTTP API costs the daemon little memory, and it comes back after: a real
`idled serve` process, its RSS read with psutil while 500 connections from five loopback addresses each send
~1 MB of headers and then ~1 MB of body, then 500 more a small head and ~1 MB of body, none with a token."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import trio

from tests import peers

pytestmark = pytest.mark.slow

MIB = 1 << 20
SOURCES = [f"127.0.0.{i}" for i in range(2, 7)]  # 100 each: the gate's default share per address
CONNECTIONS = 500
HEADER_LINE = b"X-Pad: " + b"a" * 8000 + b"\r\n"
BIG_HEAD = (b"POST /v1/presence HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
            + HEADER_LINE * (1_000_000 // len(HEADER_LINE)) + b"\r\n")  # ~1 MB: under the old 1 MiB head limit
SMALL_HEAD = b"POST /v1/presence HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
BODY = b" " * 1_000_000
PIECE = 65536


async def flood(port: int, head: bytes, answers: dict[bytes, int]) -> None:
    """CONNECTIONS at once, spread over SOURCES: each sends ``head`` and BODY as fast as the daemon reads, then
    reads the answer until the daemon closes; ``answers`` counts the status lines (b"" for none)."""

    async def one(source: str) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
        out = b""
        async with stream:
            try:
                data = memoryview(head + BODY)
                for start in range(0, len(data), PIECE):
                    await stream.send_all(data[start:start + PIECE])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # answered and closed early: what we came to see
            with trio.move_on_after(10):
                try:
                    while len(out) < 200 and (chunk := await stream.receive_some(PIECE)):
                        out += chunk
                except trio.BrokenResourceError:
                    pass
        status = out[9:12]
        answers[status] = answers.get(status, 0) + 1

    async with trio.open_nursery() as nursery:
        for i in range(CONNECTIONS):
            nursery.start_soon(one, SOURCES[i % len(SOURCES)])


async def test_unauthenticated_megabytes_cost_little_memory(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"s" * 32)
    api_port = peers.free_port()
    command = peers.serve_command(tmp_path / "data", "--metrics-port", "0", "--fsync", "never",
                                  "--secret-file", str(secret_file), "--api-port", str(api_port),
                                  "--api-max-clients", str(CONNECTIONS))  # all served: none 503
    async with peers.Daemon(command, tmp_path / "idled.stderr") as daemon:
        process = psutil.Process(daemon.proc.pid)
        await trio.sleep(0.5)  # settled after the start
        before = process.memory_info().rss
        peak = before

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, process.memory_info().rss)
                await trio.sleep(0.005)

        started = time.monotonic()
        answers: dict[bytes, int] = {}
        small: dict[bytes, int] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            await flood(api_port, BIG_HEAD, answers)
            await trio.sleep(1.5)  # the first flood's connections are gone (a linger is 1 s at most)
            await flood(api_port, SMALL_HEAD, small)
            took = time.monotonic() - started
            await trio.sleep(2.0)  # all closed
            nursery.cancel_scope.cancel()
        after = process.memory_info().rss
        print(f"\nAPI flood, {CONNECTIONS} x (~1 MB headers + ~1 MB body), then {CONNECTIONS} x (small head + "
              f"~1 MB body), no token, from {len(SOURCES)} addresses, {took:.1f} s: RSS before {before / MIB:.1f} "
              f"MiB, peak {peak / MIB:.1f} MiB (+{(peak - before) / MIB:.1f}), after {after / MIB:.1f} MiB "
              f"(+{(after - before) / MIB:.1f}); answers {answers}, then {small}")
        assert answers == {b"431": CONNECTIONS} and small == {b"401": CONNECTIONS}
        assert peak - before <= 50 * MIB
        assert after - before <= 10 * MIB
        assert daemon.proc.poll() is None
