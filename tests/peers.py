"""Test-side peers of idled: a framed-msgpack client, a running in-process server, an `idled serve` subprocess.

Shared by the tests that talk to a server: `running()` starts a `Server` in the test's own trio loop (its
connections over memory streams handed to `Server.handle`, or over a real loopback listener) and yields a
`Harness`; `Daemon` is a real `idled serve` subprocess. Imported as a plain module,
`from tests.peers import Client, Daemon, running`: tests/ and each of its subdirectories are packages (they
have an ``__init__.py``), so pytest's default ("prepend") import mode puts the first directory above them
without one -- the project root -- on sys.path, and every test module imports as ``tests.<dir>.<name>``.

Only what the files really share lives here; a file's own variant (its command line, its /metrics scrape, its
receive timeout) stays in that file and reaches these helpers as a parameter.
"""

from __future__ import annotations

import itertools
import math
import random
import signal
import socket
import subprocess
import struct
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Self

import msgpack
import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from idled.log.eventlog import iter_records
from idled.ops.config import Config
from idled.ops.metrics import Metrics
from idled.protocol import (
    BYE,
    Error,
    Event,
    FrameDecoder,
    Login,
    ProtocolError,
    Query,
    Status,
    Subscribe,
    Welcome,
    encode,
    parse_server_message,
    receive_message,
)
from idled.server.app import Server

MAX_FRAME = 1 << 24  # the client accepts any frame the server may send
NO_TIMEOUT = math.inf  # a `recv_timeout`: wait for as long as it takes
RECEIVE_BYTES = 65536  # one read of a client


def raw_frame(body: bytes) -> bytes:
    """`body` behind a length prefix, whatever it holds."""
    return struct.pack(">I", len(body)) + body


def frame(obj: Any) -> bytes:
    """Any msgpack-able object as a frame, valid message or not (encode() only takes the protocol's types)."""
    return raw_frame(msgpack.packb(obj))


class Client:
    """One client connection over any trio stream (TCP or trio.testing memory streams): typed frames out,
    typed frames in (server messages, leniently parsed).

    `recv_timeout` is the default limit of one `recv` (math.inf: none); `reset_is_eof` makes a connection
    reset read as the end of the stream, for tests that expect the server to drop them abruptly.
    """

    def __init__(self, stream: trio.abc.Stream, recv_timeout: float = 10.0, reset_is_eof: bool = False) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(MAX_FRAME, parse=parse_server_message)
        self.recv_timeout = recv_timeout
        self.reset_is_eof = reset_is_eof
        self._eof = False

    @classmethod
    async def connect(cls, port: int, recv_timeout: float = 10.0, reset_is_eof: bool = False,
                      host: str = "127.0.0.1") -> Self:
        """A TCP connection to a loopback port."""
        return cls(await trio.open_tcp_stream(host, port), recv_timeout, reset_is_eof)

    @classmethod
    async def login(cls, port: int, role: str, name: Any, keepalive: float | None = None, token: str | None = None,
                    recv_timeout: float = 10.0, reset_is_eof: bool = False, host: str = "127.0.0.1") -> Self:
        """Connect and log in as `role` `name`; the server must answer with a welcome."""
        client = await cls.connect(port, recv_timeout, reset_is_eof, host)
        await client.send(Login(role, name, token, keepalive))  # type: ignore[arg-type]
        welcome = await client.recv()
        assert isinstance(welcome, Welcome), welcome
        return client

    async def send(self, message: Any) -> None:
        await self.stream.send_all(encode(message))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv(self, timeout: float | None = None) -> Any:
        """The next message, or None once the server closed the connection (also in the middle of a frame:
        a server killed mid-write)."""
        with trio.fail_after(self.recv_timeout if timeout is None else timeout):
            try:
                return await receive_message(self, self.decoder, RECEIVE_BYTES)
            except ProtocolError:
                if self._eof:
                    return None
                raise

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The byte source `receive_message` reads from: the stream, with a reset read as the end if asked."""
        try:
            data = await self.stream.receive_some(max_bytes)
        except trio.BrokenResourceError:
            if not self.reset_is_eof:
                raise
            data = b""
        self._eof = not data
        return data

    async def expect(self, kind: type) -> Any:
        message = await self.recv()
        assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}"
        return message

    async def expect_error(self, code: str) -> Error:
        """An error frame with `code`, then the connection closes."""
        message = await self.recv()
        assert isinstance(message, Error) and message.code == code, f"expected error {code}, got {message!r}"
        assert await self.recv() is None, "connection not closed after the error frame"
        return message

    async def drain(self) -> list[Event]:
        """Every event queued for this observer so far (a query's reply comes after them)."""
        events, _ = await self.events_until_status()
        return events

    async def status_of(self, uids: Sequence[Any], *, last_seen: bool = False) -> Status:
        """An observer's query answer, skipping the events queued before it."""
        return (await self.events_until_status(uids, last_seen=last_seen))[1]

    async def events_until_status(self, uids: Sequence[Any] = (), *,
                                  last_seen: bool = False) -> tuple[list[Event], Status]:
        """Flush an observer: query, then collect every event queued before the reply."""
        await self.send(Query(tuple(uids), last_seen=last_seen))
        events = []
        while True:
            message = await self.recv()
            if isinstance(message, Status):
                return events, message
            assert isinstance(message, Event), message
            events.append(message)


DEFAULTS: dict[str, Any] = dict(port=0, metrics_port=0, tick=0.1, fsync="never")  # settings running() starts from
STOP_TIMEOUT = 60.0  # seconds (virtual on an autojump clock) a stopped server gets to return from serve()


class Harness:
    """A `Server` running in the test's trio loop (see `running`), and its test-side helpers.

    Connections made with `connect` are memory streams whose server end is handed to `Server.handle` -- the
    very handler the accept loop runs -- in the test's nursery; with `running(listen=True)` the server also
    listens on `port` (loopback, port 0). `settle`: `connect` waits until every task is blocked, so the
    handler has run up to its first read (what timing tests on an autojump clock need; not for tests with
    traffic running concurrently, where not every task is ever blocked at once).
    """

    def __init__(self, server: Server, nursery: trio.Nursery, data_dir: Path, *, recv_timeout: float, settle: bool) -> None:
        self.server = server
        self.nursery = nursery
        self.data_dir = data_dir
        self.recv_timeout = recv_timeout
        self.settle = settle
        self.port = server.ports[0] if server.ports else 0
        self._users = itertools.count(1)

    @property
    def done(self) -> trio.Event:
        """Set once `serve()` has returned."""
        return self.server.stopped

    @property
    def next_seq(self) -> int:
        assert self.server.running.presence is not None
        return self.server.running.presence.next_seq

    async def connect(self, lockstep: bool = False) -> Client:
        """A new connection; `lockstep`: the server's writes block until this end reads (a slow reader)."""
        pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
        client, server_end = pair()
        self.nursery.start_soon(self.server.handle, server_end)
        if self.settle:
            await trio.testing.wait_all_tasks_blocked()  # the handler has run up to its first read
        return Client(client, recv_timeout=self.recv_timeout)

    async def user(self, uid: Any, keepalive: float | None = None, token: str | None = None) -> Client:
        peer = await self.connect()
        await peer.send(Login("uid", uid, token, keepalive))
        welcome = await peer.expect(Welcome)
        assert welcome.role == "uid" and welcome.name == uid
        return peer

    async def observer(self, name: str = "obs", from_seq: int | None = None, lockstep: bool = False) -> Client:
        peer = await self.connect(lockstep)
        await peer.send(Login("observer", name))
        await peer.expect(Welcome)
        await peer.send(Subscribe(from_seq))
        return peer

    async def gateway(self, name: str = "gw") -> Client:
        peer = await self.connect()
        await peer.send(Login("gateway", name))
        welcome = await peer.expect(Welcome)
        assert welcome.role == "gateway" and welcome.max_frame == self.server.config.max_gateway_frame
        return peer

    async def traffic(self, pairs: int) -> None:
        """`pairs` users log in and say bye: 2 * pairs events."""
        for _ in range(pairs):
            peer = await self.user(f"user-{next(self._users)}")
            await peer.send(BYE)
            assert await peer.recv() is None

    def records(self) -> list[dict[str, Any]]:
        return list(iter_records(self.data_dir))

    def metric(self, name: str, **labels: str) -> float:
        registry = self.server.metrics.registry
        assert registry is not None, "started with running(metrics=False)"
        value = registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


@asynccontextmanager
async def running(tmp_path: Path, *, listen: bool = False, metrics: bool = True, env: dict[str, str] | None = None,
                  recv_timeout: float = 60.0, settle: bool = True, **settings: Any) -> AsyncIterator[Harness]:
    """A `Server` on `tmp_path / "data"`, serving in this trio loop until the block ends (then stopped cleanly).

    `settings` override `DEFAULTS` (Config fields). `listen`: also accept on a loopback port (`Harness.port`);
    otherwise it listens on nothing and connections come from `Harness.connect`. `metrics`: a fresh registry
    (`Harness.metric`), or none (the server's NullMetrics). `recv_timeout`: the default limit of one receive
    of the harness's clients. `settle`: see `Harness`.
    """
    data_dir = tmp_path / "data"
    cfg = Config(**{**DEFAULTS, "data_dir": str(data_dir), **settings}).validate()
    registry = Metrics(CollectorRegistry(), tick=cfg.tick, process_collectors=False) if metrics else None
    server = Server(cfg, metrics=registry, env=env or {})
    async with trio.open_nursery() as nursery:
        ports = await nursery.start(server.serve, None if listen else [])
        assert bool(ports) == listen, ports
        try:
            yield Harness(server, nursery, data_dir, recv_timeout=recv_timeout, settle=settle)
        finally:
            server.stop()
            # Connections from connect() live in this nursery, not the server's: wait for the shutdown,
            # then end whatever is left of them.
            with trio.move_on_after(STOP_TIMEOUT):
                await server.stopped.wait()
            nursery.cancel_scope.cancel()


async def start_metrics(nursery: trio.Nursery, registry: CollectorRegistry, *, gate: Any = None, **options: Any) -> int:
    """``serve_metrics`` on a loopback port opened through the door (``idled.door``), with the metrics endpoint's
    gate (or ``gate``); the port."""
    from idled.door.door import Door, Endpoint, metrics_gate
    from idled.ops.http import serve_metrics

    door = Door([Endpoint("metrics", "127.0.0.1", 0)], secret=False, insecure=False, env={})
    listeners = await door.open("metrics")
    return int(await nursery.start(partial(serve_metrics, **options), registry, listeners, gate or metrics_gate()))


def free_port() -> int:
    """A loopback port nobody listens on right now (for listeners that cannot take port 0, e.g. /metrics)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stable_port() -> int:
    """A loopback port nobody listens on, below the ephemeral range: for a listener closed and opened again
    during a test (while it is closed, no outgoing connection can be given it as its own port)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(10_000, low), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 10000..{low - 1}")


def scrape(metrics_port: int, name: str) -> float:
    """One sample ``name`` (no labels) from a daemon's /metrics; fails if it is not exported."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not exported")


def core_pid(root: int) -> int | None:
    """Under `idled serve --workers N`: the pid of the core, the root's child started with --core-of-workers
    (None while there is none: being restarted)."""
    import psutil

    for child in psutil.Process(root).children():
        try:
            if "--core-of-workers" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                return int(child.pid)
        except psutil.NoSuchProcess:
            continue
    return None


def serve_command(data_dir: Path, *options: str) -> list[str]:
    """`python -m idled.cli.main serve` on a port-0 listener; `options` come last, so they win over the defaults."""
    return [sys.executable, "-m", "idled.cli.main", "serve", "--port", "0", "--data-dir", str(data_dir), *options]


class Daemon:
    """An `idled serve` subprocess; its stderr goes to `stderr_path`, polled for the IDLED_LISTENING line.

    `timeout` is the default limit of waiting for it to start listening, or to exit. `async with Daemon(...)
    as daemon:` waits until it listens (`daemon.port`) and kills it when the block ends, however it ends.
    """

    def __init__(self, command: list[str], stderr_path: Path, env: dict[str, str] | None = None,
                 pass_fds: tuple[int, ...] = (), timeout: float = 20.0) -> None:
        self.stderr_path = stderr_path
        self.timeout = timeout
        with open(stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                         env=env, pass_fds=pass_fds)
        self.port = 0

    async def started(self, timeout: float | None = None) -> int:
        """The port from `IDLED_LISTENING host=... port=N`, once the daemon has printed it."""
        with trio.fail_after(self.timeout if timeout is None else timeout):
            while True:
                for line in self.stderr().splitlines():
                    if line.startswith("IDLED_LISTENING"):
                        self.port = int(line.rsplit("port=", 1)[1])
                        return self.port
                assert self.proc.poll() is None, f"idled exited early:\n{self.stderr()}"
                await trio.sleep(0.02)

    async def __aenter__(self) -> Self:
        try:
            await self.started()
        except BaseException:
            self.kill()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.kill()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def wait(self, timeout: float | None = None) -> int:
        """Its exit status."""
        return await trio.to_thread.run_sync(self.proc.wait, self.timeout if timeout is None else timeout)

    async def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int:
        """Send `sig`, then its exit status."""
        self.proc.send_signal(sig)
        return await self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL if still running, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextmanager
def small_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's spelling: "256k", "1m") at ``tmp_path / "disk"``, for disk-full tests;
    the test is skipped where mounting is not allowed (no root)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
