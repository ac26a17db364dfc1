"""An asyncio app server that reports its own users' presence to idled as a gateway.

The app speaks a toy line protocol to its users: the first line is the user's name, every later line is
activity, and closing the connection is leaving. The app never thinks about frames or keepalives: it calls
`gateway.attach` / `touch` / `detach` once per event, and the client batches them (one frame per flush
interval however many users are active) and re-attaches everyone after idled restarts. When idled ends a
session -- the user was silent past the timeout (`idle`), or logged in again elsewhere (`kicked`) -- the
gateway's `on_ended` callback hears it and the app closes that user's connection, as idled would close a
direct one.

    python examples/asyncio_gateway.py --idled-port 7878 --port 9000
    (then: nc 127.0.0.1 9000, type a name, then anything)
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from idled.client import Gateway
from idled.client.asyncio import open_gateway


USERS: dict[str, asyncio.StreamWriter] = {}  # the connection of each user name currently here


def ended(uids: tuple[object, ...], reason: str) -> None:
    """idled ended these sessions: say why and close them (`shutdown` ones stay: idled comes back)."""
    if reason == "shutdown":
        return
    for uid in uids:
        writer = USERS.pop(str(uid), None)
        if writer is not None:
            writer.write(f"ended {reason}\n".encode())
            writer.close()


async def serve_user(gateway: Gateway, keepalive: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    name = (await reader.readline()).decode().strip()
    if not name:
        writer.close()
        return
    USERS[name] = writer
    await gateway.attach([name], keepalive=keepalive)
    writer.write(b"hello " + name.encode() + b"\n")
    try:
        while line := await reader.readline():
            await gateway.touch([name])
            writer.write(b"ok " + line)
    except ConnectionError:
        pass
    finally:
        if USERS.get(name) is writer:  # still ours: not ended by idled, nor replaced by a newer connection
            del USERS[name]
            await gateway.detach([name])
        writer.close()


async def main(args: argparse.Namespace) -> None:
    async with open_gateway(args.idled_host, args.idled_port, args.name, flush_interval=0.05,
                            on_ended=ended) as gateway:
        server = await asyncio.start_server(lambda r, w: serve_user(gateway, args.keepalive, r, w), "127.0.0.1", args.port)
        port = server.sockets[0].getsockname()[1]
        print(f"LISTENING port={port}", flush=True)
        async with server:
            await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idled-host", default="127.0.0.1")
    parser.add_argument("--idled-port", type=int, default=7878)
    parser.add_argument("--name", default="app-1", help="gateway name")
    parser.add_argument("--port", type=int, default=0, help="port for the app's users (0: any, printed)")
    parser.add_argument("--keepalive", type=float, default=60.0, help="users' keepalive: their timeout is 1.5x")
    try:
        asyncio.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
