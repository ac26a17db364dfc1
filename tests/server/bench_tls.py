"""What TLS costs the server: full and resumed handshakes per server CPU-second, and CPU per keepalive.

Not a test (no `test_` prefix: pytest does not collect it); a benchmark that prints figures:

    PYTHONPATH=. python tests/server/bench_tls.py [--handshakes 2000] [--pings 20000] [--concurrency 50]
                                                  [--key p256|rsa2048]

It spawns `idled serve` (plaintext, then TLS with a P-256 certificate from `openssl`) and measures the
server's own CPU time (psutil, user + system) around each phase, so the client's CPU on the same machine
does not count:

* handshakes: connect, handshake, log in, read the welcome, bye -- ``--handshakes`` times, ``--concurrency``
  at once; "full" with no session, "resumed" offering a TLS 1.3 ticket from an earlier connection. The same
  phase over plaintext gives the floor (a connection + login without TLS).
* keepalives: ``--concurrency`` logged-in connections each sending pings (and reading pongs) one after
  another, ``--pings`` in all; the server CPU per ping, plaintext vs TLS.
"""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import trio

from idled.protocol import BYE, PING, PONG_FRAME, Login, encode

LOGIN_WELCOME_MAX = 4096


def server_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def make_cert(directory: Path, kind: str) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"] if kind == "p256" else ["-newkey", "rsa:2048"]
    subprocess.run(["openssl", "req", "-x509", *newkey, "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=bench",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def spawn(data: Path, *flags: str) -> tuple[subprocess.Popen[bytes], int]:
    log = open(data.with_suffix(".log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "idled.cli.main", "serve", "--port", "0", "--metrics-port", "0",
                             "--data-dir", str(data), "--fsync", "never", "--log-level", "warning", *flags],
                            stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in data.with_suffix(".log").read_text(errors="replace").splitlines():
            if line.startswith("IDLED_LISTENING"):
                return proc, int(line.rsplit("port=", 1)[1])
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not start")


async def open_conn(port: int, ctx: ssl.SSLContext | None, session: ssl.SSLSession | None) -> trio.abc.Stream:
    tcp = await trio.open_tcp_stream("127.0.0.1", port)
    if ctx is None:
        return tcp
    stream = trio.SSLStream(tcp, ctx, server_hostname="127.0.0.1")
    if session is not None:
        stream.session = session
    await stream.do_handshake()
    return stream


async def login(stream: trio.abc.Stream, uid: str) -> None:
    await stream.send_all(encode(Login("uid", uid, None, 60)))
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = await stream.receive_some(LOGIN_WELCOME_MAX)
        if not chunk:
            raise RuntimeError("closed before welcome")
        data += chunk


async def handshakes(port: int, ctx: ssl.SSLContext | None, count: int, concurrency: int,
                     session: ssl.SSLSession | None) -> tuple[int, int]:
    """(connections done, how many were resumed)."""
    done = resumed = 0
    limiter = trio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        nonlocal done, resumed
        async with limiter:
            stream = await open_conn(port, ctx, session)
            await login(stream, f"h{i}")
            if isinstance(stream, trio.SSLStream) and stream.session_reused:
                resumed += 1
            await stream.send_all(encode(BYE))
            await stream.aclose()
            done += 1

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
    return done, resumed


async def keepalives(port: int, ctx: ssl.SSLContext | None, pings: int, concurrency: int) -> None:
    streams = [await open_conn(port, ctx, None) for _ in range(concurrency)]
    for i, stream in enumerate(streams):
        await login(stream, f"k{i}")
    per = pings // concurrency

    async def pinger(stream: trio.abc.Stream) -> None:
        for _ in range(per):
            await stream.send_all(encode(PING))
            got = b""
            while len(got) < len(PONG_FRAME):
                got += await stream.receive_some(64)

    async with trio.open_nursery() as nursery:
        for stream in streams:
            nursery.start_soon(pinger, stream)
    for stream in streams:
        await stream.aclose()


async def ticket(port: int, ctx: ssl.SSLContext) -> ssl.SSLSession:
    stream = await open_conn(port, ctx, None)
    assert isinstance(stream, trio.SSLStream)
    await login(stream, "ticket")  # reading the welcome reads the ticket too
    session = stream.session
    await stream.aclose()
    assert session is not None and session.has_ticket, "no TLS 1.3 ticket from the server"
    return session


def measure(pid: int, fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    cpu0, wall0 = server_cpu(pid), time.monotonic()
    result = trio.run(fn)
    return server_cpu(pid) - cpu0, time.monotonic() - wall0, result  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handshakes", type=int, default=2000)
    parser.add_argument("--pings", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--key", choices=("p256", "rsa2048"), default="p256", help="the server's key (default p256)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        cert, key = make_cert(directory, args.key)
        ctx = ssl.create_default_context(cafile=str(cert))
        ctx.set_alpn_protocols(["idled/1"])
        print(f"idled TLS benchmark: {args.handshakes} connections, {args.pings} pings, concurrency "
              f"{args.concurrency}, {args.key} certificate; server CPU (user+system) of the idled process only; {os.cpu_count()} CPUs")
        results = {}
        for mode in ("plain", "tls"):
            flags = ["--tls-cert", str(cert), "--tls-key", str(key)] if mode == "tls" else []
            proc, port = spawn(directory / f"data-{mode}", *flags)
            try:
                tls = ctx if mode == "tls" else None
                phases = [("connect+login" if mode == "plain" else "full handshake+login", None)]
                if mode == "tls":
                    phases.append(("resumed handshake+login", trio.run(ticket, port, ctx)))
                for name, session in phases:
                    # measure() calls the lambda at once, inside this iteration: the late binding is harmless.
                    cpu, wall, (done, resumed) = measure(
                        proc.pid, lambda: handshakes(port, tls, args.handshakes, args.concurrency, session))  # noqa: B023
                    print(f"  {mode:5} {name:24} {done:6} in {wall:5.2f} s wall, server CPU {cpu:5.2f} s: "
                          f"{done / cpu:7.0f} per server CPU-second, {cpu / done * 1e6:6.0f} us each"
                          + (f" ({resumed} resumed)" if mode == "tls" else ""))
                    results[(mode, name)] = cpu / done
                cpu, wall, _ = measure(proc.pid, lambda: keepalives(port, tls, args.pings, args.concurrency))  # noqa: B023
                pings = (args.pings // args.concurrency) * args.concurrency
                print(f"  {mode:5} {'keepalive (ping+pong)':24} {pings:6} in {wall:5.2f} s wall, server CPU "
                      f"{cpu:5.2f} s: {cpu / pings * 1e6:6.1f} us per ping")
                results[(mode, "ping")] = cpu / pings
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        extra = (results[("tls", "ping")] - results[("plain", "ping")]) * 1e6
        print(f"  TLS adds {extra:.1f} us of server CPU per keepalive "
              f"({results[('tls', 'ping')] / results[('plain', 'ping')]:.2f}x); a resumed handshake costs "
              f"{results[('tls', 'resumed handshake+login')] / results[('tls', 'full handshake+login')]:.2f}x a full one")


if __name__ == "__main__":
    main()
