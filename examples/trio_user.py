"""A trio user client: logs in, sends a message now and then, and stays online by itself.

The session pings at the right interval (from the timeout in `welcome`), reconnects with full-jitter backoff
after a server restart, and says `bye` when the block ends, so the user goes offline with reason `logout`
instead of waiting for the timeout.

    python examples/trio_user.py --idled-port 7878 --uid alice --keepalive 30 --duration 120
"""

from __future__ import annotations

import argparse

import trio

from idled.client import ClientError
from idled.client.trio import open_session


async def main(args: argparse.Namespace) -> int:
    try:
        async with open_session(args.idled_host, args.idled_port, args.uid, token=args.token,
                                keepalive=args.keepalive) as session:
            print(f"ONLINE uid={session.uid} timeout={session.timeout}", flush=True)
            with trio.move_on_after(args.duration):
                n = 0
                while True:
                    await trio.sleep(args.every)
                    n += 1
                    await session.send({"n": n})
            print(f"BYE pings={session.pings} pongs={session.pongs} connections={session.connections}", flush=True)
    except ClientError as exc:
        print(f"ERROR {exc.code}: {exc.reason}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idled-host", default="127.0.0.1")
    parser.add_argument("--idled-port", type=int, default=7878)
    parser.add_argument("--uid", default="alice")
    parser.add_argument("--token", default=None, help="login token (when the server has a secret)")
    parser.add_argument("--keepalive", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between application messages")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to stay logged in")
    raise SystemExit(trio.run(main, parser.parse_args()))
