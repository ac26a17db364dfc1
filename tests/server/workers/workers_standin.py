"""A stand-in for `idled edge`, for the supervisor's own tests (tests/server/workers/test_workers_supervisor.py).

It keeps to the fixed edge interface as far as the supervisor can see it: `--core unix:PATH --name NAME
--listen-fd FD ...`, logs in to the core as gateway NAME without a token, prints `IDLED_LISTENING` once
listening, logs `SIGHUP` on SIGHUP and exits 0 on SIGTERM. Each accepted connection sends one line, a uid;
the stand-in attaches it on its link and answers `ok\\n`; the connection's end detaches it. Not an edge:
the real end-to-end tests (tests/server/workers/test_workers.py) run the real `idled edge`.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys

from pathlib import Path

import trio

# Run as a script by the supervisor: the project root (for `tests.peers`) is not on its path otherwise.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from idled.protocol import Attach, Detach, Login, Welcome  # noqa: E402
from tests.peers import Client  # noqa: E402


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--core", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--listen-fd", type=int, action="append", default=[])
    parser.add_argument("--login-token", default=None)
    args, _ = parser.parse_known_args(argv)
    path = args.core.removeprefix("unix:")
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(path)
    link = Client(trio.SocketStream(sock))
    await link.send(Login("gateway", args.name, args.login_token))
    welcome = await link.recv()
    if not isinstance(welcome, Welcome):
        print(f"refused: {welcome!r}", file=sys.stderr, flush=True)
        return 3
    listeners = [trio.SocketListener(trio.socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)) for fd in args.listen_fd]

    async def serve_one(stream: trio.SocketStream) -> None:
        uid = (await stream.receive_some(100)).decode().strip()
        await link.send(Attach((uid,), None))
        await stream.send_all(b"ok\n")
        try:
            while await stream.receive_some(100):
                pass
        except trio.BrokenResourceError:
            pass
        await link.send(Detach((uid,)))

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, serve_one, listeners)
            print("IDLED_LISTENING host=127.0.0.1 port=0", file=sys.stderr, flush=True)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    print("SIGHUP: reloaded", file=sys.stderr, flush=True)
                else:
                    nursery.cancel_scope.cancel()
                    break
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1:]))
