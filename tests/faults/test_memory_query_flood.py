"""A query flooder that never reads its replies cannot grow the daemon's memory, and once it is cut the
daemon is back at its baseline.

A real `idled serve` subprocess and a raw socket: the flooder logs in as an observer and sends full-size
`query` frames (~4 KB, each answered by a ~5 KB `status`) without ever reading. Before the replies were
bounded in bytes the daemon queued 65,536 of them (RSS +350 MiB, and +43 MiB still held after the peer was
gone); now it queues at most `REPLY_BYTES`, stops reading the flooder (back-pressure), and cuts it once it has
taken nothing for `OBSERVER_STALL` seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from idled.protocol import Login, Query, encode
from idled.server.roles.observers import OBSERVER_STALL

from tests import peers

pytestmark = pytest.mark.slow  # a real `idled serve` subprocess, real time

GROWTH_LIMIT_MIB = 16.0  # what the daemon may hold above its baseline meanwhile and after (measured: < 1)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_query_flooder_that_never_reads(tmp_path: Path) -> None:
    daemon = peers.Daemon(
        peers.serve_command(tmp_path / "data", "--fsync", "never", "--metrics-port", "0"), tmp_path / "stderr.log"
    )
    try:
        port = await daemon.started()
        await trio.sleep(1.0)  # imports and start-up allocations settle
        baseline = rss_mib(daemon.proc.pid)
        flood = await trio.open_tcp_stream("127.0.0.1", port)
        await flood.send_all(encode(Login("observer", "flood")))
        query = encode(Query(tuple(10**9 + i for i in range(800))))
        sent, peak, cut = 0, baseline, False
        with trio.move_on_after(OBSERVER_STALL + 30):
            while not cut:
                with trio.move_on_after(1.0) as blocked:
                    try:
                        await flood.send_all(query)
                    except trio.BrokenResourceError:
                        cut = True  # the daemon closed it (unread queries make that a reset)
                if blocked.cancelled_caught:
                    peak = max(peak, rss_mib(daemon.proc.pid))
                    await trio.sleep(0.5)  # still blocked: the daemon stopped reading; it cuts us in time
                    cut = "observer flood took nothing" in daemon.stderr()
                else:
                    sent += 1
                    if sent % 100 == 0:
                        peak = max(peak, rss_mib(daemon.proc.pid))
        assert cut, f"the daemon kept reading ({sent} queries sent)"
        await flood.aclose()
        await trio.sleep(1.0)
        after = rss_mib(daemon.proc.pid)
        print(f"RSS MiB: baseline {baseline:.1f}, peak {peak:.1f} during {sent} unread queries, after {after:.1f}")
        assert peak - baseline < GROWTH_LIMIT_MIB
        assert after - baseline < GROWTH_LIMIT_MIB
        assert sent < 65_536 // 8  # back-pressured long before what the old item-count queue took
        assert "Traceback" not in daemon.stderr()
    finally:
        daemon.kill()
