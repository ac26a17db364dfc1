"""What a keepalive costs the user loop itself: CPU per ping of the ``uid`` role, core and edge, in process.

Not a test (no `test_` prefix: pytest does not collect it); a benchmark that prints figures:

    PYTHONPATH=. python tests/server/bench_users.py [--pings 200000] [--rounds 5] [--per-read 1]

The role is the one the doorway dispatches to (``roles["uid"]``) of a real in-process ``Server`` (its presence
table, bus and clock; no listener) and of an ``Edge`` whose core link is marked connected but never flushed
(touches land in its pending map, as between two flushes). The user's stream is a stand-in that hands the
loop ``--per-read`` ready ping frames per read and swallows the pongs without a checkpoint, so what is timed
is the loop's own path -- decode, touch, pong -- and not trio's socket machinery (~50 us per packet on this
stack); every ``CHECKPOINT_EVERY`` reads it yields once, so the server's monitor keeps beating (else its stall
guard would see the loop stopped). Each round times ``--pings`` pings per role; the best round is reported, and the
edge/core ratio of the same run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from idled.ops.config import Config
from idled.protocol import PING_FRAME, FrameDecoder, Login, Welcome
from idled.server.edge import Edge
from idled.server.edge.link import CoreParams
from tests.peers import running


CHECKPOINT_EVERY = 1000  # reads between two checkpoints of the stand-in stream


class PingStream(trio.abc.Stream):
    """``pings`` ping frames, ``per_read`` per read, then the end of the stream; writes go nowhere."""

    def __init__(self, pings: int, per_read: int, on_first_read: Any = None) -> None:
        self.left = pings
        self.per_read = per_read
        self.chunk = PING_FRAME * per_read
        self.on_first_read = on_first_read
        self.reads = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.on_first_read is not None:
            self.on_first_read()
            self.on_first_read = None
        if self.left <= 0:
            return b""
        self.reads += 1
        if self.reads % CHECKPOINT_EVERY == 0:
            await trio.lowlevel.checkpoint()
        n = min(self.per_read, self.left)
        self.left -= n
        return self.chunk if n == self.per_read else PING_FRAME * n

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        pass

    async def wait_send_all_might_not_block(self) -> None:
        pass

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def time_role(role: Any, uid: str, pings: int, per_read: int, on_first_read: Any = None) -> float:
    """Seconds of CPU (process time: nothing else runs meanwhile) for one user's ``pings`` pings."""
    stream = PingStream(pings, per_read, on_first_read)
    started = time.process_time()
    await role(stream, FrameDecoder(4096), Login("uid", uid, None, 30.0))
    return time.process_time() - started


async def bench(args: argparse.Namespace, tmp: Path) -> None:
    config = Config(port=0, metrics_port=0, data_dir=str(tmp / "edge")).validate()
    edge = Edge(config, core="127.0.0.1:1", name="bench")
    link = edge.link
    link.params = CoreParams(Welcome("gateway", "bench", 30.0, 1 << 20, 1.0, 3600.0))

    def connect() -> None:  # after the login's attach (filed while "disconnected": no ack to wait for)
        link.up = True

    async with running(tmp, fsync="never", metrics=False) as h:
        door = h.server.running.doorway
        assert door is not None
        core_role = door.roles["uid"]
        edge_role = edge.doorway.roles["uid"]
        best = {"core": float("inf"), "edge": float("inf")}
        for i in range(args.rounds):
            best["core"] = min(best["core"], await time_role(core_role, f"c{i}", args.pings, args.per_read))
            link.up = False
            best["edge"] = min(best["edge"], await time_role(edge_role, f"e{i}", args.pings, args.per_read, connect))
    per = {role: seconds / args.pings * 1e6 for role, seconds in best.items()}
    print(f"idled user loop: {args.pings} pings per round, {args.per_read} per read, best of {args.rounds} rounds")
    for role in ("core", "edge"):
        print(f"  {role}: {per[role]:.3f} us CPU per ping ({args.pings / best[role]:,.0f} pings/s)")
    print(f"  edge/core: {per['edge'] / per['core']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-read", type=int, default=1, help="ping frames handed over per read (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(bench, args, Path(tmp))


if __name__ == "__main__":
    main()
